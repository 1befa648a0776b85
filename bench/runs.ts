// npm run bench (part two): the run engine against raw BullMQ, in one process, on the same Redis.
//  - throughput: N no-op runs through the workers vs N no-op BullMQ jobs, same concurrency
//  - latency: enqueue to `run.started`, p50 and p99 over M sequential runs, vs BullMQ add-to-process
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { Queue, Worker } from 'bullmq';
import { Redis } from 'ioredis';
import { parseEnv } from '../config/env.js';
import { createLogger } from '../engine/platform/log.js';
import { openRuntime } from '../engine/process/runtime.js';
import { percentile } from '../engine/platform/stats.js';
import { startWorkers } from '../workers/index.js';
import { deleteRedisPrefix, uniquePrefix } from '../test/support/harness.js';

const RUNS = Number(process.env.BENCH_RUNS ?? 10_000);
const SEQUENTIAL = Number(process.env.BENCH_SEQUENTIAL ?? 1000);
const CONCURRENCY = Number(process.env.BENCH_CONCURRENCY ?? 10);
const REDIS_URL = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
const NOOP = [{ tool: 'message' as const, args: { text: 'noop' } }];

/**
 * Adds RUNS no-op BullMQ jobs, then hands `measure` the work of draining them through a no-op worker at the
 * same concurrency as the service's (the baseline of the runs row and of the floor's job).
 */
export async function rawJobs<T>(measure: (drain: () => Promise<void>) => Promise<T>): Promise<T> {
  const prefix = uniquePrefix();
  const connection = new Redis(REDIS_URL, { maxRetriesPerRequest: null });
  const queue = new Queue('noop', { connection, prefix });
  try {
    for (let i = 0; i < RUNS; i += 1000)
      await queue.addBulk(Array.from({ length: Math.min(1000, RUNS - i) }, (_, j) => ({ name: 'noop', data: { i: i + j }, opts: { removeOnComplete: true } })));
    return await measure(async () => {
      let done = 0;
      await new Promise<void>((resolve) => {
        const worker = new Worker('noop', async () => undefined, { connection, prefix, concurrency: CONCURRENCY });
        worker.on('completed', () => {
          if (++done === RUNS) void worker.close().then(() => resolve());
        });
      });
    });
  } finally {
    await queue.close();
    connection.disconnect();
    await deleteRedisPrefix(prefix);
  }
}

function rawThroughput(): Promise<number> {
  return rawJobs(async (drain) => {
    const started = performance.now();
    await drain();
    return RUNS / ((performance.now() - started) / 1000);
  });
}

async function rawLatency(): Promise<number[]> {
  const prefix = uniquePrefix();
  const connection = new Redis(REDIS_URL, { maxRetriesPerRequest: null });
  const queue = new Queue('lat', { connection, prefix });
  let release: ((t: number) => void) | undefined;
  const worker = new Worker('lat', async () => release?.(performance.now()), { connection, prefix, concurrency: CONCURRENCY });
  await worker.waitUntilReady();
  const samples: number[] = [];
  try {
    for (let i = 0; i < SEQUENTIAL; i++) {
      const seen = new Promise<number>((r) => (release = r));
      const t0 = performance.now();
      await queue.add('lat', { i }, { removeOnComplete: true });
      samples.push((await seen) - t0);
    }
    return samples;
  } finally {
    await worker.close();
    await queue.close();
    connection.disconnect();
    await deleteRedisPrefix(prefix);
  }
}

export async function service<T>(fn: (rt: Awaited<ReturnType<typeof openRuntime>>) => Promise<T>): Promise<T> {
  const dataDir = await fs.mkdtemp(path.join(os.tmpdir(), 'svc-bench-engine-'));
  const workspace = path.join(dataDir, 'workspace');
  await fs.mkdir(workspace);
  const config = parseEnv({
    REDIS_URL,
    SERVICE_QUEUE_PREFIX: uniquePrefix(),
    SERVICE_DATA_DIR: dataDir,
    SERVICE_WORKSPACE_ROOT: workspace,
    SERVICE_WORKER_CONCURRENCY: String(CONCURRENCY),
    SERVICE_TENANT_MAX_RUNNING: '10000',
    SERVICE_SECRET_KEY: 'ab'.repeat(32),
    LOG_LEVEL: 'warn',
  });
  const rt = await openRuntime(config, createLogger('warn'));
  try {
    return await fn(rt);
  } finally {
    await rt.close();
    await deleteRedisPrefix(config.queuePrefix);
    await fs.rm(dataDir, { recursive: true, force: true });
  }
}

