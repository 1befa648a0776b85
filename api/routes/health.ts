// Liveness and readiness, unauthenticated. Readiness asks Redis and the store, each with a deadline.
import { Router } from 'express';
import { redisSettingsOf, withTimeout, type Redis, type RedisSettings } from '../../engine/platform/index.js';
import type { Store } from '../../engine/store/index.js';

type Check = { ok: boolean; latency_ms: number; error?: string };

async function check(probe: () => Promise<unknown>): Promise<Check> {
  const started = performance.now();
  try {
    await withTimeout(probe(), 1000, 'no answer');
    return { ok: true, latency_ms: Math.round((performance.now() - started) * 100) / 100 };
  } catch (err) {
    return { ok: false, latency_ms: Math.round(performance.now() - started), error: (err as Error).message };
  }
}

/** What /readyz says of the tool sandbox: a service that runs tools unsandboxed says so. */
export type SandboxReport = { kind: string; process_limit: string; memory_limit: string; warning?: string };

export function healthRouter(deps: { redis: Redis; store: Store; sandbox: SandboxReport }): Router {
  const router = Router();
  router.get('/healthz', (_req, res) => {
    res.json({ status: 'ok' });
  });
  router.get('/readyz', async (_req, res) => {
    // INFO answers as PING does, and says whether Redis may evict keys
    let settings: RedisSettings | undefined;
    const [redis, store] = await Promise.all([
      check(async () => (settings = redisSettingsOf(await deps.redis.info('memory')))),
      check(() => deps.store.ping()),
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
