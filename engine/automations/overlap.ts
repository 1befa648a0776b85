// Overlap policies: what a fire does while a run of its automation is queued or running (Temporal's
// schedule overlap policies, for every trigger). One key in Redis per automation names the run that holds it:
// taken at a run's start (a start guard), kept through its retries' backoffs, given back at its end. `skip`
// refuses a run that meets another at its start; `queue` holds it (queued, no worker, no slot) until the holder
// ends and offers it the key; `replace` cancels the others at the fire, then waits for them as `queue` does.
import type { Platform } from '../deps.js';
import { isTerminal, jobIdOfRun, type Run } from '../platform/index.js';
import type { StartVerdict } from '../runs/index.js';

/** How long a key outlives its last start when no end gives it back (its holder's end is also checked: see claim). */
const KEY_TTL_MS = 7 * 86_400_000;
/** The runs of an automation read at most to find those a fire replaces, or the one to offer next. */
const READ_AT_MOST = 1000;
/**
 * The runs of an automation under `queue` that may wait at once: a fire past them makes its run canceled. Held runs
 * are out of their tenant's line (they hold no slot), so this is their bound: a cron trigger that fires faster than
 * its runs end would otherwise pile them up for good.
 */
export const QUEUE_MAX_WAITING = 100;

// KEYS[1]: the automation's key; ARGV: the run, the key's TTL, and the holder it may take over ('' for none).
// Answers '' when the run holds the key now, else the holder
const CLAIM_LUA = `local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] and holder ~= ARGV[3] then return holder end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return ''`;
const RELEASE_LUA = `if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0`;

type OverlapRedis = Platform['redis'] & {
  overlapClaim(key: string, runId: string, ttlMs: number, takeOver: string): Promise<string>;
  overlapRelease(key: string, runId: string): Promise<number>;
};

export type OverlapDeps = Pick<Platform, 'store' | 'log' | 'redis' | 'queues'> & {
  cancel(tenantId: string, runId: string, message?: string): Promise<unknown>;
};

export function overlapOf(deps: OverlapDeps) {
  const { store, log } = deps;
  if (!('overlapClaim' in deps.redis)) {
    deps.redis.defineCommand('overlapClaim', { numberOfKeys: 1, lua: CLAIM_LUA });
    deps.redis.defineCommand('overlapRelease', { numberOfKeys: 1, lua: RELEASE_LUA });
  }
  const redis = deps.redis as OverlapRedis;
  // after the prefix's hash tag: one Redis Cluster slot with every other key of the service
  const keyOf = (run: Pick<Run, 'tenant_id' | 'automation_id'>) => `${deps.queues.prefix}:automation-running:${run.tenant_id}:${run.automation_id}`;

  /** The automation's runs not yet ended, oldest first. */
  async function unended(run: Pick<Run, 'tenant_id' | 'automation_id'>, statuses: Run['status'][]): Promise<Run[]> {
    const pages = await Promise.all(
      statuses.map((status) => store.runs.list(run.tenant_id, { automation_id: run.automation_id!, status, limit: READ_AT_MOST })),
    );
    return pages.flatMap((p) => p.items).sort((a, b) => a.created_at.localeCompare(b.created_at) || a.id.localeCompare(b.id));
  }

  return {
    /**
     * The start guard: a run of an automation with a policy takes its key, or meets the run that holds it. A holder
     * found ended (its end never gave the key back: its process died, its job failed for good) is taken over.
     */
    async mayStart(run: Run): Promise<StartVerdict> {
      if (!run.overlap || !run.automation_id) return null;
      const key = keyOf(run);
      let holder = await redis.overlapClaim(key, run.id, KEY_TTL_MS, '');
      if (holder) {
        const held = await store.runs.get(run.tenant_id, holder);
        if (!held || isTerminal(held.status)) holder = await redis.overlapClaim(key, run.id, KEY_TTL_MS, holder);
      }
      if (!holder) return null;
      if (run.overlap === 'skip') return { refuse: `skipped: run ${holder} of automation ${run.automation_id} is running (overlap: skip)` };
      return { hold: `run ${holder} of automation ${run.automation_id} runs first (overlap: ${run.overlap})` };
    },

    /** Whether the start guard may hold a run (it then gives its tenant slot back while it waits). */
    mayHold: (run: Run): boolean => run.overlap === 'queue' || run.overlap === 'replace',

    /**
     * A run's end (a finished hook that may run again): its key given back, and the automation's oldest run held
     * behind it offered to the workers now rather than at its next try.
     */
    async ended(run: Run): Promise<void> {
      if (!run.overlap || !run.automation_id) return;
      if (!(await redis.overlapRelease(keyOf(run), run.id))) return;
      if (run.overlap === 'skip') return;
      // a run held at its first start: its job waits, delayed. Not one waiting out a retry's backoff, nor one in its
      // tenant's line (it has no job yet, and making one would pass the tenant's cap)
      const next = (await unended(run, ['queued'])).find((r) => (r.overlap === 'queue' || r.overlap === 'replace') && !r.attempts.length);
      const job = next && (await deps.queues.get('runs').getJob(jobIdOfRun(next, next.attempt)));
      if (job && (await job.isDelayed())) await job.promote().catch(() => undefined);
    },

    /**
     * After a fire made its run (an Idempotency-Key's replay too: a process that died before this leaves it to the
     * replay). Under `replace`, the automation's runs made before it and not yet ended are canceled (never a later
     * one: of two fires at once, the later replaces the earlier, not each the other); the new run starts once their
     * ends have given the key back. Under `queue`, a run that finds QUEUE_MAX_WAITING made before it and not yet
     * ended is canceled.
     */
    async fired(run: Run): Promise<void> {
      // a replay's run that has ended (it ran, or was canceled) replaces nothing
      if ((run.overlap !== 'replace' && run.overlap !== 'queue') || isTerminal(run.status)) return;
      const before = (r: Run) => r.created_at < run.created_at || (r.created_at === run.created_at && r.id < run.id);
      // the new run stands whatever becomes of this (a store that does not answer)
      const older = await unended(run, ['queued', 'running'])
        .then((runs) => runs.filter(before))
        .catch((err: Error) => {
          log.warn({ run_id: run.id, err: err.message }, 'the runs a fire of its automation meant to look at could not be read');
          return [];
        });
      const cancel = (id: string, message?: string) =>
        deps
          .cancel(run.tenant_id, id, message)
          .catch((err: Error) => log.warn({ run_id: id, err: err.message }, 'a run its overlap policy meant to cancel was not'));
      if (run.overlap === 'queue') {
        if (older.length >= QUEUE_MAX_WAITING)
          await cancel(
            run.id,
            `skipped: ${older.length} runs of automation ${run.automation_id} wait or run before it (overlap: queue holds ${QUEUE_MAX_WAITING})`,
          );
        return;
      }
      for (const r of older) await cancel(r.id);
    },
  };
}

export type Overlap = ReturnType<typeof overlapOf>;
