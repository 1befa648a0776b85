// Audit reports in Redis, so any web process can answer a fetch: one hash per report (its head, then
// each phase's result as it ends; the whole report once assembled), kept for a TTL, and a capped
// index per tenant (the oldest reports beyond the cap are dropped). Keys carry the tenant, so one
// tenant cannot name another's report. A set of running reports lets the reconciler finish those
// whose flow was lost, and a set per tenant caps how many one tenant has running: audits are the
// heaviest work a worker does, and a tenant that asks for a hundred must not hold every worker's
// phases for an hour while the others wait behind it.
import {
  eventLogKey,
  RateLimitedError,
  scopes,
  type AuditOptions,
  type AuditPhase,
  type AuditPhaseResult,
  type AuditReport,
  type Redis,
} from '../platform/index.js';

export type ReportStoreSettings = { ttlSeconds: number; maxPerTenant: number; maxRunningPerTenant: number; prefix: string };

/** what a tenant at its cap is told to wait before it asks again */
const FULL_RETRY_AFTER_SECONDS = 30;

/** a running report outlives a long audit; once assembled it is kept for the TTL */
const RUNNING_GRACE_SECONDS = 6 * 3600;

// writes a phase only while the report exists (an evicted report is not brought back by a late phase) and is
// not being assembled (a phase that ends after the assembly read the phases would tell its end twice)
const PUT_IF_EXISTS = `if redis.call('EXISTS', KEYS[1]) == 0 or redis.call('HEXISTS', KEYS[1], 'assembling') == 1 then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1`;

// the report as the assembly takes it, closed to phases in the same step: what it reads is all it will have
const CLOSE_FOR_ASSEMBLY = `if redis.call('EXISTS', KEYS[1]) == 0 then return {} end
redis.call('HSET', KEYS[1], 'assembling', ARGV[1])
return redis.call('HGETALL', KEYS[1])`;

// a report is made only while its tenant has fewer than ARGV[3] running (those running longer than a
// report may are not counted): the count and the report's keys in one step, so that two requests
// cannot both take the last place. Nor after ARGV[9] (epoch ms; 0: no deadline) by Redis's clock: a
// request answered 503 while Redis stalled is not started when Redis takes its script later (-1)
const CREATE_IF_ROOM = `local deadline = tonumber(ARGV[9])
if deadline > 0 then
  local t = redis.call('TIME')
  if tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) > deadline then return -1 end
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[2])
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then return 0 end
redis.call('ZADD', KEYS[1], ARGV[1], ARGV[4])
redis.call('HSET', KEYS[2], 'head', ARGV[6], 'options', ARGV[7])
redis.call('EXPIRE', KEYS[2], ARGV[8])
redis.call('ZADD', KEYS[3], ARGV[1], ARGV[4])
redis.call('ZADD', KEYS[4], ARGV[1], ARGV[5])
return 1`;

// a running report is marked canceled (a run waiting on it was canceled): its phases not started do not
// start, those running stop; one that ended already is left as it is (0)
const MARK_CANCELED = `local head = redis.call('HGET', KEYS[1], 'head')
if not head or cjson.decode(head).status ~= 'running' then return 0 end
redis.call('HSET', KEYS[1], 'canceled', ARGV[1])
return 1`;

// the assembled report replaces the head (while the report exists), kept for the TTL from now, and leaves
// the running sets, in one step: a process that stops half way leaves no finished report holding a place
const FINISH = `local kept = 0
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('HSET', KEYS[1], 'head', ARGV[1])
  redis.call('EXPIRE', KEYS[1], ARGV[2])
  kept = 1
end
redis.call('ZREM', KEYS[2], ARGV[3])
redis.call('ZREM', KEYS[3], ARGV[4])
return kept`;

type ReportRedis = Redis & {
  auditFinish(...args: (string | number)[]): Promise<number>;
  auditPutIfExists(key: string, field: string, value: string): Promise<number>;
  auditCreateIfRoom(...args: (string | number)[]): Promise<number>;
  auditMarkCanceled(key: string, at: string): Promise<number>;
  auditCloseForAssembly(key: string, at: string): Promise<string[]>;
};

