// Liveness and readiness, unauthenticated. Readiness writes to Redis and the store, each with a deadline.
import { Router } from 'express';
import { DeadlineError, probeRedisWrite, redisSettingsOf, withTimeout, type Logger, type Redis, type RedisSettings } from '../../engine/platform/index.js';
import { assertStoreIsOurs, type Store } from '../../engine/store/index.js';

type Check = { ok: boolean; latency_ms: number; error?: string };

const NO_ANSWER = 'no answer within 1 s';

/** A check of one dependency; a failure says why in short, the whole error going to the log. */
async function check(name: string, probe: () => Promise<unknown>, log: Logger): Promise<Check> {
  const started = performance.now();
  try {
    await withTimeout(probe(), 1000, 'no answer');
    return { ok: true, latency_ms: Math.round((performance.now() - started) * 100) / 100 };
  } catch (err) {
    const e = err as Error & { code?: unknown };
    log.warn({ check: name, err: e.message }, 'readiness check failed');
    const code = typeof e.code === 'string' && /^[A-Z][A-Z0-9_]{1,40}$/.test(e.code) ? e.code : null;
    const error = e instanceof DeadlineError ? NO_ANSWER : (code ?? (e.name !== 'Error' ? e.name : 'failed; the log says why'));
    return { ok: false, latency_ms: Math.round(performance.now() - started), error };
  }
}

/** What /readyz says of the tool sandbox: a service that runs tools unsandboxed says so. */
export type SandboxReport = { kind: string; process_limit: string; memory_limit: string; warning?: string };

export function healthRouter(deps: { redis: Redis; queuePrefix: string; store: Store; sandbox: SandboxReport; log: Logger }): Router {
  const router = Router();
  router.get('/healthz', (_req, res) => {
    res.json({ status: 'ok' });
  });
  router.get('/readyz', async (_req, res) => {
    // each takes a write, as the service's requests need (a Redis or a store that answers but takes none is
    // not ready); INFO says whether Redis may evict keys
    let settings: RedisSettings | undefined;
    const [redis, store] = await Promise.all([
      check(
        'redis',
        async () => {
          await probeRedisWrite(deps.redis, deps.queuePrefix);
          settings = redisSettingsOf(await deps.redis.info('memory'));
        },
        deps.log,
      ),
      check(
        'store',
        async () => {
          await deps.store.ping();
          await assertStoreIsOurs(deps.store, deps.queuePrefix);
        },
        deps.log,
      ),
    ]);
    const ready = redis.ok && store.ok;
    res.status(ready ? 200 : 503).json({
      status: ready ? 'ready' : 'unavailable',
      checks: { redis, store },
      sandbox: deps.sandbox,
      ...(settings ? { redis: settings } : {}),
    });
  });
  return router;
}
