// Shared by the HTTP benchmarks: start a server as its own process group, load it with autocannon, stop it.
import { spawn, type ChildProcess } from 'node:child_process';
import autocannon from 'autocannon';
import fs from 'node:fs';
import http from 'node:http';

export const CONNECTIONS = Number(process.env.BENCH_CONNECTIONS ?? 50);
export const SECONDS = Number(process.env.BENCH_SECONDS ?? 8);

/** The API key every bench server of the service accepts (tenant `bench`). */
export const BENCH_KEY = 'bench-key-0123456789abcdef';

/**
 * Keys of forty tenants (`bench`'s first) for run creation: a tenant has at most SERVICE_TENANT_MAX_RUNNING
 * (10,000 at most) runs admitted at once, and a bench run never ends (no worker runs it), so past that a
 * tenant's runs wait in its line instead of becoming BullMQ jobs, less work than the baseline's `queue.add`.
 * Spread over forty tenants, every run of a bench's rounds is admitted and enqueued up to 400,000 runs: three
 * rounds of 10 s at 13,000 req/s. (Ten tenants' 100,000 were too few on a machine that took 3,900 req/s: 15,437
 * runs waited in the rounds of 2026-11-29.)
 */
export const RUN_TENANTS = 40;
export const RUN_KEYS = [BENCH_KEY, ...Array.from({ length: RUN_TENANTS - 1 }, (_, i) => `bench-key-${i + 1}-0123456789abcdef`)];
export const runTenant = (i: number) => (i === 0 ? 'bench' : `bench-${i}`);

/** Run creation's requests: the same body, each connection going through the tenants' keys in turn. */
export function runCreations(body: string): autocannon.Request[] {
  return RUN_KEYS.map((key) => ({
    method: 'POST',
    path: '/api/v1/autonomy/run',
    headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
    body,
  }));
}

/**
 * What a service process needs to start in production mode on this one machine, in its own data dir
 * and queue prefix: the embedded store, chosen explicitly as production asks, and its keys.
 */
export function serviceEnv(dataDir: string, prefix: string, workspaces = `${dataDir}/workspaces`): Record<string, string> {
  return {
    PORT: '0',
    SERVICE_DATA_DIR: dataDir,
    SERVICE_WORKSPACE_ROOT: workspaces,
    SERVICE_QUEUE_PREFIX: prefix,
    SERVICE_API_KEYS: RUN_KEYS.map((key, i) => `${runTenant(i)}:${key}`).join(','),
    // the load generator is a few tenants with a key each (one but for run creation), far past any production budget
    SERVICE_API_RATE_LIMIT_PER_MINUTE: '100000000',
    // and keeps every automation the create benchmark makes (tens of thousands; 1,000 unless set)
    SERVICE_TENANT_MAX_AUTOMATIONS: '1000000',
    NODE_ENV: 'production',
    SERVICE_STORE: 'sqlite',
    SERVICE_SECRET_KEY: 'ab'.repeat(32),
    SERVICE_EVIDENCE_KEY: 'cd'.repeat(32),
    LOG_LEVEL: 'warn',
  };
}

export type Result = { rps: number; p50: number; p99: number; errors: number; non2xx: number; cpuUsPerRequest?: number };

/** A process's CPU time so far (user and system), in µs, from /proc. */
function cpuUsOf(pid: number): number {
  const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
  // after the command's name, which is in parentheses and may hold any character
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return ((Number(fields[11]) + Number(fields[12])) * 1e6) / CLOCK_TICKS;
}
const CLOCK_TICKS = 100;

