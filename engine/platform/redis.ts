// The one Redis connection factory: one server, or a Redis Cluster when REDIS_URL lists its nodes.
// BullMQ needs maxRetriesPerRequest: null on its connections.
import { randomUUID } from 'node:crypto';
import { Cluster, Redis, type RedisOptions } from 'ioredis';
import { ServiceUnavailableError } from './errors.js';
import type { Logger } from './log.js';
import { parseRedisUrl, type RedisTarget } from './redis-url.js';

export type { Redis };

function optionsOf(t: RedisTarget, extra: RedisOptions): RedisOptions {
  return {
    ...(t.username ? { username: t.username } : {}),
    ...(t.password !== undefined ? { password: t.password } : {}),
    ...(t.db !== undefined ? { db: t.db } : {}),
    ...(t.tls ? { tls: {} } : {}),
    ...extra,
  };
}

/** How a rediss: server's certificate is taken: verified (the default), or not (`insecure`: a managed Redis whose certificate is self-signed, as Heroku's). */
export type RedisTls = { insecure?: boolean };

const tlsOf = (t: RedisTarget, tls: RedisTls): RedisOptions => (t.tls && tls.insecure ? { tls: { rejectUnauthorized: false } } : {});

/**
 * A connection. On a cluster it is ioredis's Cluster, which speaks the same commands (scripts, MULTI,
 * blocking reads) as long as each command's keys share a slot: the queue prefix's hash tag sees to it.
 */
export function createRedis(url: string, name: string, extra: RedisOptions = {}, tls: RedisTls = {}): Redis {
  const t = parseRedisUrl(url);
  const options: RedisOptions = { maxRetriesPerRequest: null, connectionName: name, ...extra, ...tlsOf(t, tls) };
  // one server: ioredis reads the URL itself (every option it knows, query parameters included)
  if (!t.cluster) return new Redis(url, options);
  return new Cluster(t.nodes, { redisOptions: optionsOf(t, options) }) as unknown as Redis;
}

export const isCluster = (redis: Redis): boolean => (redis as unknown) instanceof Cluster;

/**
 * Every key matching `pattern`, each once (SCAN may name a key twice): on a cluster, from each master. By
 * SCAN, unlike KEYS, Redis is never held for its whole keyspace at once.
 */
export async function scanKeys(redis: Redis, pattern: string): Promise<string[]> {
  const servers = isCluster(redis) ? (redis as unknown as Cluster).nodes('master') : [redis];
  const out = new Set<string>();
  for (const server of servers) {
    let cursor = '0';
    do {
      const [next, keys] = await server.scan(cursor, 'MATCH', pattern, 'COUNT', 500);
      cursor = next;
      for (const key of keys) out.add(key);
    } while (cursor !== '0');
  }
  return [...out];
}

/** The names of the connections open to the Redis (each master's, on a cluster): `CLIENT LIST`. */
export async function connectionNames(redis: Redis): Promise<string[]> {
  const servers = isCluster(redis) ? (redis as unknown as Cluster).nodes('master') : [redis];
  const names: string[] = [];
  for (const server of servers)
    for (const line of String(await server.call('CLIENT', 'LIST')).split('\n')) {
      const name = / name=(\S+)/.exec(line)?.[1];
      if (name) names.push(name);
    }
  return names;
}

export class RedisUnreachableError extends Error {
  constructor(url: string, cause: unknown) {
    const safe = redactUrl(url);
    const code = String((cause as { code?: unknown } | null)?.code ?? '');
    const untrusted = /CERT|SELF_SIGNED|UNABLE_TO_VERIFY|UNABLE_TO_GET_ISSUER/.test(code);
    super(
      `Redis is not reachable at ${safe} (${(cause as Error)?.message ?? cause}). ` +
        (untrusted
          ? "Its TLS certificate is not one this machine trusts: for a managed Redis whose certificate is self-signed (Heroku's), set SERVICE_REDIS_TLS_INSECURE=1."
          : 'Start one (redis-server --daemonize yes) or set REDIS_URL to a reachable server.'),
      { cause },
    );
    this.name = 'RedisUnreachableError';
  }
}

/** Query parameters of a redis URL that may hold a secret (ioredis takes `?password=` as the password). */
const SECRET_PARAM = /pass|auth|secret|token|key/i;

/**
 * Hides a password in a redis URL (a cluster's too: `rediss://u:p@a:7000,b:7001`) before it reaches a message
 * or a log line: the one in its user info, and any query parameter that may hold one.
 */