/** How many runs the service has finished so far, of any kind and status (its metric). */
export async function runsFinished(rt: Awaited<ReturnType<typeof openRuntime>>): Promise<number> {
  return (await rt.metrics.runsFinished.get()).values.reduce((n, v) => n + v.value, 0);
}

async function engineThroughput(): Promise<number> {
  return service(async (rt) => {
    for (let i = 0; i < RUNS; i++) await rt.engine.runs.create('bench', { kind: 'autonomy', steps: NOOP, trigger: { type: 'api' } });
    const started = performance.now();
    const workers = await startWorkers(rt);
    try {
      while ((await runsFinished(rt)) < RUNS) await new Promise((r) => setTimeout(r, 10));
      return RUNS / ((performance.now() - started) / 1000);
    } finally {
      await workers.close();
    }
  });
}

async function engineLatency(): Promise<number[]> {
  return service(async (rt) => {
    const workers = await startWorkers(rt);
    const reader = rt.redis.duplicate();
    const samples: number[] = [];
    try {
      for (let i = 0; i < SEQUENTIAL; i++) {
        const t0 = performance.now();
        const run = await rt.engine.runs.create('bench', { kind: 'autonomy', steps: NOOP, trigger: { type: 'api' } });
        const key = rt.events.key(`session:${run.session_id}`);
        let last = '0-0';
        for (;;) {
          const res = (await reader.xread('BLOCK', 1000, 'STREAMS', key, last)) as [string, [string, string[]][]][] | null;
          const entries = res?.[0]?.[1] ?? [];
          last = entries.at(-1)?.[0] ?? last;
          if (entries.some(([, f]) => f[1]!.includes('"type":"run.started"'))) break;
        }
        samples.push(performance.now() - t0);
      }
      return samples;
    } finally {
      reader.disconnect();
      await workers.close();
    }
  });
}

/** Rounds of the throughput pair, alternating (BullMQ, the service, BullMQ, ...): a noisy machine's swings hit both. */
const ROUNDS = Number(process.env.BENCH_RUNS_ROUNDS ?? 3);

export async function runBenchmarks(): Promise<string[]> {
  const step = (what: string) => process.stderr.write(`bench: ${what}\n`);
  const raws: number[] = [];
  const ourss: number[] = [];
  for (let i = 1; i <= ROUNDS; i++) {
    step(`raw BullMQ throughput, ${RUNS} jobs (round ${i} of ${ROUNDS})`);
    raws.push(await rawThroughput());
    step(`engine throughput, ${RUNS} runs (round ${i} of ${ROUNDS})`);
    ourss.push(await engineThroughput());
  }
  const raw = percentile(raws, 50);
  const ours = percentile(ourss, 50);
  const range = (xs: number[]) => `${Math.min(...xs).toFixed(0)}–${Math.max(...xs).toFixed(0)}`;
  step(`raw BullMQ latency, ${SEQUENTIAL} jobs`);
  const rawLat = await rawLatency();
  step(`engine latency, ${SEQUENTIAL} runs`);
  const ourLat = await engineLatency();
  const f = (n: number) => n.toFixed(2);
  return [
    `| ${RUNS} no-op runs through the workers (concurrency ${CONCURRENCY}) vs ${RUNS} no-op BullMQ jobs, median of ${ROUNDS} alternating rounds (${range(ourss)} against ${range(raws)}) | ${ours.toFixed(0)} runs/s | ${raw.toFixed(0)} jobs/s | ${(ours / raw).toFixed(2)} |`,
    `| enqueue to run.started, ${SEQUENTIAL} sequential runs, p50 / p99 ms vs BullMQ add-to-process | ${f(percentile(ourLat, 50))} / ${f(percentile(ourLat, 99))} | ${f(percentile(rawLat, 50))} / ${f(percentile(rawLat, 99))} | p99 +${f(percentile(ourLat, 99) - percentile(rawLat, 99))} ms |`,
  ];
}
