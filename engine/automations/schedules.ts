// Cron triggers. Each cron trigger of an enabled automation is a member of one sorted set in Redis,
// scored by the time it fires next; placing, moving or removing it is one operation in the engine's
// Redis batch, in the request that changed the automation. A ticker (one BullMQ job scheduler, every
// second, so one tick at a time however many processes run) hands each fire due within the next
// moment to BullMQ as a delayed job whose id names the trigger and its time, then moves the member on
// to its next time, only if no one else moved it meanwhile. A tick's run is created once (the job id
// is its Idempotency-Key), even if its job is added or delivered twice. The set is rebuilt from the
// store at start-up and by the periodic reconcile.
import type { Platform } from '../deps.js';
import { redisBatch, type Automation } from '../platform/index.js';
import { isCronFire, lastCronFire, nextCronFire } from './triggers.js';

/** The job of one fire: which trigger, as it was when the fire was handed over, and its time. */
export type CronJob = { tenant_id: string; automation_id: string; trigger_index: number; schedule?: string; timezone?: string; fire_at?: string };

/** The ticker's job scheduler and job name on the triggers queue. */
export const CRON_TICK = 'cron-tick';
const TICK_EVERY_MS = 1000;
/** A tick hands over the fires due before its next tick and a margin, so a late tick never makes a fire late. */
const LOOKAHEAD_MS = 2 * TICK_EVERY_MS;
/** At most this many fires a pass; a tick makes passes until nothing more is due. */
const PASS_MAX = 500;
/** The job schedulers of the earlier design (one per trigger): the reconcile removes them. */
const LEGACY_SCHEDULER_PREFIX = 'cron-aut_';

const KEPT = { removeOnComplete: { count: 100 }, removeOnFail: { count: 500 } };
/**
 * A fire's job is tried again when what failed may pass (Redis or the store did not answer): 1, 2, 4 and
 * 8 s later; past that, the reconcile tries it again while it is not too late (MISSED_FIRE_MS). Its run's
 * idempotency key (the job's id) keeps every try to one run.
 */
const FIRE_TRIES = { attempts: 5, backoff: { type: 'exponential' as const, delay: 1000 } };
/** BullMQ's reason for a job whose worker died (or stalled) more often than it allows. */
const STALLED_REASON = 'job stalled more than allowable limit';

// ARGV: member, score ('' removes it)
const SET = `if ARGV[2] == '' then return redis.call('ZREM', KEYS[1], ARGV[1]) end
return redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])`;
// ARGV: member, score: placed only where the member is not (a new automation's trigger, see placeNew)
const ADD = `return redis.call('ZADD', KEYS[1], 'NX', ARGV[2], ARGV[1])`;
// ARGV: member, the score it was read with, the next score ('' removes it): first writer wins
const MOVE = `local s = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not s or tonumber(s) ~= tonumber(ARGV[2]) then return 0 end
if ARGV[3] == '' then redis.call('ZREM', KEYS[1], ARGV[1]) else redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1]) end
return 1`;

/** How many times a change of an automation's triggers is placed, each after another change stored meanwhile. */
const SYNC_PASSES = 5;

const hasCron = (a: Automation) => a.triggers.some((t) => t.type === 'cron');

/** What the set holds of an automation: whether it fires, and where and how each of its cron triggers does. */
const placedOf = (a: Automation) => JSON.stringify([a.status, a.triggers.map((t, i) => (t.type === 'cron' ? [i, t.schedule, t.timezone ?? null] : null))]);

/**
 * Whether two versions of an automation place the same cron triggers. Only what the set holds is
 * compared: a change to another trigger, or a field a store keeps otherwise (an unset one, as null),
 * writes nothing again.
 */
const sameSchedule = (x: Automation, y: Automation) => placedOf(x) === placedOf(y);

type Member = { tenant_id: string; automation_id: string; trigger_index: number };
/** How far back a fire missed while the set was lost is still made (within the day the store keeps its key). */
const MISSED_FIRE_MS = 12 * 3600_000;

const memberOf = (m: Member) => `${m.tenant_id}\t${m.automation_id}\t${m.trigger_index}`;
function parseMember(member: string): Member | null {
  const [tenant_id, automation_id, index] = member.split('\t');
  return tenant_id && automation_id && /^\d+$/.test(index ?? '') ? { tenant_id, automation_id, trigger_index: Number(index) } : null;
}

