// npm run bench (part six): the workspace audit of a generated 5,000-file TypeScript tree, through the
// service built as it ships (dist/, NODE_ENV=production: four phases in bubblewrap as a BullMQ flow,
// the report through Redis, its summary into the ledger), against secretlint 12 and dependency-cruiser
// 17 run alone on the same tree (their CLIs, the same rules), in the same run. The audit also parses
// every file for function sizes, scans for markers and reads the manifest, lockfile and git state.
// Goal: the audit adds at most 20% to the two tools run one after the other. Median of 3 rounds each.
// secretlint 12.0.0 (the last for Node 20) is O(n^2) in files through its profiler (5,000 files: about
// 300 s); the service drops the profiler's marks, and so does this baseline, so it is compared with
// secretlint as it should run.
import { spawnSync } from 'node:child_process';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { PROJECT_ROOT } from '../config/paths.js';
import { deleteRedisPrefix, uniquePrefix } from '../test/support/harness.js';
import { makeTsTree } from '../test/support/projects.js';
import { BENCH_KEY, serviceEnv, startServer, stop } from './http.js';

const FILES = 5000;
const ROUNDS = 3;

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

function timed(argv: string[], cwd: string): number {
  const t0 = performance.now();
  const r = spawnSync(argv[0]!, argv.slice(1), { cwd, stdio: ['ignore', 'ignore', 'pipe'], encoding: 'utf8' });
  const ms = performance.now() - t0;
  // secretlint exits 1 when it finds something; anything else is a broken baseline
  if (r.status !== 0 && r.status !== 1) throw new Error(`${argv.join(' ')} exited ${r.status}: ${r.stderr}`);
  return ms;
}

export async function auditBenchmarks(): Promise<string[]> {
  const built = spawnSync('npm', ['run', 'build', '--silent'], { cwd: PROJECT_ROOT, stdio: 'inherit' });
  if (built.status !== 0) throw new Error('npm run build failed');
  const dataDir = await fs.mkdtemp(path.join(os.tmpdir(), 'bench-audit-'));
  const workspaces = path.join(dataDir, 'workspaces');
  const tree = path.join(workspaces, 'bench', 'tree');
  const prefix = uniquePrefix();
  await makeTsTree(tree, FILES);
  // the baselines' configuration: secretlint's recommended preset; dependency-cruiser with the audit's three rules
  const config = path.join(dataDir, 'config');
  await fs.mkdir(config);
  await fs.writeFile(path.join(config, 'secretlintrc.json'), JSON.stringify({ rules: [{ id: '@secretlint/secretlint-rule-preset-recommend' }] }));
  await fs.writeFile(
    path.join(config, 'depcruise.json'),
    JSON.stringify({
      forbidden: [
        { name: 'no-circular', severity: 'warn', from: {}, to: { circular: true } },
        { name: 'no-orphans', severity: 'info', from: { orphan: true }, to: {} },
        { name: 'unresolvable-import', severity: 'error', from: {}, to: { couldNotResolve: true } },
      ],
      options: { tsPreCompilationDeps: true, doNotFollow: { path: 'node_modules' } },
    }),
  );
  const bin = (name: string) => path.join(PROJECT_ROOT, 'node_modules', '.bin', name);
  const secretlint: number[] = [];
  const depcruise: number[] = [];
  for (let i = 0; i < ROUNDS; i++) {
    // secretlint's CLI with the same fix of its profiler the service applies (stock 12.0.0 is O(n^2) in files)
    secretlint.push(
      timed(
        [
          process.execPath,
          '--import',
          path.join(PROJECT_ROOT, 'bench', 'support', 'secretlint-without-profiler.mjs'),
          path.join(PROJECT_ROOT, 'node_modules', 'secretlint', 'bin', 'secretlint.js'),
          '--secretlintrc',
          path.join(config, 'secretlintrc.json'),
          '**/*',
        ],
        tree,
      ),
    );
    depcruise.push(timed([bin('depcruise'), '--config', path.join(config, 'depcruise.json'), '--output-type', 'err', 'src', 'test'], tree));
  }

  const service = await startServer(path.join(PROJECT_ROOT, 'dist', 'main.js'), {
    ...serviceEnv(dataDir, prefix, workspaces),
    SERVICE_AUDIT_REGISTRY_URL: 'none',
  });
  type Report = { phases: { phase: string; duration_ms: number; status: string }[]; status: string };
  const audits: { ms: number; report: Report }[] = [];
  try {
    for (let i = 0; i < ROUNDS; i++) {
      const t0 = performance.now();
      const res = await fetch(`${service.url}/api/v1/autonomy/workspace-audit/run`, {
        method: 'POST',
        headers: { authorization: `Bearer ${BENCH_KEY}`, 'content-type': 'application/json' },
        body: JSON.stringify({ workspace: 'tree', timeout_seconds: 300 }),
      });
      const ms = performance.now() - t0;
      const report = (await res.json()) as Report;
      if (res.status !== 200 || report.status !== 'completed')
        throw new Error(`the audit did not complete: ${res.status} ${JSON.stringify(report).slice(0, 500)}`);
      audits.push({ ms, report });
    }
  } finally {
    await stop(service.child);
    await deleteRedisPrefix(prefix);
    await fs.rm(dataDir, { recursive: true, force: true });
  }
  const s = median(secretlint);
  const d = median(depcruise);
  // the median round, and its phases
  const { ms: a, report } = [...audits].sort((x, y) => x.ms - y.ms)[Math.floor(audits.length / 2)]!;
  const phases = report.phases.map((p) => `${p.phase} ${(p.duration_ms / 1000).toFixed(1)} s`).join(', ');
  return [
    `| audit of ${FILES.toLocaleString('en')} TS files (4 phases, sandboxed, one flow) vs secretlint + dependency-cruiser alone | ${(a / 1000).toFixed(2)} s | ${((s + d) / 1000).toFixed(2)} s (${(s / 1000).toFixed(2)} + ${(d / 1000).toFixed(2)}) | ${(a / (s + d)).toFixed(2)} (goal <= 1.20) |`,
    `| its phases, in parallel (${os.cpus().length} cores) | ${phases} | | |`,
  ];
}