export function startServer(entry: string, env: Record<string, string>): Promise<{ child: ChildProcess; url: string }> {
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
export async function stop(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise((resolve) => child.once('exit', resolve));
  try {
    process.kill(-child.pid!, 'SIGKILL');
  } catch {
    return; // gone already
  }
  await exited;
}

/**
 * `pid`: the server's process, whose CPU a request the result then carries (Linux); `warmUp: false` skips
 * the warm-up (a server loaded before); `seconds` overrides BENCH_SECONDS.
 */
type LoadOptions = Omit<autocannon.Options, 'connections' | 'duration'> & {
  url: string;
  connections?: number;
  overallRate?: number;
  pid?: number;
  warmUp?: boolean;
  seconds?: number;
};

export async function load(opts: LoadOptions): Promise<Result> {
  process.stderr.write(`bench: ${opts.method ?? opts.requests?.[0]?.method ?? 'GET'} ${opts.url}${opts.overallRate ? ` at ${opts.overallRate} req/s` : ''}\n`);
  // a short warm-up lets V8 optimise before we measure
  const { pid, warmUp = true, seconds = SECONDS, ...load } = opts;
  if (warmUp) await autocannon({ connections: CONNECTIONS, ...load, duration: 2 });
  const cpu0 = pid === undefined ? 0 : cpuUsOf(pid);
  const r = await autocannon({ connections: CONNECTIONS, ...load, duration: seconds });
  const cpu = pid === undefined ? {} : { cpuUsPerRequest: (cpuUsOf(pid) - cpu0) / Math.max(1, r.requests.total) };
  return { rps: r.requests.average, p50: r.latency.p50, p99: r.latency.p99, errors: r.errors + r.timeouts, non2xx: r.non2xx, ...cpu };
}

/** The round with the median rate, with the errors of every round. */
function medianRound(results: Result[]): Result {
  const median = [...results].sort((a, b) => a.rps - b.rps)[Math.floor(results.length / 2)]!;
  return { ...median, errors: results.reduce((n, r) => n + r.errors, 0), non2xx: results.reduce((n, r) => n + r.non2xx, 0) };
}

/**
 * The service and its baseline loaded in turn, `rounds` times each (service, baseline, service, ...): the
 * machine's speed drifts by a quarter within minutes, so one load of each can compare two different
 * machines. Answers the median round of each.
 */
export async function alternating(service: LoadOptions, baseline: LoadOptions, rounds = HTTP_ROUNDS): Promise<[Result, Result]> {
  const ours: Result[] = [];
  const theirs: Result[] = [];
  for (let round = 0; round < rounds; round++) {
    ours.push(await load(service));
    theirs.push(await load(baseline));
  }
  return [medianRound(ours), medianRound(theirs)];
}
export const HTTP_ROUNDS = Number(process.env.BENCH_HTTP_ROUNDS ?? 3);
/** How a row says it is a median of alternating rounds. */
export const ROUNDS_NOTE = HTTP_ROUNDS > 1 ? `median of ${HTTP_ROUNDS} alternating rounds` : 'one round';

/**
 * The runs that waited in a full tenant's line instead of becoming BullMQ jobs, over RUN_KEYS' tenants: a
 * run-creation row is only the baseline's work when this is 0 (more rounds or seconds than RUN_TENANTS' caps hold).
 */
export async function runsWaiting(url: string): Promise<number> {
  let waiting = 0;
  for (const key of RUN_KEYS) {
    const r = await fetch(`${url}/api/v1/autonomy/reliability-context`, { headers: { authorization: `Bearer ${key}` } });
    waiting += ((await r.json()) as { tenant: { waiting: number } }).tenant.waiting;
  }
  return waiting;
}
export const waitedNote = (waiting: number) => (waiting ? ` (${waiting} runs waited in a full tenant's line: fewer jobs than requests)` : '');

/**
 * Open-loop load at a steady rate: request i leaves at start + i/rate whether or not earlier ones have
 * answered, so a slow answer shows up as latency instead of lowering the rate (autocannon's
 * overallRate sends each second's requests in a burst, which measures its own queueing).
 */
export async function paced(opts: {
  url: string;
  rate: number;
  seconds: number;
  request: () => { path: string; body: string; headers: Record<string, string> };
}): Promise<Result> {
  await pacedOnce({ ...opts, seconds: 2 }); // warm-up at the same rate
  return pacedOnce(opts);
}

async function pacedOnce(opts: {
  url: string;
  rate: number;
  seconds: number;
  request: () => { path: string; body: string; headers: Record<string, string> };
}): Promise<Result> {
  const agent = new http.Agent({ keepAlive: true, maxSockets: 64 });
  const total = Math.round(opts.rate * opts.seconds);
  const latencies: number[] = [];
  let errors = 0;
  let non2xx = 0;
  const started = performance.now();
  const one = (r: ReturnType<typeof opts.request>) =>
    new Promise<void>((resolve) => {
      const sent = performance.now();
      const req = http.request(
        `${opts.url}${r.path}`,
        { method: 'POST', agent, headers: { ...r.headers, 'content-length': Buffer.byteLength(r.body) } },
        (res) => {
          res.resume();
          res.once('end', () => {
            latencies.push(performance.now() - sent);
            if (res.statusCode! < 200 || res.statusCode! >= 300) non2xx++;
            resolve();
          });
        },
      );
      req.once('error', () => {
        errors++;
        resolve();
      });
      req.end(r.body);
    });
  const inFlight: Promise<void>[] = [];
  for (let i = 0; i < total; i++) {
    const due = started + (i * 1000) / opts.rate;
    const wait = due - performance.now();
    if (wait > 1) await new Promise((r) => setTimeout(r, wait));
    inFlight.push(one(opts.request()));
  }
  await Promise.all(inFlight);
  agent.destroy();
  const sorted = latencies.sort((a, b) => a - b);
  const at = (q: number) => Math.round((sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))] ?? NaN) * 100) / 100;
  return { rps: (latencies.length * 1000) / (performance.now() - started), p50: at(0.5), p99: at(0.99), errors, non2xx };
}
