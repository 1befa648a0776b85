// Starts the real service for a test: app on an ephemeral port, in-process workers, real Redis with
// a unique SERVICE_QUEUE_PREFIX, a fresh SQLite file. close() closes every connection and removes
// what the test left in Redis and on disk.
import { spawnSync } from 'node:child_process';
import { randomBytes, randomInt } from 'node:crypto';
import { mkdirSync } from 'node:fs';
import fs from 'node:fs/promises';
import os from 'node:os';
import net from 'node:net';
import path from 'node:path';
import { Writable } from 'node:stream';
import { Redis } from 'ioredis';
import { startWebServer, type WebServer } from '../../api/server.js';
import { parseEnv, type Config } from '../../config/env.js';
import { createLogger } from '../../engine/platform/log.js';
import { scanKeys } from '../../engine/platform/redis.js';
import { openRuntime, type Runtime, type RuntimeOptions } from '../../engine/process/runtime.js';
import { startWorkers, type Workers } from '../../workers/index.js';

/** The tests' Redis, read when used: spec files load before test/support/global-redis.ts may set REDIS_URL. */
export function testRedisUrl(): string {
  return process.env.REDIS_URL || 'redis://127.0.0.1:6379';
}

export const KEYS = {
  a: 'key-tenant-a-0123456789abcdef',
  b: 'key-tenant-b-0123456789abcdef',
  admin: 'admin-key-0123456789abcdef',
};

export type Reply<T = any> = { status: number; headers: Headers; body: T; text: string };

export type CallOptions = { key?: string | null; body?: unknown; raw?: string | Buffer; headers?: Record<string, string> };

export type Harness = {
  url: string;
  config: Config;
  /** SERVICE_WORKSPACE_ROOT of this harness: a fresh folder */
  workspace: string;
  /** a tenant's own workspace root (SERVICE_WORKSPACE_ROOT/<tenant>), made on first call */
  tenantDir(tenant?: string): string;
  rt: Runtime;
  web: WebServer;
  workers: Workers;
  /** every log line the service wrote, as text */
  logs: string[];
  call<T = any>(method: string, path: string, opts?: CallOptions): Promise<Reply<T>>;
  close(): Promise<void>;
};

/** The environment of another process of the same deployment as `h`: its store, workspaces and queues. */
export function sameDeployment(h: Pick<Harness, 'config' | 'workspace'>): Record<string, string> {
  return { SERVICE_DATA_DIR: h.config.dataDir, SERVICE_WORKSPACE_ROOT: h.workspace, SERVICE_QUEUE_PREFIX: h.config.queuePrefix };
}

export function uniquePrefix(): string {
  return `test-${randomBytes(6).toString('hex')}`;
}

export async function startHarness(
  opts: { env?: Record<string, string>; runtime?: RuntimeOptions; workers?: boolean; /** the web server's port (default: any free one) */ port?: number } = {},
): Promise<Harness> {
  const dataDir = await fs.mkdtemp(path.join(os.tmpdir(), 'svc-test-'));
  const workspace = path.join(dataDir, 'workspace');
  await fs.mkdir(workspace);
  const config = parseEnv({
    REDIS_URL: testRedisUrl(),
    SERVICE_QUEUE_PREFIX: uniquePrefix(),
    SERVICE_DATA_DIR: dataDir,
    SERVICE_API_KEYS: `tenant-a:${KEYS.a},tenant-b:${KEYS.b}`,
    SERVICE_ADMIN_KEYS: KEYS.admin,
    LOG_LEVEL: 'info',
    SERVICE_WORKSPACE_ROOT: workspace,
    SERVICE_SSE_HEARTBEAT_SECONDS: '1',
    // tests poll fast; the rate-limit test sets its own
    SERVICE_API_RATE_LIMIT_PER_MINUTE: '1000000',
    ...opts.env,
  });
  const logs: string[] = [];
  const sink = new Writable({
    write(chunk, _enc, done) {
      logs.push(String(chunk));
      done();
    },
  });
  const log = createLogger(config.logLevel, sink);
  const rt = await openRuntime(config, log, { servesApi: true, ...opts.runtime });
  const workers = opts.workers === false ? { workers: [], close: async () => {} } : await startWorkers(rt);
  const web = await startWebServer(rt, { port: opts.port ?? 0, host: '127.0.0.1', validateResponses: true });

  async function call<T>(method: string, p: string, o: CallOptions = {}): Promise<Reply<T>> {
    const headers: Record<string, string> = { ...o.headers };
    const key = o.key === undefined ? KEYS.a : o.key;
    if (key) headers.authorization ??= `Bearer ${key}`;
    let body: string | Buffer | undefined = o.raw;
    if (o.body !== undefined) {
      body = JSON.stringify(o.body);
      headers['content-type'] ??= 'application/json';
    }
    // undici says only "fetch failed": its cause (a refused or reset connection, and why) goes in the message
    const res = await fetch(`${web.url}${p}`, { method, headers, body }).catch((err: Error & { cause?: { code?: string; message?: string } }) => {
      throw new Error(`${method} ${p}: ${err.message}: ${err.cause?.code ?? ''} ${err.cause?.message ?? ''}`, { cause: err });
    });
    const text = await res.text();
    let parsed: unknown = text;
    try {
      parsed = text ? JSON.parse(text) : undefined;
    } catch {
      // not JSON: keep the text
    }
    return { status: res.status, headers: res.headers, body: parsed as T, text };
  }

  return {
    url: web.url,
    config,
    workspace: config.workspaceRoot,
    tenantDir(tenant = 'tenant-a') {
      const dir = config.auth === 'none' ? config.workspaceRoot : path.join(config.workspaceRoot, tenant);
      mkdirSync(dir, { recursive: true });
      return dir;
    },
    rt,
    web,
    workers,
    logs,
    call,
    async close() {
      await web.close();
      await workers.close();
      await rt.close();
      await deleteRedisPrefix(config.queuePrefix);
      await fs.rm(dataDir, { recursive: true, force: true });
    },
  };
}

