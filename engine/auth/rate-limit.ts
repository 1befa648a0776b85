// API rate limits: a budget per tenant (every key and session of it together) and one per key, each a
// fixed window of a minute counted in Redis, so every web process shares it. The count is an operation
// of the engine's Redis batch: the requests of one turn of the event loop, both their budgets, take one
// round trip. When Redis is not connected or does not answer within 100 ms, an in-memory count per
// process stands in rather than refusing everyone or holding the request; it counts on from the count
// Redis last gave for the budget's window, so a budget Redis said was spent stays spent. A refused
// request counts in neither budget.
import { setImmediate as nextTurn } from 'node:timers/promises';
import { RateLimitedError, redisBatch, type Queues, type Redis } from '../platform/index.js';

export type ApiRateLimitSettings = { perTenantPerMinute: number; perKeyPerMinute: number };

/** One budget's state after a request: for the RateLimit and RateLimit-Policy headers. */
export type RateLimitState = { policy: 'tenant' | 'key'; limit: number; remaining: number; resetSeconds: number };

const WINDOW_SECONDS = 60;
/** How long a request waits for Redis's count, from its sending, before its process counts alone (Redis answers in well under a millisecond). */
const REDIS_ANSWER_MS = 100;
/** After Redis stalled, how long the process counts alone before it asks Redis again. */
const STALL_PAUSE_MS = 5_000;
/** Past this many windows counted in memory, the ended ones are dropped. */
const LOCAL_WINDOWS_MAX = 10_000;

/**
 * One request against its budgets (the tenant's, then its key's when ARGV[3] > 0): counted in both when
 * neither is spent, and in neither when one is, so a key retrying after its 429s spends nothing of what
 * its tenant's other keys have left. Answers which budget refused it (0 for none, 1 the tenant's, 2 the
 * key's) and each budget's count and milliseconds left in its window.
 */
const COUNT = `local window = tonumber(ARGV[1])
local limits = { tonumber(ARGV[2]), tonumber(ARGV[3]) }
local budgets = limits[2] > 0 and 2 or 1
local n, ttl, refused = { 0, 0 }, { window, window }, 0
for i = 1, budgets do
  n[i] = tonumber(redis.call('GET', KEYS[i]) or '0')
  if refused == 0 and n[i] >= limits[i] then refused = i end
end
for i = 1, budgets do
  if refused == 0 then n[i] = redis.call('INCR', KEYS[i]) end
  local left = redis.call('PTTL', KEYS[i])
  if left < 0 then
    if refused == 0 then redis.call('PEXPIRE', KEYS[i], window) end
  else
    ttl[i] = left
  end
end
return { refused, n[1], ttl[1], n[2], ttl[2] }`;

type Budget = { policy: 'tenant' | 'key'; limit: number };

const LATE = Symbol('late');

/**
 * Redis's answer, or LATE when it has not come REDIS_ANSWER_MS after the batch sent it. A timer measures
 * the event loop as much as Redis: on a process busy for longer than the deadline, the timer fires in
 * the loop's timers phase before its poll phase reads a reply already in the socket. So the deadline
 * starts once the batch has sent the call (it sends from setImmediate), and when it passes, the reply is
 * given one more turn of the loop (its poll phase) before it is given up.
 */
async function answerInTime<T>(answer: Promise<T>): Promise<T | typeof LATE> {
  let settled = false;
  answer.then(
    () => (settled = true),
    () => (settled = true),
  );
  await nextTurn(); // after the batch's own setImmediate: the call is sent
  if (!settled) {
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([answer.catch(() => undefined), new Promise((resolve) => (timer = setTimeout(resolve, REDIS_ANSWER_MS)))]);
    clearTimeout(timer);
  }
  if (!settled) await nextTurn(); // the poll phase of one more turn reads what Redis sent while the loop was busy
  if (settled) return answer;
  answer.catch(() => undefined);
  return LATE;
}

