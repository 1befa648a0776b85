// A workspace's gate set: `gates.yaml` (or `.gates.yaml`) at its root, checked against
// config/gates.schema.json with every error named; without one, a set detected from the workspace
// (package.json scripts typecheck, lint, test and build, and a secret scan). The service's gate runs
// and the CLI's `gates run` read it here, so both run the same set.
import fs, { type FileHandle } from 'node:fs/promises';
import Ajv2020Module from 'ajv/dist/2020.js';
import YAML from 'yaml';
import { GATES_SCHEMA_FILE } from '../../config/paths.js';
import { canonicalJson, sha256Hex } from '../evidence/index.js';
import { GateSetInvalidError, openInside, type FieldError } from '../platform/index.js';
import { staysInside } from './paths.js';

export type ReportFormat = 'tap' | 'junit' | 'eslint' | 'tsc';

export type GateDefinition = {
  id: string;
  name: string;
  required: boolean;
  /** argv; for `shell: true`, ['/bin/sh', '-c', text] */
  run: string[] | null;
  builtin: 'secret-scan' | null;
  timeout_seconds: number;
  env: string[];
  pass: 'exit_code' | 'report';
  report: { format: ReportFormat; path?: string } | null;
  /** globs; null: the git tree (every file outside a repository) */
  inputs: string[] | null;
  artifacts: string[];
};

export type GateSet = {
  /** `gates.yaml`, `.gates.yaml`, or `detected` */
  source: string;
  gates: (GateDefinition & { digest: string })[];
};

export const GATE_FILES = ['gates.yaml', '.gates.yaml'] as const;
/**
 * The name of a gate run's seal job, whose id is the gate run's id and this, as each gate's job id is the gate run's
 * and the gate's id (engine/platform/queues.ts jobTree): a gate of this id is refused, as its job would be the seal's.
 */
export const SEAL_JOB = 'seal';
const DETECTED_SCRIPTS = ['typecheck', 'lint', 'test', 'build'] as const;
const DEFAULT_TIMEOUT_SECONDS = 600;
/** The largest package.json read for its scripts (a gate file may be 256 KB). */
const PACKAGE_JSON_MAX_BYTES = 1024 * 1024;

/** The errors a refusal's detail names (the answer lists as many in `errors`, and counts the rest). */
const ERRORS_IN_DETAIL = 50;

const invalid = (file: string, errors: FieldError[]) => {
  const named = errors.slice(0, ERRORS_IN_DETAIL).map((e) => `${e.path || '/'} ${e.message}`);
  const more = errors.length > ERRORS_IN_DETAIL ? `; and ${errors.length - ERRORS_IN_DETAIL} more` : '';
  return new GateSetInvalidError(`${file} is not a valid gate set: ${named.join('; ')}${more}`, errors);
};

// a CommonJS module whose types describe an ES default export
const Ajv2020 = Ajv2020Module as unknown as typeof Ajv2020Module.default;
let validator: ReturnType<InstanceType<typeof Ajv2020>['compile']> | undefined;
async function validate(doc: unknown): Promise<FieldError[]> {
  if (!validator) {
    const ajv = new Ajv2020({ allErrors: true, strict: false });
    validator = ajv.compile(JSON.parse(await fs.readFile(GATES_SCHEMA_FILE, 'utf8')) as object);
  }
  if (validator(doc)) return [];
  return (validator.errors ?? []).map((e) => ({
    path: e.instancePath,
    message: e.keyword === 'additionalProperties' ? `has an unknown field ${String(e.params.additionalProperty)}` : (e.message ?? 'is not valid'),
  }));
}

/** What a file at a workspace's root held: its text, or why it was not read. */
export type PlainFile = { text: string } | 'absent' | 'not-plain' | 'too-large';

/**
 * A plain file at a workspace's root (a real path), read through one handle opened without following a
 * link and checked once open. Never checked by name and then read by name again: between the two, a
 * step of the tenant's can swap the file for a link (renames in a loop) to another tenant's file or the
 * host's, and the service would read it and quote it in the set's errors or copy it into a run's copy.
 * A folder on the way swapped for a link leads outside and is refused too (openInside).
 */
export async function readPlainFile(root: string, name: string, maxBytes = Number.MAX_SAFE_INTEGER): Promise<PlainFile> {
  let handle: FileHandle;
  try {
    // non-blocking, so a FIFO opens at once for the stat below to refuse
    handle = await openInside(root, name, { follow: false });
  } catch (err) {
    const code = (err as { code?: unknown }).code;
    if (code === 'ENOENT' || code === 'ENOTDIR') return 'absent';
    // a link (ELOOP), a socket (ENXIO), a path that led outside the workspace
    if (code === 'ELOOP' || code === 'ENXIO' || code === 'path-outside-workspace') return 'not-plain';
    throw err;
  }
  try {
    const stat = await handle.stat();
    if (!stat.isFile()) return 'not-plain';
    if (stat.size > maxBytes) return 'too-large';
    // at most the size seen: a file that grows while it is read is not read past it
    const buf = Buffer.alloc(stat.size);
    let read = 0;
    for (let n = -1; n !== 0 && read < buf.length; read += n) n = (await handle.read(buf, read, buf.length - read, read)).bytesRead;
    return { text: buf.subarray(0, read).toString('utf8') };
  } finally {
    await handle.close();
  }
}

