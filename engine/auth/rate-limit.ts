// API rate limits: a budget per tenant (every key and session of it together) and one per key, each a
// fixed window of a minute counted in Redis by rate-limiter-flexible, so every web process shares it.
// When Redis is not connected or does not answer within 100 ms, an in-memory count per process stands in
// rather than refusing everyone or holding the request.
import { RateLimiterMemory, RateLimiterRedis, RateLimiterRes } from 'rate-limiter-flexible';
import { RateLimitedError, withTimeout, type Queues, type Redis } from '../platform/index.js';

export type ApiRateLimitSettings = { perTenantPerMinute: number; perKeyPerMinute: number };

/** One budget's state after a request: for the RateLimit and RateLimit-Policy headers. */
export type RateLimitState = { policy: 'tenant' | 'key'; limit: number; remaining: number; resetSeconds: number };

const WINDOW_SECONDS = 60;
/** How long a request waits for Redis's count before its process counts alone (Redis answers in well under a millisecond). */
const REDIS_ANSWER_MS = 100;
/** After Redis stalled, how long the process counts alone before it asks Redis again. */
const STALL_PAUSE_MS = 5_000;

export function apiRateLimitOf(deps: { redis: Redis; queues: Queues }, settings: ApiRateLimitSettings) {
  let stalledUntil = 0;
  const budget = (policy: 'tenant' | 'key', limit: number) => {
    const local = new RateLimiterMemory({ points: limit, duration: WINDOW_SECONDS });
    const shared = new RateLimiterRedis({
      storeClient: deps.redis,
      keyPrefix: `${deps.queues.prefix}:api-rate:${policy}`,
      points: limit,
      duration: WINDOW_SECONDS,
      // a Redis that is not connected leaves each process to count on its own, at once
      rejectIfRedisNotReady: true,
      insuranceLimiter: local,
    });
    /**
     * Redis's count, or this process's own when Redis does not answer in time (connected but stalled);
     * after a stall the process counts alone for a while instead of making every request wait again.
     */
    const consume = (key: string): Promise<RateLimiterRes> => {
      if (Date.now() < stalledUntil) return local.consume(key);
      return withTimeout(shared.consume(key), REDIS_ANSWER_MS, 'the rate limit count').catch((err: unknown) => {
        if (err instanceof RateLimiterRes) throw err;
        stalledUntil = Date.now() + STALL_PAUSE_MS;
        return local.consume(key);
      });
    };
    return { policy, limit, consume };
  };
  const budgets = [budget('tenant', settings.perTenantPerMinute), budget('key', settings.perKeyPerMinute)];

  return {
    /** The policies, as the RateLimit-Policy header names them. */
    policies: budgets.map((b) => ({ policy: b.policy, limit: b.limit, windowSeconds: WINDOW_SECONDS })),

    /**
     * Counts one request of the tenant (and of its key, when it came with one). Answers the budget
     * nearest to its end; throws RateLimitedError, carrying that budget, when one is spent.
     */
    async consume(tenantId: string, keyId: string | null): Promise<RateLimitState> {
      const asked = budgets.filter((b) => b.policy === 'tenant' || keyId);
      const settled = await Promise.allSettled(asked.map((b) => b.consume(b.policy === 'tenant' ? tenantId : keyId!)));
      const states: (RateLimitState & { refused: boolean })[] = [];
      settled.forEach((s, i) => {
        const b = asked[i]!;
        const res = s.status === 'fulfilled' ? s.value : s.reason;
        if (!(res instanceof RateLimiterRes)) throw res as Error;
        states.push({
          policy: b.policy,
          limit: b.limit,
          remaining: res.remainingPoints,
          resetSeconds: Math.max(1, Math.ceil(res.msBeforeNext / 1000)),
          refused: s.status === 'rejected',
        });
      });
      const refused = states.find((s) => s.refused);
      if (refused) throw new ApiRateLimitedError(refused);
      const { refused: _r, ...nearest } = states.reduce((a, b) => (b.remaining < a.remaining ? b : a));
      return nearest;
    },
  };
}

export type ApiRateLimit = ReturnType<typeof apiRateLimitOf>;

/** 429, with the budget that was spent (its window's end is the Retry-After). */
export class ApiRateLimitedError extends RateLimitedError {
  constructor(readonly state: RateLimitState) {
    super(
      `over the ${state.policy === 'tenant' ? "tenant's" : "key's"} ${state.limit} requests a minute; retry in ${state.resetSeconds} s`,
      state.resetSeconds,
    );
  }
}
