// sanity: the manifest and its lockfile agree (npm's package-lock, pnpm's importers, yarn's entries),
// the licenses the lockfile declares, a README and tests present, and the git state (uncommitted
// changes, a detached HEAD).
import semver from 'semver';
import YAML from 'yaml';
import { masked } from './mask.js';
import { Findings, readText, type PhaseOutput, type Workspace } from './workspace.js';

const MAX_MANIFEST_BYTES = 64 * 1024 * 1024;
const SECTIONS = ['dependencies', 'devDependencies', 'optionalDependencies'] as const;
const COPYLEFT = /\b(AGPL|GPL|SSPL|EUPL|OSL)\b/i;
const TESTS = /(^|\/)(test|tests|__tests__|spec|specs)\/|\.(test|spec)\.[^/]+$|_test\.(go|py|rb)$|(^|\/)test_[^/]+\.py$/;

export type Manifest = { name?: string; [section: string]: unknown };
type LockPackage = { version?: string; license?: string; dev?: boolean; optional?: boolean };

export function declared(manifest: Manifest): Map<string, string> {
  const out = new Map<string, string>();
  for (const s of SECTIONS) for (const [n, r] of Object.entries((manifest[s] as Record<string, string> | undefined) ?? {})) out.set(n, String(r));
  return out;
}

/** A range npm resolves from the registry (not a git URL, a path, a tag or an alias). */
const registryRange = (range: string) => semver.validRange(range) !== null;

export async function readJson<T>(ws: Workspace, rel: string): Promise<T | null | 'invalid'> {
  const text = await readText(ws.root, rel, MAX_MANIFEST_BYTES);
  if (text === null) return null;
  try {
    return JSON.parse(text) as T;
  } catch {
    return 'invalid';
  }
}

/** package-lock.json (v2, v3) as name -> entry of the root's node_modules. */
export async function npmLock(ws: Workspace): Promise<{ file: string; root: Record<string, unknown>; packages: Map<string, LockPackage> } | null> {
  for (const file of ['package-lock.json', 'npm-shrinkwrap.json']) {
    const lock = await readJson<{ lockfileVersion?: number; packages?: Record<string, LockPackage & Record<string, unknown>> }>(ws, file);
    if (!lock || lock === 'invalid' || !lock.packages) continue;
    const packages = new Map<string, LockPackage>();
    for (const [key, entry] of Object.entries(lock.packages)) {
      const at = key.lastIndexOf('node_modules/');
      if (key.startsWith('node_modules/') && at === 0) packages.set(key.slice('node_modules/'.length), entry);
    }
    return { file, root: lock.packages[''] ?? {}, packages };
  }
  return null;
}

