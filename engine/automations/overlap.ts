// Overlap policies: what a fire does while a run of its automation is queued or running (Temporal's
// schedule overlap policies, for every trigger). One key in Redis per automation names the run that holds it:
// taken at a run's start (a start guard), kept through its retries' backoffs, given back at its end. `skip`
// refuses a run that meets another at its start; `queue` holds it (queued, no worker, no slot) until the holder
// ends and offers it the key; `replace` cancels the others at the fire, then waits for them as `queue` does.
import type { Platform } from '../deps.js';
import { isTerminal, type Run } from '../platform/index.js';
import type { StartVerdict } from '../runs/index.js';

/** How long a key outlives its last start when no end gives it back (its holder's end is also checked: see claim). */
const KEY_TTL_MS = 7 * 86_400_000;
/** The runs of an automation a fire of `replace` cancels at most (a tenant's line is bounded well below). */
const REPLACE_AT_MOST = 1000;

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
  /** offers a queued run whose job waits, delayed, to the workers now */
  offerNow(run: Run): Promise<void>;
  cancel(tenantId: string, runId: string): Promise<unknown>;
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
      statuses.map((status) => store.runs.list(run.tenant_id, { automation_id: run.automation_id!, status, limit: REPLACE_AT_MOST })),
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
      const [next] = await unended(run, ['queued']);
      if (next) await deps.offerNow(next);
    },

    /**
     * After a fire made its run (not an Idempotency-Key's replay): under `replace`, the automation's other runs not
     * yet ended are canceled; the new run starts once their ends have given the key back.
     */
    async fired(run: Run, replayed: boolean): Promise<void> {
      if (replayed || run.overlap !== 'replace') return;
      // the new run stands whatever becomes of this (a store that does not answer): it waits for the others' ends
      const others = await unended(run, ['queued', 'running']).catch((err: Error) => {
        log.warn({ run_id: run.id, err: err.message }, 'the runs a replace fire meant to cancel could not be read');
        return [];
      });
      for (const r of others)
        if (r.id !== run.id)
          await deps
            .cancel(run.tenant_id, r.id)
            .catch((err: Error) => log.warn({ run_id: r.id, err: err.message }, 'a run a replace fire meant to cancel was not'));
    },
  };
}

export type Overlap = ReturnType<typeof overlapOf>;