/** The sorted set of cron triggers, scored by their next time; members `tenant\tautomation\tindex`. */
export const cronDueKey = (prefix: string) => `${prefix}:cron:due`;

/** The job id of one fire: a trigger fires once at a time, however often the fire is handed over. */
export const cronJobIdOf = (m: Member, at: number) => `cron-${m.automation_id}-${m.trigger_index}-${at}`;

export function schedulesOf(deps: Pick<Platform, 'queues' | 'store' | 'log' | 'redis' | 'clock'>) {
  const { queues, store, log, redis, clock } = deps;
  const queue = queues.get('triggers');
  const key = cronDueKey(queues.prefix);
  const batch = redisBatch(redis);
  batch.define('cron.set', { keys: 1, args: 2, lua: SET });
  batch.define('cron.move', { keys: 1, args: 3, lua: MOVE });
  batch.define('cron.add', { keys: 1, args: 2, lua: ADD });

  /**
   * The fire a trigger missed while its member was missing from the set (Redis lost its data): its last fire
   * at or before `now`, when that came after the automation's last change and within MISSED_FIRE_MS (the
   * store keeps a fire's idempotency key a day, so a fire made before the loss is not made again); or null.
   */
  function missedFire(a: Automation, i: number, now: Date): number | null {
    const t = a.triggers[i];
    if (t?.type !== 'cron') return null;
    const since = Math.max(Date.parse(a.updated_at) + 1, now.getTime() - MISSED_FIRE_MS);
    return lastCronFire(t.schedule, t.timezone, now, since)?.getTime() ?? null;
  }

  /** The triggers of an automation that fire, with their next time (null: it never fires from now). */
  function wanted(a: Automation, from: Date): Map<string, number | null> {
    const out = new Map<string, number | null>();
    if (a.status !== 'enabled') return out;
    a.triggers.forEach((t, i) => {
      if (t.type !== 'cron') return;
      const next = nextCronFire(t.schedule, t.timezone, from);
      if (!next) log.warn({ automation_id: a.id, tenant_id: a.tenant_id, trigger_index: i, schedule: t.schedule }, 'cron trigger has no next time: not placed');
      out.set(memberOf({ tenant_id: a.tenant_id, automation_id: a.id, trigger_index: i }), next?.getTime() ?? null);
    });
    return out;
  }

  const set = (member: string, at: number | null) => batch.call<number>('cron.set', [key], [member, at ?? '']);
  const add = (member: string, at: number) => batch.call<number>('cron.add', [key], [member, at]);
  const move = (member: string, from: number, to: number | null) => batch.call<number>('cron.move', [key], [member, from, to ?? '']);

  /**
   * One fire handed over (its delayed job), then its member moved on: a fire is never lost between the two.
   * The fire is the stored trigger's, at a time its schedule gives.
   */
  async function handOver(member: string, at: number, now: number): Promise<boolean> {
    const m = parseMember(member);
    const a = m && (await store.automations.get(m.tenant_id, m.automation_id));
    const t = a?.status === 'enabled' ? a.triggers[m!.trigger_index] : undefined;
    if (!m || !t || t.type !== 'cron') return (await move(member, at, null)) === 1; // no longer a cron trigger that fires
    // a time the trigger's schedule does not give is no fire of it: the member was placed for the schedule
    // before a change whose own write has not reached the set yet (or was lost); it moves on to this one's
    if (isCronFire(t.schedule, t.timezone, at)) {
      const job: CronJob = { ...m, schedule: t.schedule, timezone: t.timezone, fire_at: new Date(at).toISOString() };
      await queue.add('cron', job, { jobId: cronJobIdOf(m, at), delay: Math.max(0, at - now), ...KEPT, ...FIRE_TRIES });
    }
    // a fire missed while nothing ran is made once, then the trigger goes on from now
    const next = nextCronFire(t.schedule, t.timezone, new Date(Math.max(at, now)));
    return (await move(member, at, next?.getTime() ?? null)) === 1;
  }

  /**
   * The fires whose jobs failed for a reason that may pass (their tries spent on a Redis or store that did
   * not answer, or their worker died twice), tried again while not too late; a fire refused for good (its
   * work needs an agent endpoint none is configured for, say: an UnrecoverableError ends its tries early) is not.
   */
  async function retryFailedFires(now: number): Promise<void> {
    for (let start = 0; ; start += 100) {
      const page = await queue.getFailed(start, start + 99);
      for (const job of page) {
        const fireAt = Date.parse((job.data as Partial<CronJob>).fire_at ?? '');
        const spent = job.attemptsMade >= (job.opts.attempts ?? 1) || job.failedReason === STALLED_REASON;
        if (job.name !== 'cron' || !spent || !(fireAt >= now - MISSED_FIRE_MS)) continue;
        log.warn({ job_id: job.id, fire_at: job.data.fire_at, reason: job.failedReason }, 'cron fire failed; trying it again');
        await job.retry('failed', { resetAttemptsMade: true, resetAttemptsStarted: true }).catch(() => undefined);
      }
      if (page.length < 100) break;
    }
  }

  /**
   * Places the triggers of `a` in the set, and removes those `before` had that it has not; what it placed. A
   * trigger placed for a time passed that its schedule still gives keeps it, as the reconcile keeps it: a fire
   * missed while no worker ran is made once by the next tick, whatever change (a rename) came meanwhile.
   */
  async function place(a: Automation, before?: Automation): Promise<Map<string, number | null>> {
    const now = clock.now();
    const want = wanted(a, now);
    const members = [...want.keys()];
    const scores = members.length ? await redis.zmscore(key, ...members) : [];
    const kept = new Set<string>();
    members.forEach((member, i) => {
      const at = scores[i] === null || scores[i] === undefined ? NaN : Number(scores[i]);
      const t = a.triggers[parseMember(member)!.trigger_index];
      if (at <= now.getTime() && want.get(member) !== null && t?.type === 'cron' && isCronFire(t.schedule, t.timezone, at)) {
        kept.add(member);
        want.set(member, at);
      }
    });
    const had = (before ?? a).triggers.flatMap((t, i) =>
      t.type === 'cron' ? [memberOf({ tenant_id: a.tenant_id, automation_id: a.id, trigger_index: i })] : [],
    );
    const writes = [...want].filter(([member]) => !kept.has(member)).map(([member, at]) => set(member, at));
    for (const member of had) if (!want.has(member)) writes.push(set(member, null));
    await Promise.all(writes);
    return want;
  }

  /** A fire due before the next tick is handed over now, so it is not late by a tick. */
  async function handOverDue(placed: Map<string, number | null>): Promise<void> {
    const now = clock.now().getTime();
    for (const [member, at] of placed) if (at !== null && at <= now + LOOKAHEAD_MS) await handOver(member, at, now);
  }

  return {
    /**
     * Brings one automation's triggers in the set in line with its triggers and status, in the engine's
     * batch. `before` is the automation as it was, so a trigger it no longer has is removed.
     *
     * Of two changes at once, the order they are stored in and the order their writes reach the set may
     * differ (two processes, or a slow turn between the commit and the write): the automation is read
     * again after each write and written again while it is not what was written. The last write is then
     * followed by a read that found what it wrote, and a change stored after that read writes after it.
     * A change that neither has nor had a cron trigger writes nothing, so it has nothing to read again: a
     * change stored after it, with a cron trigger, places that trigger itself. What is removed is what
     * `before` had: a cron trigger another change added after `before` was read, and this change took
     * away, stays in the set until its time comes (it is then dropped without a fire) or the reconcile.
     */
    async sync(a: Automation, before?: Automation): Promise<void> {
      if (!hasCron(a) && !(before && hasCron(before))) return;
      let written = a;
      let want = await place(a, before);
      for (let pass = 1; ; pass++) {
        const stored = await store.automations.get(a.tenant_id, a.id);
        if (!stored || sameSchedule(stored, written)) break;
        if (pass === SYNC_PASSES) {
          log.warn({ automation_id: a.id, tenant_id: a.tenant_id }, 'cron triggers changing faster than they are placed; the reconciler will repair');
          return;
        }
        want = await place(stored, written);
        written = stored;
      }
      await handOverDue(want);
    },

    /**
     * Places the cron triggers of an automation just created, in the engine's batch, without reading it
     * again as `sync` does: each is added only where the set has no such member. A change stored after
     * the create (by one who read the new automation) whose write reached the set first stands, as it
     * should: one that placed the trigger is not overwritten with the create's older time, and one that
     * removed it (the automation disabled or archived, the trigger gone) sees it added back, to be
     * dropped at its time without a fire (the tick reads the automation then) or by the reconcile.
     */
    async placeNew(a: Automation): Promise<void> {
      const want = wanted(a, clock.now());
      const added = await Promise.all([...want].map(async ([member, at]) => at !== null && (await add(member, at)) === 1));
      // a due fire only of what this create placed: a member already there is another change's to hand over
      await handOverDue(new Map([...want].filter((_, i) => added[i])));
    },

    /** One tick: every fire due before the tick after next is handed over. Returns how many were. */
    async tick(): Promise<number> {
      let handed = 0;
      // a fire that cannot be handed over stays due, first in line: later passes page past it
      const failed = new Set<string>();
      for (let pass = 0; pass < 100; pass++) {
        const now = clock.now().getTime();
        const due = await redis.zrangebyscore(key, '-inf', now + LOOKAHEAD_MS, 'WITHSCORES', 'LIMIT', failed.size, PASS_MAX);
        let moved = 0;
        for (let i = 0; i < due.length; i += 2) {
          const member = due[i]!;
          if (failed.has(member)) continue;
          const fired = await handOver(member, Number(due[i + 1]), now).catch((err: Error) => {
            log.warn({ member, err: err.message }, 'cron fire not handed over; the next tick tries again');
            failed.add(member);
            return false;
          });
          if (fired) moved++;
        }
        handed += moved;
        if (!moved) break; // nothing due, or what is left is another's to move or failing
      }
      return handed;
    },

    /**
     * Brings the set in line with the store (what start-up and the periodic reconcile run): every
     * enabled cron trigger placed (one already placed keeps its time), every other member removed, the
     * ticker placed, the earlier design's per-trigger schedulers removed.
     */
    async reconcile(): Promise<{ triggers: number }> {
      // the set is read before the store: a trigger placed after this read is not taken for a stray
      const placed = await redis.zrange(key, 0, -1, 'WITHSCORES');
      const now = clock.now();
      const want = new Map<string, number | null>();
      const automationOf = new Map<string, Automation>();
      for (const a of await store.automations.listEnabledWithTrigger('cron'))
        for (const [member, at] of wanted(a, now)) {
          want.set(member, at);
          automationOf.set(member, a);
        }
      const have = new Map<string, number>();
      for (let i = 0; i < placed.length; i += 2) have.set(placed[i]!, Number(placed[i + 1]));
      const writes: Promise<number>[] = [];
      // a trigger placed for a time still to come keeps it if its schedule gives that time (a change
      // whose write was lost does not); one overdue keeps it, for the next tick to fire once; one missing
      // (Redis lost the set) is placed at the fire it missed meanwhile, if any, for the next tick to make
      for (const [member, at] of want) {
        const was = have.get(member);
        if (was === undefined) writes.push(set(member, missedFire(automationOf.get(member)!, parseMember(member)!.trigger_index, now) ?? at));
        else if (at === null || (was > now.getTime() && was !== at)) writes.push(set(member, at));
      }
      for (const member of have.keys()) if (!want.has(member)) writes.push(set(member, null));
      await Promise.all(writes);
      await retryFailedFires(now.getTime());
      await queue.upsertJobScheduler(CRON_TICK, { every: TICK_EVERY_MS }, { name: CRON_TICK, opts: { removeOnComplete: true, removeOnFail: { count: 100 } } });
      for (let start = 0; ; start += 500) {
        const page = await queue.getJobSchedulers(start, start + 499, true);
        for (const s of page) if (s.key.startsWith(LEGACY_SCHEDULER_PREFIX)) await queue.removeJobScheduler(s.key);
        if (page.length < 500) break;
      }
      log.debug({ triggers: want.size }, 'cron triggers reconciled');
      return { triggers: want.size };
    },
  };
}

export type Schedules = ReturnType<typeof schedulesOf>;