export function redactUrl(url: string): string {
  // the user info as parseRedisUrl reads it: up to the last @ before any /, a password holding @, ? or # included
  const m = /^([a-z][a-z0-9+.-]*:\/\/)(?:([^/]*)@)?([^?#]*)(\?[^#]*)?(#.*)?$/is.exec(url.trim());
  if (!m) return '(unparseable REDIS_URL)';
  const info = m[2];
  const colon = info === undefined ? -1 : info.indexOf(':');
  const user = info === undefined ? '' : colon >= 0 ? `${info.slice(0, colon)}:***@` : `${info}@`;
  let query = m[4] ?? '';
  if (query) {
    const params = new URLSearchParams(query.slice(1));
    for (const name of [...new Set(params.keys())]) if (SECRET_PARAM.test(name)) params.set(name, '***');
    query = `?${params.toString()}`;
  }
  return `${m[1]}${user}${m[3]}${query}`;
}

/** Connects once, without retrying, and answers within `timeoutMs`: start-up must not hang on a dead Redis. */
export async function probeRedis(url: string, timeoutMs = 2000, tls: RedisTls = {}): Promise<void> {
  // one server of a cluster's list answering is enough to start: the cluster client finds the others
  const t = parseRedisUrl(url);
  const options: RedisOptions = {
    lazyConnect: true,
    connectTimeout: timeoutMs,
    retryStrategy: () => null,
    maxRetriesPerRequest: 0,
    enableOfflineQueue: false,
    ...tlsOf(t, tls),
  };
  const probe = t.cluster ? new Redis({ host: t.nodes[0]!.host, port: t.nodes[0]!.port, ...optionsOf(t, options) }) : new Redis(url, options);
  // the connection's own error says why (a certificate refused, a password): the command's says only that it closed
  let cause: Error | undefined;
  probe.on('error', (err: Error) => (cause ??= err));
  try {
    await withTimeout(
      probe.connect().then(() => probe.ping()),
      timeoutMs,
      'no answer',
    );
  } catch (err) {
    throw new RedisUnreachableError(url, cause ?? err);
  } finally {
    probe.disconnect();
  }
}

/**
 * A write Redis must take for a process to be ready (GET /readyz, a worker's /healthz): a Redis at its maxmemory
 * under noeviction, or one a failover made a replica, answers PING and INFO and refuses every write.
 */
export async function probeRedisWrite(redis: Redis, prefix: string): Promise<void> {
  await redis.set(`${prefix}:readiness`, String(process.pid), 'PX', 10_000);
}

/** What /readyz and the start-up say of Redis's settings: anything but `noeviction` can drop BullMQ's keys. */
export type RedisSettings = { maxmemory_policy: string | null; warning?: string };

/** Reads the eviction policy from INFO (CONFIG may be disabled on managed Redis); a warning unless it is `noeviction`. */
export function redisSettingsOf(info: string): RedisSettings {
  const policy = /^maxmemory_policy:(\S+)/m.exec(info)?.[1] ?? null;
  if (policy === null || policy === 'noeviction') return { maxmemory_policy: policy };
  return {
    maxmemory_policy: policy,
    warning: `maxmemory-policy is ${policy}: Redis may evict BullMQ's keys and lose jobs under memory pressure; set it to noeviction`,
  };
}

/** What `withTimeout` throws when its deadline passes first. */
export class DeadlineError extends Error {}

export async function withTimeout<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([p, new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new DeadlineError(`${what} within ${ms} ms`)), ms)))]);
  } finally {
    clearTimeout(timer);
  }
}

/** How long a request waits for Redis before it is answered without it. */
export const REDIS_DEADLINE_MS = 1500;
/** The Retry-After of a request answered 503 because Redis did not answer. */
const REDIS_RETRY_AFTER_SECONDS = 5;

/**
 * Redis work a request cannot be answered without: refused at once (503, Retry-After) while Redis is not
 * connected, and after REDIS_DEADLINE_MS when it does not answer (a Redis that is connected but stalled),
 * instead of the request waiting for Redis for as long as it is away. Work already sent may still land
 * when Redis comes back: `onLate` is given its promise to take back what it claimed.
 */
export async function redisOrUnavailable<T>(redis: Redis, what: string, work: () => Promise<T>, onLate?: (late: Promise<T>) => void): Promise<T> {
  const refused = () => new ServiceUnavailableError(`Redis is not answering (${what}); retry shortly`, REDIS_RETRY_AFTER_SECONDS);
  if (redis.status !== 'ready') throw refused();
  const p = work();
  const first = await withinDeadline(p);
  if (first !== LATE) return first;
  onLate?.(p);
  throw refused();
}

const LATE = Symbol('late');

/** `work`'s result when it settles within REDIS_DEADLINE_MS (its rejection when it rejects), else LATE; late work's rejection is left handled. */
async function withinDeadline<T>(work: Promise<T>): Promise<T | typeof LATE> {
  let timer: NodeJS.Timeout | undefined;
  const deadline = new Promise<typeof LATE>((resolve) => (timer = setTimeout(() => resolve(LATE), REDIS_DEADLINE_MS)));
  try {
    const first = await Promise.race([work, deadline]);
    if (first === LATE) work.catch(() => undefined);
    return first;
  } finally {
    clearTimeout(timer);
  }
}

/**
 * Redis work that follows a change already stored: waited for at most REDIS_DEADLINE_MS, then left to
 * complete when Redis answers (its connection keeps the command, in order). Answers its result, or null
 * when it failed or was left; never rejects: a failure, then or later, is logged with `about`.
 */
