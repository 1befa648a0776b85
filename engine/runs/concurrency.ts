// Per-tenant concurrency on Redis (open-source BullMQ has no groups). A tenant's admitted runs are a
// set; the rest wait in the tenant's own list and hold no worker slot, so one tenant's backlog never
// sits in front of another tenant's runs. Sets, not counters: a replayed release cannot free twice.
import { redisBatch, scanKeys, type Redis } from '../platform/index.js';

const ADMIT = `
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 1 then return 1 end
if redis.call('SCARD', KEYS[1]) < tonumber(ARGV[2]) and redis.call('LLEN', KEYS[2]) == 0 then
  redis.call('SADD', KEYS[1], ARGV[1])
  return 1
end
if not redis.call('LPOS', KEYS[2], ARGV[1]) then redis.call('RPUSH', KEYS[2], ARGV[1]) end
return 0`;

const RELEASE = `
redis.call('SREM', KEYS[1], ARGV[1])
redis.call('LREM', KEYS[2], 0, ARGV[1])
local admitted = {}
while redis.call('SCARD', KEYS[1]) < tonumber(ARGV[2]) do
  local nextId = redis.call('LPOP', KEYS[2])
  if not nextId then break end
  redis.call('SADD', KEYS[1], nextId)
  table.insert(admitted, nextId)
end
return admitted`;

export type TenantSlots = {
  /** true: the run may go to the queue now; false: it waits in the tenant's list */
  admit(tenantId: string, runId: string): Promise<boolean>;
  /** frees the run's slot (or its place in line) and returns the runs admitted in its place */
  release(tenantId: string, runId: string): Promise<string[]>;
  running(tenantId: string): Promise<number>;
  waiting(tenantId: string): Promise<number>;
  /** System use (the reconciler): gives back the slot of a run that is running, whatever the limit (Redis lost it). */
  restore(tenantId: string, runId: string): Promise<void>;
  /** System use (the reconciler): every tenant's admitted and waiting runs, by tenant. */
  holders(): Promise<Map<string, { admitted: Set<string>; waiting: Set<string> }>>;
  readonly limit: number;
};

export function createTenantSlots(redis: Redis, prefix: string, limit: number): TenantSlots {
  // in the engine's Redis batch: a run's release shares its round trip with its run.finished event
  const batch = redisBatch(redis);
  batch.define('slots.admit', { keys: 2, args: 2, lua: ADMIT });
  batch.define('slots.release', { keys: 2, args: 2, lua: RELEASE });
  const running = (t: string) => `${prefix}:tenant:${t}:running`;
  const pending = (t: string) => `${prefix}:tenant:${t}:pending`;
  return {
    limit,
    async admit(tenantId, runId) {
      return (await batch.call<number>('slots.admit', [running(tenantId), pending(tenantId)], [runId, limit])) === 1;
    },
    async release(tenantId, runId) {
      return batch.call<string[]>('slots.release', [running(tenantId), pending(tenantId)], [runId, limit]);
    },
    running: (t) => redis.scard(running(t)),
    waiting: (t) => redis.llen(pending(t)),
    async restore(t, runId) {
      await redis.sadd(running(t), runId);
    },
    async holders() {
      const out = new Map<string, { admitted: Set<string>; waiting: Set<string> }>();
      const tenants = new Set<string>();
      for (const key of await scanKeys(redis, `${prefix}:tenant:*`)) {
        const m = /^(.*):(running|pending)$/.exec(key.slice(`${prefix}:tenant:`.length));
        if (m) tenants.add(m[1]!);
      }
      for (const tenantId of tenants) {
        const [admitted, waiting] = await Promise.all([redis.smembers(running(tenantId)), redis.lrange(pending(tenantId), 0, -1)]);
        out.set(tenantId, { admitted: new Set(admitted), waiting: new Set(waiting) });
      }
      return out;
    },
  };
}
