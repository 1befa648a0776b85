// architecture: the import graph by dependency-cruiser with the service's own rules (never the
// workspace's .dependency-cruiser.js, which is code): cycles, orphans, relative imports that resolve
// to nothing, packages imported but not declared in the nearest package.json, and layering rules when
// the request or the workspace's `audit-layers.json` (data) declares them; then the largest files and
// functions, measured on TypeScript's parse of each source file.
import fs from 'node:fs/promises';
import { builtinModules } from 'node:module';
import path from 'node:path';
import { cruise, type ICruiseResult } from 'dependency-cruiser';
import ts from 'typescript';
import { tempPrefix, type AuditLayer } from '../../platform/index.js';
import { LAYERS_FILE, layerPattern, parseLayers } from './layers.js';
import { masked } from './mask.js';
import { Findings, readRegular, readText, type PhaseOutput, type Workspace } from './workspace.js';

const SOURCE = /\.(c|m)?(j|t)sx?$/;
const DECLARATIONS = /\.d\.(c|m)?ts$/;
/** files nothing imports by design: entry points, configs, tests, declarations, scripts */
const ORPHAN_EXEMPT = [
  DECLARATIONS.source,
  '(^|/)\\.[^/]+$',
  '(^|/)[^/]*\\.config\\.[^/]+$',
  '(^|/)(test|tests|__tests__|spec|bench|scripts?|bin|examples?|e2e)/',
  '\\.(test|spec)\\.[^/]+$',
  '(^|/)(main|index|cli|server|app)\\.[cm]?[jt]sx?$',
];
const LARGE_FILE_LINES = 1000;
const LONG_FUNCTION_LINES = 150;
/** a source larger than this is left out of the import graph and of the measures (a file's own bytes) */
export const MAX_SOURCE_BYTES = 2 * 1024 * 1024;
const CORE = new Set(builtinModules);

