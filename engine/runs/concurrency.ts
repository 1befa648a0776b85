// Per-tenant concurrency on Redis (open-source BullMQ has no groups). A tenant's admitted runs are a
// set; the rest wait in the tenant's own line and hold no worker slot, so one tenant's backlog never
// sits in front of another tenant's runs. Sets, not counters: a replayed release cannot free twice.
//
// The line is a sorted set scored by place (the last place + 1), so first come, first served, and every
// operation on it is O(log n) whatever the backlog: a list needed a scan of the whole line to see whether
// a run was in it already and to take a run out of it (LPOS, LREM), at each admission and release once a
// tenant had a backlog (run creation spent 73 µs of Redis CPU a request in LPOS with 20,000 runs waiting).
import { redisBatch, scanKeys, type Redis } from '../platform/index.js';

/** A line kept as a list (until 2026-11-24) becomes a sorted set in the same order, in place. */
const LINE = `
if redis.call('TYPE', KEYS[2]).ok == 'list' then
  local ids = redis.call('LRANGE', KEYS[2], 0, -1)
  redis.call('DEL', KEYS[2])
  for i, id in ipairs(ids) do redis.call('ZADD', KEYS[2], 'NX', i, id) end
end`;

// ARGV[3] '1': the run's job exists already, delayed (a run held at its start): once admitted from the line
// its job is promoted, not added (KEYS[3], the tenant's parked runs). Answers -1 when the run is admitted,
// else how many runs wait in line, the run included. Every way out leaves the tenant holding a slot or a
// place, so the tenant (ARGV[4]) is in the list of tenants that do (KEYS[4]).
const ADMIT = `${LINE}
redis.call('SADD', KEYS[4], ARGV[4])
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 1 then return -1 end
if redis.call('SCARD', KEYS[1]) < tonumber(ARGV[2]) and redis.call('ZCARD', KEYS[2]) == 0 then
  redis.call('SADD', KEYS[1], ARGV[1])
  return -1
end
if not redis.call('ZSCORE', KEYS[2], ARGV[1]) then
  local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
  redis.call('ZADD', KEYS[2], (tonumber(last[2]) or 0) + 1, ARGV[1])
end
if ARGV[3] == '1' then redis.call('SADD', KEYS[3], ARGV[1]) end
return redis.call('ZCARD', KEYS[2])`;

/** Takes `tenant` out of the list of tenants holding slots (KEYS[4]) once it holds none and waits for none. */
const FORGET_IF_EMPTY = `
if redis.call('SCARD', KEYS[1]) == 0 and redis.call('ZCARD', KEYS[2]) == 0 and redis.call('SCARD', KEYS[3]) == 0 then
  redis.call('SREM', KEYS[4], tenant)
end`;

// Answers {admitted, parked, waiting}: the runs admitted in the freed places, those whose jobs are to be
// added and those whose jobs wait, delayed, to be promoted; and how many runs still wait in line. ARGV[3]: the tenant.
const RELEASE = `${LINE}
redis.call('SREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('SREM', KEYS[3], ARGV[1])
local admitted, parked = {}, {}
while redis.call('SCARD', KEYS[1]) < tonumber(ARGV[2]) do
  local first = redis.call('ZPOPMIN', KEYS[2])
  if not first[1] then break end
  redis.call('SADD', KEYS[1], first[1])
  if redis.call('SREM', KEYS[3], first[1]) == 1 then table.insert(parked, first[1]) else table.insert(admitted, first[1]) end
end
local tenant = ARGV[3]
${FORGET_IF_EMPTY}
return {admitted, parked, redis.call('ZCARD', KEYS[2])}`;

/** The runs waiting in line, first first. */
const IN_LINE = `${LINE}
return redis.call('ZRANGE', KEYS[2], 0, -1)`;

/** How many runs wait in line. */
const WAITING = `${LINE}
return redis.call('ZCARD', KEYS[2])`;

export type TenantSlots = {
  /**
   * true: the run may go to the queue now; false: it waits in the tenant's list. `parked`: its job exists,
   * delayed (a run held at its start), to be promoted once the run is admitted from the line.
   */
  admit(tenantId: string, runId: string, parked?: boolean): Promise<boolean>;
  /** frees the run's slot (or its place in line) and returns the runs admitted in its place: whose jobs to add, and whose to promote */
  release(tenantId: string, runId: string): Promise<{ admitted: string[]; parked: string[] }>;
  running(tenantId: string): Promise<number>;
  waiting(tenantId: string): Promise<number>;
  /**
   * false when the tenant's line holds `maxWaiting` runs or more. Asks Redis only when this process last
   * saw the line within a tenth of the cap (each admission and release tells it the line's length): a
   * tenant far from its cap costs run creation nothing, and the cap can be passed by the runs of the
   * requests in flight as it is reached, in this process and the others.
   */
  hasRoom(tenantId: string, adding?: number): Promise<boolean>;
  /** the runs waiting in the tenant's line, in the order they will be admitted */
  line(tenantId: string): Promise<string[]>;
  /** System use (the reconciler): gives back the slot of a run that is running, whatever the limit (Redis lost it). */
  restore(tenantId: string, runId: string): Promise<void>;
  /** System use (the reconciler): every tenant's admitted and waiting runs, by tenant. */
  holders(): Promise<Map<string, { admitted: Set<string>; waiting: Set<string> }>>;
  readonly limit: number;
  /** the most runs a tenant may have waiting in its line (SERVICE_TENANT_MAX_WAITING) */
  readonly maxWaiting: number;
};