export async function afterStored<T>(work: Promise<T>, log: Pick<Logger, 'warn' | 'error'>, about: Record<string, unknown>, what: string): Promise<T | null> {
  try {
    const first = await withinDeadline(work);
    if (first !== LATE) return first;
  } catch (err) {
    log.error({ ...about, err: (err as Error).message }, `${what}: not done`);
    return null;
  }
  work.catch((err: Error) => log.error({ ...about, err: err.message }, `${what}: not done`));
  log.warn(about, `${what}: waits for Redis`);
  return null;
}

/** How often the Redis work of a change already stored is tried (untilTaken), at most this long apart: about five minutes in all. */
const RETRIES_AFTER_COMMIT = 12;
const RETRY_AFTER_COMMIT_MAX_MS = 30_000;
/** How long untilTaken may go on trying, and a little more: a stream whose last event is not in the log by then will not get it. */
export const TRIED_AFTER_COMMIT_MS = 6 * 60_000;

/**
 * Tries `work` (now, or after a first wait) until Redis takes it, with backoff, or RETRIES_AFTER_COMMIT times; never
 * rejected. For what must follow a change already stored (a transition's event, a slot's release): the change stands,
 * so its Redis half is tried again rather than reported.
 */
export async function untilTaken(
  work: () => Promise<unknown>,
  log: Pick<Logger, 'info' | 'error'>,
  about: Record<string, unknown>,
  now: boolean,
): Promise<void> {
  for (let tryNo = 1; ; tryNo++) {
    if (!now || tryNo > 1) await new Promise((r) => setTimeout(r, Math.min(RETRY_AFTER_COMMIT_MAX_MS, 500 * 2 ** tryNo)).unref());
    try {
      await work();
      if (tryNo > 1 || !now) log.info({ ...about, try: tryNo + (now ? 0 : 1) }, 'done after a retry');
      return;
    } catch (err) {
      if (tryNo >= RETRIES_AFTER_COMMIT) return void log.error({ ...about, err: (err as Error).message }, 'given up: the reconciler repairs what it can');
    }
  }
}

/** Deletes KEYS[1] while it holds ARGV[1] (a holder lets go of what is still its own). */
export const LET_GO_LUA = `if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0`;
/** Moves KEYS[1]'s lapse ARGV[2] ms on while it holds ARGV[1]: a renewal after the holder let go takes nothing again. */
export const RENEW_LUA = `if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0`;

/**
 * One process's claim on a piece of work (`key`: a seal, an assembly), lapsing `ms` after it was taken or last
 * renewed, and renewed a third of the way while the work runs: a process that dies holding it lets it go within
 * `ms`, and a long piece of work keeps it however long it takes.
 */
export function renewedClaim(redis: Redis, key: string, ms: number) {
  return {
    /** the claim's token, or null while another holds it */
    async take(): Promise<string | null> {
      const token = randomUUID();
      return (await redis.set(key, token, 'PX', ms, 'NX')) === 'OK' ? token : null;
    },
    /** runs `work` with the claim renewed */
    async holding<T>(token: string, work: () => Promise<T>): Promise<T> {
      const renew = setInterval(() => void redis.eval(RENEW_LUA, 1, key, token, ms).catch(() => undefined), Math.max(1, Math.floor(ms / 3)));
      try {
        return await work();
      } finally {
        clearInterval(renew);
      }
    },
    /** lets go of the claim, if `token` still holds it */
    release: (token: string) => redis.eval(LET_GO_LUA, 1, key, token).catch(() => undefined),
  };
}

/**
 * A place among at most ARGV[3] holders of KEYS[1] (a sorted set of holders scored by when each place lapses:
 * ARGV[2], ms), `ARGV[4]` the holder; ARGV[1] is now. Places past their time are dropped first (their holder
 * died); a holder that has one already keeps it, its time moved on. 1 when taken, 0 when every place is held.
 * Notifications' tries and gates in flight per tenant.
 */
export const TAKE_PLACE_LUA = `redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
if redis.call('ZSCORE', KEYS[1], ARGV[4]) == false and redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then return 0 end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[4])
redis.call('PEXPIREAT', KEYS[1], ARGV[2])
return 1`;

/**
 * `member`'s place among at most `max` holders of `key` (TAKE_PLACE_LUA), lapsing `ms` after it was taken or last
 * renewed: a tenant's gates or audit phases running at once over every worker process. `take` renews one held.
 */
export function placeAmong(redis: Redis, key: string, member: string, max: number, ms: number) {
  const take = async () => {
    const now = Date.now();
    return (await redis.eval(TAKE_PLACE_LUA, 1, key, now, now + ms, max, member)) === 1;
  };
  return {
    take,
    /** renews it (a timer's call: a failure waits for the next) */
    renew: () => void take().catch(() => undefined),
    give: () => redis.zrem(key, member).catch(() => undefined),
  };
}