export async function sanityPhase(ws: Workspace, findings: Findings): Promise<PhaseOutput['metrics']> {
  const metrics: Record<string, unknown> = {};
  const manifest = await readJson<Manifest>(ws, 'package.json');
  if (manifest === 'invalid') findings.add('manifest-invalid', 'high', 'package.json', null, 'package.json is not valid JSON');
  const deps = manifest && manifest !== 'invalid' ? declared(manifest) : new Map<string, string>();
  metrics.manifest = manifest === null ? null : 'package.json';
  metrics.declared_dependencies = deps.size;

  const npm = await npmLock(ws);
  const hasPnpm = ws.files.includes('pnpm-lock.yaml');
  const hasYarn = ws.files.includes('yarn.lock');
  metrics.lockfile = npm?.file ?? (hasPnpm ? 'pnpm-lock.yaml' : hasYarn ? 'yarn.lock' : null);
  let mismatches = 0;
  const mismatch = (file: string, message: string) => {
    mismatches++;
    findings.add('lockfile-mismatch', 'medium', file, null, message);
  };
  if (deps.size && !metrics.lockfile)
    findings.add('no-lockfile', 'medium', 'package.json', null, 'package.json declares dependencies and no lockfile pins them');
  if (npm) {
    const recorded = declared(npm.root as Manifest);
    // a range or a locked value may hold a credential (a git URL's token): each quote masked on its own, so the
    // mask takes the credential, not the words after it (phase-main masks every message again, whole)
    for (const [name, range] of deps) {
      if (recorded.get(name) !== range)
        mismatch(
          npm.file,
          `package.json declares ${await masked(`${name}@${range}`)}, ${npm.file} records ${recorded.has(name) ? await masked(`${name}@${recorded.get(name)}`) : 'nothing for it'}`,
        );
      const locked = npm.packages.get(name)?.version;
      if (!locked) mismatch(npm.file, `${await masked(name)} is declared and not in ${npm.file}`);
      else if (registryRange(range) && semver.valid(locked) && !semver.satisfies(locked, range, { includePrerelease: true }))
        mismatch(npm.file, `${npm.file} locks ${await masked(`${name}@${locked}`)}, outside the declared ${await masked(range)}`);
    }
    for (const name of recorded.keys())
      if (!deps.has(name)) mismatch(npm.file, `${npm.file} records ${await masked(name)}, which package.json no longer declares`);
    // licenses, as the lockfile declares them
    const licenses: Record<string, number> = {};
    for (const [name, p] of npm.packages) {
      const license = typeof p.license === 'string' ? p.license : 'UNKNOWN';
      licenses[license] = (licenses[license] ?? 0) + 1;
      if (p.dev) continue;
      if (license === 'UNKNOWN') findings.add('license-unknown', 'low', npm.file, null, `${name}@${p.version ?? '?'} declares no license`);
      else if (COPYLEFT.test(license) && !/LGPL/i.test(license))
        findings.add('license-copyleft', 'medium', npm.file, null, `${name}@${p.version ?? '?'} is ${license}, a copyleft license, and not a dev dependency`);
    }
    metrics.licenses = licenses;
  } else if (hasPnpm) {
    const text = await readText(ws.root, 'pnpm-lock.yaml', MAX_MANIFEST_BYTES);
    const lock = (() => {
      try {
        return YAML.parse(text ?? '') as { importers?: Record<string, Record<string, Record<string, { specifier?: string }>>> };
      } catch {
        return null;
      }
    })();
    const root = lock?.importers?.['.'] ?? {};
    for (const [name, range] of deps) {
      const specifier = SECTIONS.map((s) => root[s]?.[name]?.specifier).find(Boolean);
      if (specifier !== range)
        mismatch(
          'pnpm-lock.yaml',
          `package.json declares ${await masked(`${name}@${range}`)}, pnpm-lock.yaml records ${specifier ? await masked(specifier) : 'nothing for it'}`,
        );
    }
  } else if (hasYarn) {
    const text = (await readText(ws.root, 'yarn.lock', MAX_MANIFEST_BYTES)) ?? '';
    for (const [name, range] of deps)
      if (!text.includes(`${name}@${range}`) && !text.includes(`${name}@npm:${range}`))
        mismatch('yarn.lock', `yarn.lock has no entry for ${await masked(`${name}@${range}`)}`);
  }
  metrics.lockfile_mismatches = mismatches;

  const readme = ws.files.find((f) => /^readme(\.[a-z]+)?$/i.test(f));
  if (!readme) findings.add('no-readme', 'low', null, null, 'the workspace has no README at its root');
  const tests = ws.files.filter((f) => TESTS.test(f)).length;
  if (!tests) findings.add('no-tests', 'medium', null, null, 'no test files found (test/, tests/, __tests__/, *.test.*, *.spec.*)');
  metrics.readme = readme ?? null;
  metrics.test_files = tests;

  // a repository git could not read is said so: neither "not a repository" nor a clean state
  if (ws.gitUnknown) findings.add('git-state-unknown', 'medium', null, null, `the git state is unknown: ${ws.gitUnknown}`);
  else if (!ws.git) findings.add('not-a-repository', 'info', null, null, 'the workspace is not a git repository');
  if (ws.git) {
    const changed = ws.git.changed;
    if (ws.git.detached) findings.add('detached-head', 'low', null, null, `HEAD is detached at ${ws.git.commit?.slice(0, 12)}`);
    if (changed?.length)
      findings.add('uncommitted-changes', 'low', null, null, `${changed.length} path${changed.length === 1 ? ' has' : 's have'} uncommitted changes`);
    if (!ws.git.commit && !ws.gitUnknown) findings.add('no-commits', 'low', null, null, 'the repository has no commit yet');
  }
  metrics.git =
    ws.git || ws.gitUnknown
      ? {
          commit: ws.git?.commit ?? null,
          branch: ws.git?.branch ?? null,
          detached: ws.git?.detached ?? null,
          uncommitted: ws.git?.changed?.length ?? null,
          ...(ws.gitUnknown ? { unknown: ws.gitUnknown } : {}),
        }
      : null;
  return metrics;
}