/**
 * How often a process also looks through Redis's whole keyspace for tenants holding slots (and at its first
 * reconciler pass): the list of such tenants is kept by the scripts that change their slots, and a look
 * through the keyspace finds the tenants an earlier version, or Redis back from an older save, left out of it.
 * It was each pass's way (SCAN every 30 s in each worker process, over every key of the Redis: 2,000 calls
 * for a million keys).
 */
export const SLOT_TENANTS_SCAN_MS = 3_600_000;

export function createTenantSlots(redis: Redis, prefix: string, limit: number, maxWaiting = Number.MAX_SAFE_INTEGER): TenantSlots {
  // in the engine's Redis batch: a run's release shares its round trip with its run.finished event
  const batch = redisBatch(redis);
  batch.define('slots.admit', { keys: 4, args: 4, lua: ADMIT });
  batch.define('slots.release', { keys: 4, args: 3, lua: RELEASE });
  batch.define('slots.line', { keys: 2, args: 0, lua: IN_LINE });
  batch.define('slots.waiting', { keys: 2, args: 0, lua: WAITING });
  batch.define('slots.restore', { keys: 2, args: 2, lua: "redis.call('SADD', KEYS[2], ARGV[2])\nreturn redis.call('SADD', KEYS[1], ARGV[1])" });
  batch.define('slots.forget', { keys: 4, args: 1, lua: `local tenant = ARGV[1]\n${FORGET_IF_EMPTY}\nreturn 0` });
  const running = (t: string) => `${prefix}:tenant:${t}:running`;
  const pending = (t: string) => `${prefix}:tenant:${t}:pending`;
  const parkedOf = (t: string) => `${prefix}:tenant:${t}:parked`;
  /** the tenants that hold a slot or wait for one (in the prefix's slot of a Redis Cluster, as their keys) */
  const tenantsKey = `${prefix}:slot-tenants`;
  const keysOf = (t: string) => [running(t), pending(t), parkedOf(t), tenantsKey];
  const line = (t: string) => batch.call<string[]>('slots.line', [running(t), pending(t)], []);
  /** the length of each tenant's line as this process last saw it (only while some run waits) */
  const seen = new Map<string, number>();
  const saw = (t: string, waiting: number) => (waiting > 0 ? seen.set(t, waiting) : seen.delete(t));
  const waiting = async (t: string) => {
    const n = await batch.call<number>('slots.waiting', [running(t), pending(t)], []);
    saw(t, n);
    return n;
  };
  /** when this process last looked through the keyspace for tenants holding slots (never yet) */
  let scannedAt = Number.NEGATIVE_INFINITY;
  /** The tenants holding slots or places, as the list has them and, now and then, as the keyspace does (then listed too). */
  async function tenantsHolding(): Promise<Set<string>> {
    const tenants = new Set(await redis.smembers(tenantsKey));
    if (Date.now() - scannedAt < SLOT_TENANTS_SCAN_MS) return tenants;
    const found = new Set<string>();
    for (const key of await scanKeys(redis, `${prefix}:tenant:*`)) {
      const m = /^(.*):(running|pending|parked)$/.exec(key.slice(`${prefix}:tenant:`.length));
      if (m && !tenants.has(m[1]!)) found.add(m[1]!);
    }
    // listed from now (one whose runs all left meanwhile is taken out again by the pass that finds it empty)
    if (found.size) await redis.sadd(tenantsKey, ...found);
    scannedAt = Date.now();
    return new Set([...tenants, ...found]);
  }
  return {
    limit,
    maxWaiting,
    async admit(tenantId, runId, parked) {
      const answer = await batch.call<number>('slots.admit', keysOf(tenantId), [runId, limit, parked ? '1' : '0', tenantId]);
      if (answer >= 0) saw(tenantId, answer);
      return answer < 0;
    },
    async release(tenantId, runId) {
      const [admitted, parked, left] = await batch.call<[string[], string[], number]>('slots.release', keysOf(tenantId), [runId, limit, tenantId]);
      saw(tenantId, left);
      return { admitted, parked };
    },
    running: (t) => redis.scard(running(t)),
    waiting,
    async hasRoom(tenantId, adding = 1) {
      if ((seen.get(tenantId) ?? 0) + adding <= maxWaiting - Math.ceil(maxWaiting / 10)) return true;
      return (await waiting(tenantId)) + adding <= maxWaiting;
    },
    line,
    async restore(t, runId) {
      await batch.call('slots.restore', [running(t), tenantsKey], [runId, t]);
    },
    async holders() {
      const out = new Map<string, { admitted: Set<string>; waiting: Set<string> }>();
      for (const tenantId of await tenantsHolding()) {
        const [admitted, waiting] = await Promise.all([redis.smembers(running(tenantId)), line(tenantId)]);
        // a tenant whose runs all left (its last release raced the scan that listed it): no longer listed
        if (!admitted.length && !waiting.length) await batch.call('slots.forget', keysOf(tenantId), [tenantId]);
        else out.set(tenantId, { admitted: new Set(admitted), waiting: new Set(waiting) });
      }
      return out;
    },
  };
}
