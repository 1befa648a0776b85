// End to end: runs accepted over HTTP and finished by the workers. The service as one process
// (`main.ts`: API and workers, SQLite, local Redis) against a bare Express 5 route doing queue.add with a
// no-op BullMQ worker in one process. Each is loaded at 50 connections for 8 s (after a 2 s warm-up that
// is drained first); the clock runs from the load's start until the queue has no job left, and the
// figure is the requests accepted (2xx) over that time. Median of three alternating rounds.
import type { ChildProcess } from 'node:child_process';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import autocannon from 'autocannon';
import { Queue } from 'bullmq';
import { Redis } from 'ioredis';
import { deleteRedisPrefix, uniquePrefix } from '../test/support/harness.js';
import { BENCH_KEY, CONNECTIONS, SECONDS, serviceEnv, startServer, stop } from './http.js';

const REDIS_URL = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
const ROUNDS = Number(process.env.BENCH_E2E_ROUNDS ?? 3);
const BODY = JSON.stringify({ steps: [{ tool: 'message', args: { text: 'noop' } }] });

export type EndToEnd = { rps: number; accepted: number; drainMs: number; errors: number };

/** Loads `url` for `seconds`, then waits until `queue` has nothing waiting, delayed or active. */
async function loadAndDrain(url: string, headers: Record<string, string>, queue: Queue, seconds: number): Promise<EndToEnd> {
  const started = performance.now();
  const r = await autocannon({
    url,
    method: 'POST',
    headers: { ...headers, 'content-type': 'application/json' },
    body: BODY,
    connections: CONNECTIONS,
    duration: seconds,
  });
  const loaded = performance.now();
  for (;;) {
    const c = await queue.getJobCounts('waiting', 'delayed', 'active', 'prioritized', 'waiting-children');
    if (Object.values(c).every((n) => n === 0)) break;
    if (performance.now() - loaded > 120_000) throw new Error(`the queue did not drain in 120 s: ${JSON.stringify(c)}`);
    await new Promise((res) => setTimeout(res, 20));
  }
  const ms = performance.now() - started;
  const accepted = r.requests.total - r.non2xx - r.errors - r.timeouts;
  return { rps: (accepted * 1000) / ms, accepted, drainMs: performance.now() - loaded, errors: r.non2xx + r.errors + r.timeouts };
}

async function round(kind: 'service' | 'bare'): Promise<EndToEnd> {
  const dataDir = await fs.mkdtemp(path.join(os.tmpdir(), `svc-bench-e2e-${kind}-`));
  const prefix = uniquePrefix();
  const connection = new Redis(REDIS_URL, { maxRetriesPerRequest: null });
  let server: ChildProcess | undefined;
  try {
    const started =
      kind === 'service'
        ? await startServer('main.ts', { ...serviceEnv(dataDir, prefix), SERVICE_TENANT_MAX_RUNNING: '10000' })
        : await startServer('bench/servers/bare-express-queue.ts', { SERVICE_QUEUE_PREFIX: prefix, BENCH_WORKER: '1' });
    server = started.child;
    const queue = new Queue(kind === 'service' ? 'runs' : 'bare', { connection, prefix });
    const headers: Record<string, string> = kind === 'service' ? { authorization: `Bearer ${BENCH_KEY}` } : {};
    const url = `${started.url}/api/v1/autonomy/run`;
    process.stderr.write(`bench: end to end, ${kind}: POST ${url}, then drain\n`);
    await loadAndDrain(url, headers, queue, 2); // warm-up
    const result = await loadAndDrain(url, headers, queue, SECONDS);
    await queue.close();
    return result;
  } finally {
    if (server) await stop(server);
    connection.disconnect();
    await deleteRedisPrefix(prefix);
    await fs.rm(dataDir, { recursive: true, force: true });
  }
}

const median = (xs: EndToEnd[]) => [...xs].sort((a, b) => a.rps - b.rps)[Math.floor(xs.length / 2)]!;

export async function endToEnd(): Promise<string[]> {
  const service: EndToEnd[] = [];
  const bare: EndToEnd[] = [];
  for (let i = 0; i < ROUNDS; i++) {
    service.push(await round('service'));
    bare.push(await round('bare'));
  }
  const s = median(service);
  const b = median(bare);
  const range = (xs: EndToEnd[]) => `${Math.min(...xs.map((x) => x.rps)).toFixed(0)}-${Math.max(...xs.map((x) => x.rps)).toFixed(0)}`;
  return [
    `| runs accepted over HTTP and finished by the workers (50 connections, ${SECONDS} s, then drain; median of ${ROUNDS}, range ${range(service)} vs ${range(bare)}) | ${s.rps.toFixed(0)} runs/s (${s.accepted} runs, drained ${(s.drainMs / 1000).toFixed(1)} s after the load, ${s.errors} refused) | ${b.rps.toFixed(0)} jobs/s (${b.accepted}, drained ${(b.drainMs / 1000).toFixed(1)} s after) | ${(s.rps / b.rps).toFixed(2)} |`,
  ];
}