export function apiRateLimitOf(deps: { redis: Redis; queues: Queues }, settings: ApiRateLimitSettings) {
  let stalledUntil = 0;
  const batch = redisBatch(deps.redis);
  batch.define('rate.count', { keys: 2, args: 3, lua: COUNT });
  const tenant: Budget = { policy: 'tenant', limit: settings.perTenantPerMinute };
  const key: Budget = { policy: 'key', limit: settings.perKeyPerMinute };
  const keyOf = (b: Budget, id: string) => `${deps.queues.prefix}:api-rate:${b.policy}:${id}`;
  /**
   * This process's own counts, while Redis is not connected or stalled: the same rule as COUNT. Each of
   * Redis's answers leaves its count here, so a window counted alone goes on from what Redis last said
   * of it (a budget Redis said was spent is not started again from 0).
   */
  const local = new Map<string, { n: number; resetAt: number }>();
  let droppedAt = 0;
  /** Past LOCAL_WINDOWS_MAX windows, drops the ended ones, at most once a second (every answer passes here). */
  const dropEnded = (now: number) => {
    if (local.size <= LOCAL_WINDOWS_MAX || now - droppedAt < 1000) return;
    droppedAt = now;
    for (const [name, w] of local) if (w.resetAt <= now) local.delete(name);
  };
  const countLocally = (asked: [Budget, string][]): Count => {
    const now = Date.now();
    const windows = asked.map(([b, id]) => {
      const name = keyOf(b, id);
      let w = local.get(name);
      if (!w || w.resetAt <= now) local.set(name, (w = { n: 0, resetAt: now + WINDOW_SECONDS * 1000 }));
      return w;
    });
    const refused = windows.findIndex((w, i) => w.n >= asked[i]![0].limit) + 1;
    if (!refused) for (const w of windows) w.n++;
    dropEnded(now);
    return { refused, counts: windows.map((w) => ({ n: w.n, ms: w.resetAt - now })) };
  };
  type Count = { refused: number; counts: { n: number; ms: number }[] };
  const countShared = async (asked: [Budget, string][]): Promise<Count> => {
    const names = asked.map(([b, id]) => keyOf(b, id));
    const [refused, n1, ms1, n2, ms2] = await batch.call<number[]>(
      'rate.count',
      [names[0]!, names[1] ?? names[0]!],
      [WINDOW_SECONDS * 1000, asked[0]![0].limit, asked[1]?.[0].limit ?? 0],
    );
    const counts = [
      { n: n1!, ms: ms1! },
      { n: n2!, ms: ms2! },
    ].slice(0, asked.length);
    const now = Date.now();
    counts.forEach(({ n, ms }, i) => local.set(names[i]!, { n, resetAt: now + ms }));
    dropEnded(now);
    return { refused: refused!, counts };
  };
  /**
   * Redis's count, or this process's own when Redis is not connected, or does not answer in time
   * (connected but stalled): after a stall the process counts alone for a while instead of making
   * every request wait again.
   */
  const count = async (asked: [Budget, string][]): Promise<Count> => {
    if (Date.now() < stalledUntil || deps.redis.status !== 'ready') return countLocally(asked);
    let shared: Count | typeof LATE = LATE;
    try {
      shared = await answerInTime(countShared(asked));
    } catch {
      // an error (the connection lost) pauses asking Redis as a silence does
    }
    if (shared !== LATE) return shared;
    stalledUntil = Date.now() + STALL_PAUSE_MS;
    return countLocally(asked);
  };

  return {
    /** The policies, as the RateLimit-Policy header names them. */
    policies: [tenant, key].map((b) => ({ policy: b.policy, limit: b.limit, windowSeconds: WINDOW_SECONDS })),

    /**
     * Counts one request of the tenant (and of its key, when it came with one), in neither budget when
     * one is spent. Answers the budget nearest to its end; throws RateLimitedError, carrying the budget
     * that refused it, when one is spent.
     */
    async consume(tenantId: string, keyId: string | null): Promise<RateLimitState> {
      const asked: [Budget, string][] = [[tenant, tenantId], ...(keyId ? [[key, keyId] as [Budget, string]] : [])];
      const { refused, counts } = await count(asked);
      const states = counts.map(({ n, ms }, i): RateLimitState => {
        const b = asked[i]![0];
        return { policy: b.policy, limit: b.limit, remaining: Math.max(0, b.limit - n), resetSeconds: Math.max(1, Math.ceil(ms / 1000)) };
      });
      if (refused) throw new ApiRateLimitedError(states[refused - 1]!);
      return states.reduce((a, b) => (b.remaining < a.remaining ? b : a));
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