type Held = { report: AuditReport; options: AuditOptions; canceled: boolean };

/** A report's hash as read: while it runs, its head with the phases ended so far; null when it is gone. */
function heldOf(h: Record<string, string>): Held | null {
  if (!h.head) return null;
  const report = JSON.parse(h.head) as AuditReport;
  if (report.status === 'running')
    report.phases = report.phases_requested.flatMap((p) => (h[`phase:${p}`] ? [JSON.parse(h[`phase:${p}`]!) as AuditPhaseResult] : []));
  return { report, options: JSON.parse(h.options ?? '{"phases":[],"layers":null}') as AuditOptions, canceled: h.canceled !== undefined };
}

export function reportStoreOf(redis: Redis, settings: ReportStoreSettings) {
  const { prefix, ttlSeconds, maxPerTenant, maxRunningPerTenant } = settings;
  if (!('auditPutIfExists' in redis)) redis.defineCommand('auditPutIfExists', { numberOfKeys: 1, lua: PUT_IF_EXISTS });
  if (!('auditCreateIfRoom' in redis)) redis.defineCommand('auditCreateIfRoom', { numberOfKeys: 4, lua: CREATE_IF_ROOM });
  if (!('auditFinish' in redis)) redis.defineCommand('auditFinish', { numberOfKeys: 3, lua: FINISH });
  if (!('auditMarkCanceled' in redis)) redis.defineCommand('auditMarkCanceled', { numberOfKeys: 1, lua: MARK_CANCELED });
  if (!('auditCloseForAssembly' in redis)) redis.defineCommand('auditCloseForAssembly', { numberOfKeys: 1, lua: CLOSE_FOR_ASSEMBLY });
  const r = redis as ReportRedis;
  // {tenant} is a hash tag: a tenant's reports and its index live in one Redis Cluster slot
  const key = (tenantId: string, id: string) => `${prefix}:audit:{${tenantId}}:${id}`;
  const index = (tenantId: string) => `${prefix}:audit-index:{${tenantId}}`;
  const running = `${prefix}:audit-running`;
  const runningOf = (tenantId: string) => `${prefix}:audit-running:{${tenantId}}`;
  const member = (tenantId: string, id: string) => `${tenantId}\n${id}`;

  /**
   * Drops what expired from the index, then the oldest finished reports beyond the cap. A running report is
   * never dropped (its audit was accepted and will report): the index holds at most the cap and the tenant's
   * running ones more.
   */
  async function trim(tenantId: string, nowMs: number): Promise<void> {
    await redis.zremrangebyscore(index(tenantId), '-inf', nowMs - (ttlSeconds + RUNNING_GRACE_SECONDS) * 1000);
    const excess = (await redis.zcard(index(tenantId))) - maxPerTenant;
    if (excess <= 0) return;
    const stillRunning = new Set(await redis.zrange(runningOf(tenantId), 0, -1));
    const evicted = (await redis.zrange(index(tenantId), 0, excess + stillRunning.size - 1)).filter((id) => !stillRunning.has(id)).slice(0, excess);
    if (!evicted.length) return;
    const m = redis.multi();
    // and its event log, whose last event holds the whole report: left, an evicted report stayed in Redis for its TTL
    for (const id of evicted) m.del(key(tenantId, id), eventLogKey(prefix, scopes.audit(id).stream));
    m.zrem(index(tenantId), ...evicted);
    await m.exec();
  }

  return {
    ttlSeconds,
    maxPerTenant,

    /**
     * Keeps a new running report; throws RateLimitedError when the tenant has its most running already. False,
     * and nothing kept, when Redis ran it after `deadlineMs` (epoch ms, by Redis's clock; 0: no deadline).
     */
    async create(tenantId: string, report: AuditReport, options: AuditOptions, nowMs: number, deadlineMs = 0): Promise<boolean> {
      const id = report.report_id;
      const made = await r.auditCreateIfRoom(
        runningOf(tenantId),
        key(tenantId, id),
        index(tenantId),
        running,
        nowMs,
        nowMs - RUNNING_GRACE_SECONDS * 1000,
        maxRunningPerTenant,
        id,
        member(tenantId, id),
        JSON.stringify(report),
        JSON.stringify(options),
        ttlSeconds + RUNNING_GRACE_SECONDS,
        deadlineMs,
      );
      if (made === -1) return false;
      if (made !== 1)
        throw new RateLimitedError(
          `${maxRunningPerTenant} audits of this tenant are running (SERVICE_AUDIT_TENANT_MAX_RUNNING): start another when one has finished`,
          FULL_RETRY_AFTER_SECONDS,
        );
      await trim(tenantId, nowMs);
      return true;
    },

    /** takes back a report that should not have been made (its request was answered 503): its keys and its place */
    async remove(tenantId: string, id: string): Promise<void> {
      await redis.multi().del(key(tenantId, id)).zrem(index(tenantId), id).zrem(running, member(tenantId, id)).zrem(runningOf(tenantId), id).exec();
    },

    /** the report as it stands: while it runs, its head with the phases ended so far; `canceled` once marked */
    async get(tenantId: string, id: string): Promise<Held | null> {
      return heldOf(await redis.hgetall(key(tenantId, id)));
    },

    /**
     * The report as get() reads it, closed to phases in the same step (putPhase refuses from then on): the phases
     * the assembly reads are all the report will have, and a phase that ends later tells nothing.
     */
    async closeForAssembly(tenantId: string, id: string, at: string): Promise<Held | null> {
      const flat = await r.auditCloseForAssembly(key(tenantId, id), at);
      const h: Record<string, string> = {};
      for (let i = 0; i + 1 < flat.length; i += 2) h[flat[i]!] = flat[i + 1]!;
      return heldOf(h);
    },

    /** marks a running report canceled, in one step with reading its state: false when it is over or gone */
    async markCanceled(tenantId: string, id: string, at: string): Promise<boolean> {
      return (await r.auditMarkCanceled(key(tenantId, id), at)) === 1;
    },

    /** whether the report's phases should still run: it exists, runs and is not canceled */
    async isWanted(tenantId: string, id: string): Promise<boolean> {
      const [head, canceled] = await redis.hmget(key(tenantId, id), 'head', 'canceled');
      return typeof head === 'string' && canceled == null && (JSON.parse(head) as AuditReport).status === 'running';
    },

    /** the report's status alone, or null when it is gone */
    async status(tenantId: string, id: string): Promise<AuditReport['status'] | null> {
      const head = await redis.hget(key(tenantId, id), 'head');
      return head ? (JSON.parse(head) as AuditReport).status : null;
    },

    /** keeps a phase's result; false when the report is gone (expired or evicted) */
    async putPhase(tenantId: string, id: string, phase: AuditPhase, result: AuditPhaseResult): Promise<boolean> {
      return (await r.auditPutIfExists(key(tenantId, id), `phase:${phase}`, JSON.stringify(result))) === 1;
    },

    /** the assembled report replaces the head, kept for the TTL from now */
    async finish(tenantId: string, report: AuditReport): Promise<boolean> {
      const id = report.report_id;
      return (await r.auditFinish(key(tenantId, id), running, runningOf(tenantId), JSON.stringify(report), ttlSeconds, member(tenantId, id), id)) === 1;
    },

    /** reports still running that started before `beforeMs`, oldest first */
    async listRunning(beforeMs: number, limit: number): Promise<{ tenantId: string; id: string; startedMs: number }[]> {
      const flat = await redis.zrangebyscore(running, '-inf', beforeMs, 'WITHSCORES', 'LIMIT', 0, limit);
      const out: { tenantId: string; id: string; startedMs: number }[] = [];
      for (let i = 0; i < flat.length; i += 2) {
        const [tenantId, id] = flat[i]!.split('\n') as [string, string];
        out.push({ tenantId, id, startedMs: Number(flat[i + 1]) });
      }
      return out;
    },

    /** takes a report out of the running sets: it no longer exists, or it ended but is still counted */
    async dropRunning(tenantId: string, id: string): Promise<void> {
      await redis.multi().zrem(running, member(tenantId, id)).zrem(runningOf(tenantId), id).exec();
    },
  };
}

export type ReportStore = ReturnType<typeof reportStoreOf>;
