// API rate limits: a budget per tenant (every key and session of it together) and one per key, each a
// fixed window of a minute counted in Redis, so every web process shares it. The count is an operation
// of the engine's Redis batch: the requests of one turn of the event loop, both their budgets, take one
// round trip. When Redis is not connected or does not answer within 100 ms, an in-memory count per
// process (rate-limiter-flexible's) stands in rather than refusing everyone or holding the request.
import { RateLimiterMemory, RateLimiterRes } from 'rate-limiter-flexible';
import { RateLimitedError, redisBatch, withTimeout, type Queues, type Redis } from '../platform/index.js';

export type ApiRateLimitSettings = { perTenantPerMinute: number; perKeyPerMinute: number };

/** One budget's state after a request: for the RateLimit and RateLimit-Policy headers. */
export type RateLimitState = { policy: 'tenant' | 'key'; limit: number; remaining: number; resetSeconds: number };

const WINDOW_SECONDS = 60;
/** How long a request waits for Redis's count before its process counts alone (Redis answers in well under a millisecond). */
const REDIS_ANSWER_MS = 100;
/** After Redis stalled, how long the process counts alone before it asks Redis again. */
const STALL_PAUSE_MS = 5_000;

/** One request against a window: its count, and the milliseconds the window has left. */
const COUNT = `local n = redis.call('INCR', KEYS[1])
local ttl = redis.call('PTTL', KEYS[1])
if ttl < 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
  ttl = tonumber(ARGV[1])
end
return { n, ttl }`;

export function apiRateLimitOf(deps: { redis: Redis; queues: Queues }, settings: ApiRateLimitSettings) {
  let stalledUntil = 0;
  const batch = redisBatch(deps.redis);
  batch.define('rate.count', { keys: 1, args: 1, lua: COUNT });
  const budget = (policy: 'tenant' | 'key', limit: number) => {
    const local = new RateLimiterMemory({ points: limit, duration: WINDOW_SECONDS });
    const keyPrefix = `${deps.queues.prefix}:api-rate:${policy}:`;
    /** Redis's count, in rate-limiter-flexible's terms: refused (thrown) once the window holds more than the limit. */
    const shared = async (key: string): Promise<RateLimiterRes> => {
      const [consumed, msBeforeNext] = await batch.call<[number, number]>('rate.count', [keyPrefix + key], [WINDOW_SECONDS * 1000]);
      const res = new RateLimiterRes(Math.max(0, limit - consumed), msBeforeNext, consumed, consumed === 1);
      if (consumed > limit) throw res;
      return res;
    };
    /**
     * Redis's count, or this process's own when Redis is not connected, or does not answer in time
     * (connected but stalled): after a stall the process counts alone for a while instead of making
     * every request wait again.
     */
    const consume = (key: string): Promise<RateLimiterRes> => {
      if (Date.now() < stalledUntil || deps.redis.status !== 'ready') return local.consume(key);
      return withTimeout(shared(key), REDIS_ANSWER_MS, 'the rate limit count').catch((err: unknown) => {
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