/**
 * Polls until `check` answers truthy; fails with `what` after `ms`. The default is a bound on waiting, not
 * on speed (a test that holds something to a time checks the time itself): it leaves room for a CI machine
 * where three spec files share two cores, on which work of a second alone has taken over ten.
 */
/** What opening a runtime with `config` throws (a start refused), or null when it opened (it is closed again). */
export function refusalToOpen(config: Config): Promise<unknown> {
  return openRuntime(config, createLogger('silent')).then(
    async (rt) => {
      await rt.close();
      return null;
    },
    (e: unknown) => e,
  );
}

export async function eventually<T>(check: () => Promise<T> | T, what: string, ms = 20_000): Promise<NonNullable<T>> {
  const until = Date.now() + ms;
  for (;;) {
    const value = await check();
    if (value) return value as NonNullable<T>;
    if (Date.now() > until) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 25));
  }
}

/**
 * Holds the first `n` calls of an async method of `target` until all `n` have their answers, then lets
 * them go on together: requests made at once then all read before any of them writes, the window a race
 * needs, open every time rather than when the event loop happens to interleave them. Returns the undo.
 */
export function heldTogether<T extends object, K extends keyof T>(target: T, key: K, n: number): () => void {
  const original = target[key] as (...args: unknown[]) => Promise<unknown>;
  const waiting: (() => void)[] = [];
  const together = () =>
    new Promise<void>((resolve) => {
      waiting.push(resolve);
      if (waiting.length === n) for (const go of waiting) go();
    });
  target[key] = (async (...args: unknown[]) => {
    const answer = await original.apply(target, args);
    if (waiting.length < n) await together();
    return answer;
  }) as T[K];
  return () => {
    target[key] = original as T[K];
  };
}

const TERMINAL_STATUSES = ['succeeded', 'failed', 'canceled', 'timed_out'];

/** The run once it has finished, read through the API. */
export async function finishedRun(h: Harness, id: string, key = KEYS.a): Promise<Record<string, any>> {
  return eventually(
    async () => {
      const r = (await h.call<Record<string, any>>('GET', `/api/v1/runs/${id}`, { key })).body;
      return TERMINAL_STATUSES.includes(r.status) ? r : null;
    },
    `run ${id} to finish`,
    20_000,
  );
}

/** The keys matching a pattern, by SCAN: KEYS would hold the Redis every parallel spec file shares. */
export { scanKeys };

/**
 * A step that runs until the test lets it end: `command` waits for a file `name` in the step's folder (a
 * tenant's workspace), which `release` makes and `clear` removes. For a test that must act while a step
 * still runs: a step that slept a fixed time could end first on a busy machine.
 */
export function releasable(h: Pick<Harness, 'tenantDir'>, name: string) {
  const file = (tenant?: string) => path.join(h.tenantDir(tenant), name);
  return {
    command: `until [ -e ${name} ]; do sleep 0.05; done`,
    release: (tenant?: string) => fs.writeFile(file(tenant), ''),
    clear: (tenant?: string) => fs.rm(file(tenant), { force: true }),
  };
}

export async function deleteRedisPrefix(prefix: string): Promise<void> {
  const redis = new Redis(testRedisUrl());
  try {
    const keys = await scanKeys(redis, `${prefix}:*`);
    for (let i = 0; i < keys.length; i += 500) await redis.del(...keys.slice(i, i + 500));
  } finally {
    redis.disconnect();
  }
}

/**
 * A loopback port free now, for a private server a test starts on a port chosen in advance. It is drawn
 * below the kernel's ephemeral range (32768-60999 here), where no server listening on port 0 and no
 * client socket of another test file running alongside can take it between this check and the server's
 * start; `alsoFree` offsets must be free too (a Redis Cluster node's bus listens at port + 10000).
 */
export async function freePort(alsoFree: number[] = []): Promise<number> {
  for (;;) {
    const port = 12000 + randomInt(10000);
    if (handedOut.has(port)) continue;
    const free = await Promise.all([port, ...alsoFree.map((o) => port + o)].map(canListen));
    if (free.every(Boolean)) return (handedOut.add(port), port);
  }
}
/** ports this process handed out already: a test may ask for several before it starts anything on them */
const handedOut = new Set<number>();

function canListen(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const srv = net.createServer();
    srv.once('error', () => resolve(false));
    srv.listen(port, '127.0.0.1', () => srv.close(() => resolve(true)));
  });
}

/** True when something accepts connections on the loopback port (a server a test started). */
export function listening(port: number): Promise<boolean> {
  return new Promise<boolean>((resolve) => {
    const s = net.connect(port, '127.0.0.1', () => (s.end(), resolve(true)));
    s.on('error', () => resolve(false));
  });
}

/** How many processes of this machine have a command line containing `text` (pgrep -f). */
export function processesMatching(text: string): number {
  const out = spawnSync('pgrep', ['-f', '--', text], { encoding: 'utf8' });
  return out.stdout.split('\n').filter((l) => l.trim() && Number(l) !== process.pid).length;
}