/** The package a bare specifier names (`@scope/name/sub` is `@scope/name`), or null when it is not bare. */
function packageOf(specifier: string): string | null {
  if (/^(\.|\/|#|[a-z]+:)/i.test(specifier)) return null;
  const parts = specifier.split('/');
  return specifier.startsWith('@') ? parts.slice(0, 2).join('/') : parts[0]!;
}

/** Declared package names by the folder of each package.json. */
async function manifestsOf(ws: Workspace): Promise<Map<string, Set<string>>> {
  const out = new Map<string, Set<string>>();
  for (const rel of ws.files.filter((f) => f === 'package.json' || f.endsWith('/package.json'))) {
    try {
      const m = JSON.parse((await readText(ws.root, rel, MAX_SOURCE_BYTES)) ?? '') as Record<string, unknown>;
      const names = new Set<string>(typeof m.name === 'string' ? [m.name] : []);
      for (const field of ['dependencies', 'devDependencies', 'peerDependencies', 'optionalDependencies'])
        for (const name of Object.keys((m[field] as Record<string, string> | undefined) ?? {})) names.add(name);
      out.set(path.dirname(rel), names);
    } catch {
      // a manifest that does not parse declares nothing here; sanity reports it
    }
  }
  return out;
}

/** The `paths` aliases of the root tsconfig.json, as prefixes (`@/*` is `@/`): such imports are the project's own. */
async function aliasesOf(ws: Workspace): Promise<string[]> {
  const text = await readText(ws.root, 'tsconfig.json', MAX_SOURCE_BYTES);
  if (!text) return [];
  const parsed = ts.parseConfigFileTextToJson('tsconfig.json', text).config as { compilerOptions?: { paths?: Record<string, unknown> } } | undefined;
  return Object.keys(parsed?.compilerOptions?.paths ?? {}).map((p) => p.replace(/\*.*$/, ''));
}

function functionSizes(file: string, text: string): { name: string; line: number; lines: number }[] {
  const source = ts.createSourceFile(file, text, ts.ScriptTarget.Latest, true);
  const out: { name: string; line: number; lines: number }[] = [];
  const visit = (node: ts.Node) => {
    if (ts.isFunctionLike(node) && 'body' in node && node.body) {
      const start = source.getLineAndCharacterOfPosition(node.getStart(source)).line;
      const end = source.getLineAndCharacterOfPosition(node.getEnd()).line;
      const named = (node as { name?: ts.Node }).name;
      const parent = node.parent;
      const name = named
        ? named.getText(source)
        : ts.isVariableDeclaration(parent) || ts.isPropertyAssignment(parent)
          ? parent.name.getText(source)
          : '(anonymous)';
      out.push({ name, line: start + 1, lines: end - start + 1 });
    }
    ts.forEachChild(node, visit);
  };
  visit(source);
  return out;
}

/** What the import graph is made of: a private copy of the workspace's files, made once. */
type Snapshot = {
  dir: string;
  maxBytes: number;
  /** the sources copied whole (their bytes are the snapshot's) */
  sources: string[];
  /** sources over the size bound: an empty file of that name (imports of it resolve) left out of the cruise */
  tooLarge: string[];
  /** listed sources that were no regular file inside the root any more (gone, a FIFO, a link out): left out */
  gone: string[];
};

const escape = (s: string) => s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');

/**
 * The files dependency-cruiser reads, copied into a private temp folder: it and TypeScript read by path with
 * blocking calls, and the tenant's steps have the workspace read-write while the audit runs, so a source
 * swapped for a FIFO after the listing held the phase until its timeout, and one removed (and made again)
 * failed the whole phase ("ENOENT ... stat"). Here each is read once, without waiting and checked to be a
 * regular file inside, at most `maxBytes`: what is no longer a regular file is left out, what is larger is an
 * empty file of that name (an import of it still resolves; it is not read). Other listed files (JSON, styles,
 * assets) are empty files of their names, for imports of them to resolve; package.json files are copied
 * (their dependencies, `exports` and `imports`), whole up to the same bound. Nothing outside the listed files
 * is there (node_modules, ignored files): an import of one does not resolve, and is not read either.
 */
async function snapshot(ws: Workspace, maxBytes: number): Promise<Snapshot> {
  const dir = await fs.mkdtemp(tempPrefix('audit-architecture'));
  const out: Snapshot = { dir, maxBytes, sources: [], tooLarge: [], gone: [] };
  try {
    // each folder made once, and waited for by every file in it
    const made = new Map<string, Promise<unknown>>();
    const folder = (rel: string) => {
      const d = path.dirname(rel);
      if (d === '.') return Promise.resolve();
      let p = made.get(d);
      if (!p) made.set(d, (p = fs.mkdir(path.join(dir, d), { recursive: true })));
      return p;
    };
    const BATCH = 64;
    for (let i = 0; i < ws.files.length; i += BATCH)
      await Promise.all(
        ws.files.slice(i, i + BATCH).map(async (rel) => {
          const source = SOURCE.test(rel);
          const manifest = path.basename(rel) === 'package.json';
          const read = source || manifest ? await readRegular(ws.root, rel, maxBytes) : Buffer.alloc(0);
          if (read === null) {
            if (source) out.gone.push(rel);
            return;
          }
          try {
            await folder(rel);
            await fs.writeFile(path.join(dir, rel), read === 'too-large' ? (manifest ? '{}' : '') : read, { flag: 'wx' });
          } catch (err) {
            // no room in the phase's /tmp is said as such; a name that cannot be made (a path listed both as a
            // file and as a folder, in a tree changed while it was listed) is left out
            const code = (err as NodeJS.ErrnoException).code;
            if (code === 'ENOSPC' || code === 'EFBIG' || code === 'EDQUOT')
              throw new Error(`the workspace's sources do not fit in the phase's /tmp (SERVICE_SANDBOX_FILE_SIZE_MB): ${code}`);
            if (source) out.gone.push(rel);
            return;
          }
          if (source) (read === 'too-large' ? out.tooLarge : out.sources).push(rel);
        }),
      );
    out.sources.sort();
    out.tooLarge.sort();
    out.gone.sort();
    return out;
  } catch (err) {
    await fs.rm(dir, { recursive: true, force: true });
    throw err;
  }
}

/**
 * Whether a relative import that resolved to nothing in the snapshot names a file of the workspace itself
 * (one git ignores, a generated source): it exists, so it is not reported as missing. Checked by lstat only.
 */
async function existsInWorkspace(root: string, from: string, specifier: string): Promise<boolean> {
  if (!specifier.startsWith('.')) return false;
  const base = path.posix.normalize(path.posix.join(path.posix.dirname(from), specifier.replace(/[?#].*$/, '')));
  if (base === '..' || base.startsWith('../') || path.isAbsolute(base)) return false;
  const exts = ['.ts', '.tsx', '.d.ts', '.mts', '.cts', '.js', '.jsx', '.mjs', '.cjs', '.json'];
  const candidates = [base, ...exts.map((e) => base + e), ...exts.map((e) => `${base}/index${e}`), `${base}/package.json`];
  // an ESM import of `./x.js` names `./x.ts`
  const m = /^(.*)\.(c|m)?jsx?$/.exec(base);
  if (m) candidates.push(...['.ts', '.tsx', '.mts', '.cts', '.d.ts'].map((e) => m[1] + e));
  for (const c of candidates) if ((await fs.lstat(path.join(root, c)).catch(() => null))?.isFile()) return true;
  return false;
}

/** `maxSourceBytes`: the size bound of a source (MAX_SOURCE_BYTES; a test makes it small) */
export async function architecturePhase(
  ws: Workspace,
  findings: Findings,
  requested: AuditLayer[] | null,
  opts: { maxSourceBytes?: number } = {},
): Promise<PhaseOutput['metrics']> {
  const maxSourceBytes = opts.maxSourceBytes ?? MAX_SOURCE_BYTES;
  let layers = requested;
  let layersFrom: string | null = requested ? 'request' : null;
  if (!layers) {
    const text = await readText(ws.root, LAYERS_FILE, MAX_SOURCE_BYTES);
    if (text !== null) {
      try {
        layers = parseLayers(JSON.parse(text));
        layersFrom = LAYERS_FILE;
      } catch (err) {
        findings.add('invalid-layers-file', 'medium', LAYERS_FILE, null, `${LAYERS_FILE} is not a valid layer list: ${await masked((err as Error).message)}`);
      }
    }
  }

  // the graph and the measures are made of a private copy of the sources, read once each (see snapshot)
  const snap = await snapshot(ws, maxSourceBytes);
  try {
    return await measured(ws, snap, findings, layers, layersFrom);
  } finally {
    await fs.rm(snap.dir, { recursive: true, force: true });
  }
}

async function measured(
  ws: Workspace,
  snap: Snapshot,
  findings: Findings,
  layers: AuditLayer[] | null,
  layersFrom: string | null,
): Promise<PhaseOutput['metrics']> {
  const sources = snap.sources;
  for (const rel of snap.tooLarge)
    findings.add('source-not-read', 'info', rel, null, `${rel} is larger than ${snap.maxBytes} bytes: its imports are not in the graph, nor its size measured`);
  let graph: ICruiseResult | null = null;
  if (sources.length) {
    const exclude = ['(^|/)node_modules/'];
    // an oversized source is there (empty) for imports of it to resolve, and is left out of the graph
    if (snap.tooLarge.length) exclude.push(`^(${snap.tooLarge.map(escape).join('|')})$`);
    const out = await cruise(sources, {
      validate: true,
      ruleSet: {
        forbidden: [
          { name: 'no-circular', severity: 'warn', from: {}, to: { circular: true } },
          { name: 'no-orphans', severity: 'info', from: { orphan: true, pathNot: ORPHAN_EXEMPT }, to: {} },
          { name: 'unresolvable-import', severity: 'error', from: {}, to: { couldNotResolve: true, path: '^\\.' } },
        ],
      },
      tsPreCompilationDeps: true,
      doNotFollow: { path: '(^|/)node_modules/' },
      exclude: { path: exclude },
      baseDir: snap.dir,
      enhancedResolveOptions: { exportsFields: ['exports'], conditionNames: ['import', 'require', 'node', 'default', 'types'] },
    } as never);
    graph = out.output as ICruiseResult;
    const cycles = new Set<string>();
    for (const v of graph.summary.violations) {
      if (v.rule.name === 'no-circular') {
        const cycle = (v.cycle ?? []).map((c) => (typeof c === 'string' ? c : c.name));
        // one finding per cycle, whichever module it is reported from
        const key = [...cycle].sort().join('\0');
        if (cycles.has(key)) continue;
        cycles.add(key);
        findings.add('import-cycle', 'medium', v.from, null, `import cycle: ${[v.from, ...cycle].join(' -> ')}`);
      } else if (v.rule.name === 'no-orphans') findings.add('orphan-module', 'low', v.from, null, `${v.from} is imported by nothing and imports nothing`);
      else if (v.rule.name === 'unresolvable-import') {
        // an import of a file the snapshot does not hold (one git ignores) is not one of nothing
        if (await existsInWorkspace(ws.root, v.from, v.to)) continue;
        findings.add('unresolvable-import', 'high', v.from, null, `${v.from} imports ${v.to}, which does not exist`);
      }
    }
  }

  // packages imported and not declared in the nearest package.json (types-only packages count for their package)
  const manifests = await manifestsOf(ws);
  const aliases = await aliasesOf(ws);
  const declaredFor = (file: string): Set<string> | null => {
    for (let d = path.dirname(file); ; d = path.dirname(d)) {
      const m = manifests.get(d);
      if (m) return m;
      if (d === '.' || d === '/' || d === path.dirname(d)) return null;
    }
  };
  let undeclared = 0;
  const layerRes = (layers ?? []).map((l) => ({ ...l, re: layerPattern(l.path) }));
  const layerOf = (file: string) => layerRes.find((l) => l.re.test(file));
  let layerViolations = 0;
  for (const m of graph?.modules ?? []) {
    if (m.source.includes('node_modules/') || m.coreModule || m.couldNotResolve) continue;
    const declared = declaredFor(m.source);
    const seen = new Set<string>();
    const from = layerOf(m.source);
    for (const d of m.dependencies) {
      if (from && !d.couldNotResolve && !d.coreModule) {
        const to = layerOf(d.resolved);
        if (to && to.name !== from.name && !from.may_import.includes(to.name)) {
          layerViolations++;
          findings.add(
            'layer-violation',
            'high',
            m.source,
            null,
            `${m.source} (${from.name}) imports ${d.resolved} (${to.name}); ${from.name} may import ${from.may_import.join(', ') || 'no other layer'}`,
          );
        }
      }
      const pkg = packageOf(d.module);
      if (!pkg || !declared || d.coreModule || CORE.has(pkg) || seen.has(pkg)) continue;
      if (d.dependencyTypes.some((t) => t === 'local' || t.startsWith('aliased')) || aliases.some((a) => a && d.module.startsWith(a))) continue;
      const typesOf = pkg.startsWith('@') ? `@types/${pkg.slice(1).replace('/', '__')}` : `@types/${pkg}`;
      if (declared.has(pkg) || declared.has(typesOf)) continue;
      seen.add(pkg);
      undeclared++;
      findings.add('undeclared-package', 'high', m.source, null, `${m.source} imports ${pkg}, which its package.json does not declare`);
    }
  }

  // sizes: the largest files, and the longest functions
  const sizes: { file: string; lines: number }[] = [];
  const functions: { file: string; name: string; line: number; lines: number }[] = [];
  for (const rel of sources) {
    // the snapshot's bytes (private, and within the bound): what was cruised is what is measured
    const bytes = await fs.readFile(path.join(snap.dir, rel));
    if (bytes.subarray(0, 8192).includes(0)) continue;
    const text = bytes.toString('utf8');
    const lines = text.split('\n').length;
    sizes.push({ file: rel, lines });
    if (lines > LARGE_FILE_LINES) findings.add('large-file', 'low', rel, null, `${rel} has ${lines} lines`);
    if (DECLARATIONS.test(rel)) continue;
    for (const f of functionSizes(rel, text)) {
      functions.push({ file: rel, ...f });
      if (f.lines > LONG_FUNCTION_LINES) findings.add('long-function', 'low', rel, f.line, `${f.name} has ${f.lines} lines`);
    }
  }
  sizes.sort((a, b) => b.lines - a.lines);
  functions.sort((a, b) => b.lines - a.lines);
  return {
    modules: graph?.summary.totalCruised ?? 0,
    dependencies: graph?.summary.totalDependenciesCruised ?? 0,
    source_files: ws.files.filter((f) => SOURCE.test(f)).length,
    // listed sources left out: larger than the bound, or no longer a regular file when they were read
    sources_not_read: { too_large: snap.tooLarge.length, gone: snap.gone.length },
    undeclared_packages: undeclared,
    layers: layers ? { from: layersFrom, count: layers.length, violations: layerViolations } : null,
    largest_files: sizes.slice(0, 10),
    longest_functions: functions.slice(0, 10),
  };
}
