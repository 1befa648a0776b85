// The one Redis connection factory. BullMQ needs maxRetriesPerRequest: null on its connections.
import { Redis, type RedisOptions } from 'ioredis';

export type { Redis };

export function createRedis(url: string, name: string, extra: RedisOptions = {}): Redis {
  return new Redis(url, { maxRetriesPerRequest: null, connectionName: name, ...extra });
}

export class RedisUnreachableError extends Error {
  constructor(url: string, cause: unknown) {
    const safe = redactUrl(url);
    super(
      `Redis is not reachable at ${safe} (${(cause as Error)?.message ?? cause}). ` +
        'Start one (redis-server --daemonize yes) or set REDIS_URL to a reachable server.',
      { cause },
    );
    this.name = 'RedisUnreachableError';
  }
}

/** Hides a password in a redis URL before it reaches a message or a log line. */
export function redactUrl(url: string): string {
  try {
    const u = new URL(url);
    if (u.password) u.password = '***';
    return u.toString();
  } catch {
    return '(unparseable REDIS_URL)';
  }
}

/** Connects once, without retrying, and answers within `timeoutMs`: start-up must not hang on a dead Redis. */
export async function probeRedis(url: string, timeoutMs = 2000): Promise<void> {
  const probe = new Redis(url, { lazyConnect: true, connectTimeout: timeoutMs, retryStrategy: () => null, maxRetriesPerRequest: 0, enableOfflineQueue: false });
  probe.on('error', () => {}); // reported through the rejected promise below
  try {
    await withTimeout(
      probe.connect().then(() => probe.ping()),
      timeoutMs,
      'no answer',
    );
  } catch (err) {
    throw new RedisUnreachableError(url, err);
  } finally {
    probe.disconnect();
  }
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

export async function withTimeout<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([p, new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new Error(`${what} within ${ms} ms`)), ms)))]);
  } finally {
    clearTimeout(timer);
  }
}
