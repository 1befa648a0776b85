// npm run bench (part seven): no-op runs through 1, 2 and 4 worker processes (the Procfile's `worker`,
// started by the bench) on one Redis and one SQLite file. The runs are stored and queued first; the
// clock runs from the workers' start until the store counts every run finished.
import { spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { PROJECT_ROOT } from '../config/paths.js';
import { createLogger } from '../engine/platform/index.js';
import { openRuntime } from '../engine/process/index.js';
import { parseEnv } from '../config/env.js';
import { deleteRedisPrefix, uniquePrefix } from '../test/support/harness.js';
import { stop } from './http.js';

const RUNS = Number(process.env.BENCH_WORKER_RUNS ?? 6000);
const NOOP = [{ tool: 'message' as const, args: { text: 'noop' } }];

async function throughput(processes: number): Promise<number> {
  const dataDir = await fs.mkdtemp(path.join(os.tmpdir(), 'bench-workers-'));
  const env = {
    REDIS_URL: process.env.REDIS_URL ?? 'redis://127.0.0.1:6379',
    SERVICE_QUEUE_PREFIX: uniquePrefix(),
    SERVICE_DATA_DIR: dataDir,
    SERVICE_WORKSPACE_ROOT: path.join(dataDir, 'workspaces'),
    SERVICE_TENANT_MAX_RUNNING: '10000',
    SERVICE_SECRET_KEY: 'ab'.repeat(32),
    SERVICE_EVIDENCE_KEY: 'cd'.repeat(32),
    LOG_LEVEL: 'warn',
  };
  const rt = await openRuntime(parseEnv(env), createLogger('warn'));
  const children: ChildProcess[] = [];
  try {
    // the queue is paused while the runs are queued and the processes start: the clock measures work, not start-up
    const queue = rt.queues.get('runs');
    await queue.pause();
    for (let i = 0; i < RUNS; i++) await rt.engine.runs.create('bench', { kind: 'autonomy', steps: NOOP, trigger: { type: 'api' } });
    const ready = [];
    for (let i = 0; i < processes; i++) {
      const child = spawn(process.execPath, ['--import', 'tsx', path.join(PROJECT_ROOT, 'workers', 'main.ts')], {
        env: { ...process.env, ...env, LOG_LEVEL: 'info' },
        detached: true,
        stdio: ['ignore', 'pipe', 'ignore'],
      });
      children.push(child);
      let out = '';
      ready.push(
        new Promise<void>((resolve) => {
          child.stdout!.on('data', (d: Buffer) => {
            out += d;
            if (out.includes('workers ready')) resolve();
          });
        }),
      );
    }
    await Promise.all(ready);
    const started = performance.now();
    await queue.resume();
    for (;;) {
      const counts = await rt.store.runs.countByKindAndStatus();
      if (counts.filter((c) => c.status === 'succeeded').reduce((n, c) => n + c.count, 0) >= RUNS) break;
      await new Promise((r) => setTimeout(r, 50));
    }
    return RUNS / ((performance.now() - started) / 1000);
  } finally {
    await Promise.all(children.map(stop));
    await rt.close();
    await deleteRedisPrefix(env.SERVICE_QUEUE_PREFIX);
    await fs.rm(dataDir, { recursive: true, force: true });
  }
}

export async function workerScaling(): Promise<string[]> {
  const rows: string[] = [];
  let one = 0;
  for (const n of [1, 2, 4]) {
    const rate = await throughput(n);
    one ||= rate;
    rows.push(`| ${n} worker process${n === 1 ? '' : 'es'} | ${rate.toFixed(0)} runs/s | ${(rate / one).toFixed(2)}x |`);
  }
  return rows;
}