/** The gate set of a workspace (an absolute, resolved folder). */
export async function loadGateSet(workspace: string): Promise<GateSet> {
  for (const name of GATE_FILES) {
    // a symbolic link could name a file outside the workspace: only a plain file is read
    const file = await readPlainFile(workspace, name, 256 * 1024);
    if (file === 'absent') continue;
    if (file === 'not-plain') throw invalid(name, [{ path: '', message: 'must be a plain file' }]);
    if (file === 'too-large') throw invalid(name, [{ path: '', message: 'is larger than 256 KB' }]);
    let doc: unknown;
    try {
      doc = YAML.parse(file.text);
    } catch (err) {
      throw invalid(name, [{ path: '', message: `is not YAML: ${(err as Error).message.split('\n')[0]}` }]);
    }
    const errors = await validate(doc);
    // the service's own rules are checked on every gate that is an object, whatever the schema said: one 422
    // names every error (a repeated id or a path out of the workspace was named only once the schema's were fixed)
    const listed = (doc as { gates?: unknown } | null)?.gates;
    const items = Array.isArray(listed) ? (listed as unknown[]) : [];
    const ids = new Set<unknown>();
    items.forEach((item, i) => {
      if (!item || typeof item !== 'object' || Array.isArray(item)) return;
      const g = item as Record<string, unknown>;
      if (g.id !== undefined && ids.has(g.id)) errors.push({ path: `/gates/${i}/id`, message: `repeats the id ${String(g.id)}` });
      ids.add(g.id);
      if (g.id === SEAL_JOB) errors.push({ path: `/gates/${i}/id`, message: `${SEAL_JOB} is reserved (the gate run's own job); choose another id` });
      if (Boolean(g.run) === Boolean(g.builtin)) errors.push({ path: `/gates/${i}`, message: 'needs either run or builtin' });
      if (g.shell && typeof g.run !== 'string') errors.push({ path: `/gates/${i}/run`, message: 'must be a string when shell is true' });
      if (!g.shell && typeof g.run === 'string') errors.push({ path: `/gates/${i}/run`, message: 'must be an argv array (or set shell: true)' });
      if (g.pass === 'report' && !g.report) errors.push({ path: `/gates/${i}/report`, message: 'is required when pass is report' });
      // what the service reads itself stays inside the workspace
      for (const field of ['inputs', 'artifacts'] as const) {
        const paths = g[field];
        if (!Array.isArray(paths)) continue;
        paths.forEach((p, k) => {
          if (typeof p === 'string' && !staysInside(p))
            errors.push({ path: `/gates/${i}/${field}/${k}`, message: 'must be relative to the workspace, without ..' });
        });
      }
      const report = g.report as { path?: unknown } | undefined;
      if (typeof report?.path === 'string' && report.path && !staysInside(report.path))
        errors.push({ path: `/gates/${i}/report/path`, message: 'must be relative to the workspace, without ..' });
    });
    if (errors.length) throw invalid(name, errors);
    return withDigests(name, (items as Record<string, unknown>[]).map(normalize));
  }
  return withDigests('detected', await detect(workspace));
}

function normalize(g: Record<string, unknown>): GateDefinition {
  const run = typeof g.run === 'string' ? ['/bin/sh', '-c', g.run] : ((g.run as string[] | undefined) ?? null);
  return {
    id: g.id as string,
    name: (g.name as string | undefined) ?? (g.id as string),
    required: g.required !== false,
    run,
    builtin: (g.builtin as GateDefinition['builtin'] | undefined) ?? null,
    timeout_seconds: (g.timeout_seconds as number | undefined) ?? DEFAULT_TIMEOUT_SECONDS,
    env: (g.env as string[] | undefined) ?? [],
    pass: (g.pass as GateDefinition['pass'] | undefined) ?? 'exit_code',
    report: (g.report as GateDefinition['report'] | undefined) ?? null,
    inputs: (g.inputs as string[] | undefined) ?? null,
    artifacts: (g.artifacts as string[] | undefined) ?? [],
  };
}

/** The set a workspace without a gate file gets: its package.json scripts, and a secret scan. */
async function detect(workspace: string): Promise<GateDefinition[]> {
  const gates: GateDefinition[] = [];
  const pkgFile = await readPlainFile(workspace, 'package.json', PACKAGE_JSON_MAX_BYTES);
  if (pkgFile !== 'absent' && pkgFile !== 'not-plain') {
    // the gates come from its scripts: one that cannot be read is an invalid set (a 422), not a set with no
    // tests in it; what the file holds is not quoted (a token in it would reach the answer and the log)
    if (pkgFile === 'too-large') throw invalid('package.json', [{ path: '', message: `is larger than ${PACKAGE_JSON_MAX_BYTES / 1024 / 1024} MB` }]);
    let pkg: unknown;
    try {
      pkg = JSON.parse(pkgFile.text);
    } catch {
      throw invalid('package.json', [{ path: '', message: 'is not valid JSON, so its scripts cannot be read as gates' }]);
    }
    if (typeof pkg !== 'object' || pkg === null || Array.isArray(pkg)) throw invalid('package.json', [{ path: '', message: 'must be a JSON object' }]);
    const { scripts } = pkg as { scripts?: Record<string, unknown> };
    for (const script of DETECTED_SCRIPTS) {
      if (typeof scripts?.[script] !== 'string') continue;
      gates.push(
        normalize({ id: script, name: `npm run ${script}`, run: script === 'test' ? ['npm', 'test', '--silent'] : ['npm', 'run', '--silent', script] }),
      );
    }
  }
  gates.push(normalize({ id: 'secrets', name: 'secret scan', builtin: 'secret-scan' }));
  return gates;
}

function withDigests(source: string, gates: GateDefinition[]): GateSet {
  return { source, gates: gates.map((g) => ({ ...g, digest: `sha256:${sha256Hex(canonicalJson(g))}` })) };
}
