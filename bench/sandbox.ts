// The cost of the sandbox: start-to-exit of `true` through the shell tool's way of starting a process
// (a new process group, pipes), in bubblewrap with its limits and pids cgroup, against the same
// without a sandbox, alternating, in the same run.
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { createLogger, percentile } from '../engine/platform/index.js';
import { openSandbox, type Sandbox } from '../engine/tools/index.js';

const ROUNDS = 200;
const LIMITS = { cpuSeconds: 60, memoryMb: 4096, processes: 256, fileSizeMb: 1024 };

async function once(sandbox: Sandbox, workspace: string): Promise<number> {
  const t0 = performance.now();
  const proc = sandbox.spawn(['/bin/sh', '-c', 'true'], { workspace, env: { PATH: '/usr/bin:/bin' }, network: false });
  proc.child.stdout!.resume();
  proc.child.stderr!.resume();
  await new Promise((resolve, reject) => {
    proc.child.once('error', reject);
    proc.child.once('close', resolve);
  });
  proc.done();
  return performance.now() - t0;
}

export async function sandboxCost(): Promise<string[]> {
  const log = createLogger('warn');
  const bwrap = openSandbox({ mode: 'auto', limits: LIMITS, prefix: `bench-${process.pid}`, pathVar: process.env.PATH, log });
  if (bwrap.kind !== 'bwrap') return ['| sandbox start-to-exit of `true` | bwrap not installed | | |'];
  const none = openSandbox({ mode: 'none', limits: LIMITS, prefix: 'bench', pathVar: process.env.PATH, log });
  const workspace = await fs.mkdtemp(path.join(os.tmpdir(), 'svc-bench-sandbox-'));
  try {
    const inside: number[] = [];
    const outside: number[] = [];
    for (let i = 0; i < 10; i++) await once(bwrap, workspace); // warm-up
    for (let i = 0; i < ROUNDS; i++) {
      inside.push(await once(bwrap, workspace));
      outside.push(await once(none, workspace));
    }
    const f = (n: number) => n.toFixed(2);
    return [
      `| start-to-exit of \`true\`, ${ROUNDS} alternating rounds, p50 / p99 ms (processes bounded by ${bwrap.processLimit}) | ${f(percentile(inside, 50))} / ${f(percentile(inside, 99))} | ${f(percentile(outside, 50))} / ${f(percentile(outside, 99))} | +${f(percentile(inside, 50) - percentile(outside, 50))} ms at p50 |`,
    ];
  } finally {
    bwrap.close();
    await fs.rm(workspace, { recursive: true, force: true });
  }
}
