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

export async function withTimeout<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([p, new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new Error(`${what} within ${ms} ms`)), ms)))]);
  } finally {
    clearTimeout(timer);
  }
}
