// npm run bench: HTTP throughput and latency of the service against a bare Express 5 baseline,
// measured in the same run on the same machine, at the same concurrency. Prints a table of ratios.
import { spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import autocannon from 'autocannon';
import { deleteRedisPrefix, uniquePrefix } from '../test/support/harness.js';
import { runBenchmarks } from './runs.js';

const CONNECTIONS = Number(process.env.BENCH_CONNECTIONS ?? 50);
const SECONDS = Number(process.env.BENCH_SECONDS ?? 8);
const KEY = 'bench-key-0123456789abcdef';

type Result = { rps: number; p50: number; p99: number; errors: number; non2xx: number };

function startServer(entry: string, env: Record<string, string>): Promise<{ child: ChildProcess; url: string }> {
  const child = spawn(process.execPath, ['--import', 'tsx', entry], { env: { ...process.env, ...env }, detached: true, stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      void stop(child);
      reject(new Error(`${entry} did not say where it listens within 30 s:\n${out}`));
    }, 30_000);
    child.once('exit', () => clearTimeout(timer));
    const onData = (d: Buffer) => {
      out += d;
      const m = /listening on (http:\/\/(?:localhost|127\.0\.0\.1):\d+)/.exec(out);
      if (m) {
        clearTimeout(timer);
        resolve({ child, url: m[1]!.replace('localhost', '127.0.0.1') });
      }
    };
    child.stdout!.on('data', onData);
    child.stderr!.on('data', onData);
    child.once('exit', (code) => reject(new Error(`${entry} exited ${code}:\n${out}`)));
  });
}

/** Kills the server's process group and waits for it, so nothing writes to Redis after clean-up. */
async function stop(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise((resolve) => child.once('exit', resolve));
  try {
    process.kill(-child.pid!, 'SIGKILL');
  } catch {
    return; // gone already
  }
  await exited;
}

async function load(opts: { url: string; method: 'GET' | 'POST'; body?: string; headers?: Record<string, string> }): Promise<Result> {
  process.stderr.write(`bench: ${opts.method} ${opts.url}\n`);
  // a short warm-up lets V8 optimise before we measure
  await autocannon({ ...opts, connections: CONNECTIONS, duration: 2 });
  const r = await autocannon({ ...opts, connections: CONNECTIONS, duration: SECONDS });
  return { rps: r.requests.average, p50: r.latency.p50, p99: r.latency.p99, errors: r.errors + r.timeouts, non2xx: r.non2xx };
}

/** POST /api/v1/autonomy/run (auth, validation, store, event, tenant slot, enqueue) against bare Express + queue.add. */
async function runCreation(): Promise<[string, Result, Result]> {
  const dataDir = await fs.mkdtemp(path.join(os.tmpdir(), 'svc-bench-runs-'));
  const prefix = uniquePrefix();
  const servers: ChildProcess[] = [];
  const web = await startServer('api/main.ts', {
    PORT: '0',
    SERVICE_DATA_DIR: dataDir,
    SERVICE_QUEUE_PREFIX: prefix,
    SERVICE_API_KEYS: `bench:${KEY}`,
    SERVICE_WORKSPACE_ROOT: dataDir,
    SERVICE_TENANT_MAX_RUNNING: '10000',
    LOG_LEVEL: 'warn',
    NODE_ENV: 'production',
    SERVICE_SECRET_KEY: 'ab'.repeat(32),
  });
  servers.push(web.child);
  const body = JSON.stringify({ steps: [{ tool: 'message', args: { text: 'noop' } }] });
  try {
    const bare = await startServer('bench/servers/bare-express-queue.ts', { SERVICE_QUEUE_PREFIX: prefix });
    servers.push(bare.child);
    return [
      'POST /api/v1/autonomy/run (one no-op step) vs Express + queue.add',
      await load({ url: `${web.url}/api/v1/autonomy/run`, method: 'POST', headers: { authorization: `Bearer ${KEY}`, 'content-type': 'application/json' }, body }),
      await load({ url: `${bare.url}/api/v1/autonomy/run`, method: 'POST', headers: { 'content-type': 'application/json' }, body }),
    ];
  } finally {
    await Promise.all(servers.map(stop));
    await deleteRedisPrefix(prefix);
    await fs.rm(dataDir, { recursive: true, force: true });
  }
}

async function main(): Promise<void> {
  const dataDir = await fs.mkdtemp(path.join(os.tmpdir(), 'svc-bench-'));
  const prefix = uniquePrefix();
  const service = await startServer('main.ts', {
    PORT: '0',
    SERVICE_DATA_DIR: dataDir,
    SERVICE_QUEUE_PREFIX: prefix,
    SERVICE_API_KEYS: `bench:${KEY}`,
    LOG_LEVEL: 'warn',
    NODE_ENV: 'production',
    SERVICE_SECRET_KEY: 'ab'.repeat(32),
  });
  const auth = { authorization: `Bearer ${KEY}`, 'content-type': 'application/json' };
  const definition = JSON.stringify({ name: 'bench', triggers: [{ type: 'cron', schedule: '0 3 * * *', timezone: 'UTC' }], steps: [{ tool: 'shell', args: { command: 'true' } }] });
  let created: unknown;
  for (let i = 0; i < 20; i++) created = await (await fetch(`${service.url}/api/v1/automations`, { method: 'POST', headers: auth, body: definition })).json();
  const list = await (await fetch(`${service.url}/api/v1/automations?limit=20`, { headers: auth })).json();
  const fixtures = path.join(dataDir, 'fixtures.json');
  await fs.writeFile(fixtures, JSON.stringify({ list, created }));
  const bare = await startServer('bench/servers/bare-express.ts', { PORT: '0', BENCH_FIXTURES: fixtures });
  try {
    const rows: [string, Result, Result][] = [];
    rows.push([
      'GET /api/v1/automations (20 items)',
      await load({ url: `${service.url}/api/v1/automations?limit=20`, method: 'GET', headers: auth }),
      await load({ url: `${bare.url}/api/v1/automations`, method: 'GET' }),
    ]);
    rows.push(await runCreation());
    rows.push([
      'POST /api/v1/automations (create)',
      await load({ url: `${service.url}/api/v1/automations`, method: 'POST', headers: auth, body: definition }),
      await load({ url: `${bare.url}/api/v1/automations`, method: 'POST', headers: { 'content-type': 'application/json' }, body: definition }),
    ]);
    const date = new Date().toISOString().slice(0, 10);
    console.log(`\nHTTP benchmarks, ${date}, ${os.cpus().length} cores, ${CONNECTIONS} connections, ${SECONDS} s each, Node ${process.version}\n`);
    console.log('| scenario | service req/s | bare Express req/s | ratio | service p50 / p99 ms | bare p50 / p99 ms | errors + non-2xx |');
    console.log('|---|---|---|---|---|---|---|');
    for (const [name, s, b] of rows) {
      console.log(`| ${name} | ${s.rps.toFixed(0)} | ${b.rps.toFixed(0)} | ${(s.rps / b.rps).toFixed(2)} | ${s.p50} / ${s.p99} | ${b.p50} / ${b.p99} | ${s.errors + s.non2xx} |`);
    }
    console.log('\n| run engine | service | raw BullMQ | ratio |');
    console.log('|---|---|---|---|');
    for (const line of await runBenchmarks()) console.log(line);
  } finally {
    await Promise.all([stop(service.child), stop(bare.child)]);
    await deleteRedisPrefix(prefix);
    await fs.rm(dataDir, { recursive: true, force: true });
  }
}

await main();
