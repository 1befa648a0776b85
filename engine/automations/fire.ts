// How a trigger starts an automation's run: the automation's run request, created once per
// idempotency key. A disabled or archived automation never fires; its cron triggers are brought in line.
import type { Platform } from '../deps.js';
import { ConflictError, NotFoundError, type RunTrigger } from '../platform/index.js';
import { serviceKey, type Runs } from '../runs/index.js';
import type { Automations } from './automations.js';
import type { Overlap } from './overlap.js';
import type { CronJob, Schedules } from './schedules.js';
import { isCronFire } from './triggers.js';

export function firesOf(
  deps: Pick<Platform, 'store' | 'log'> & {
    automations: Automations;
    schedules: Schedules;
    runs: Pick<Runs, 'createIdempotent' | 'cancel'>;
    overlap: Pick<Overlap, 'fired'>;
  },
) {
  const { automations, schedules, runs } = deps;

  /**
   * The automation's run for this trigger, or null when the automation is not enabled. What the run's
   * creation throws goes to the caller: one that is `retryable` (Redis or the store did not answer, the
   * same key's first request still being handled) is worth a retry, with the same key.
   */
  async function fire(tenantId: string, automationId: string, trigger: RunTrigger, idempotencyKey?: string, inputs?: Record<string, unknown>) {
    let request: Awaited<ReturnType<typeof automations.runRequest>>;
    try {
      request = await automations.runRequest(tenantId, automationId, { trigger, inputs });
    } catch (err) {
      if (!(err instanceof NotFoundError || err instanceof ConflictError)) throw err;
      deps.log.info({ automation_id: automationId, trigger: trigger.type }, 'trigger ignored: the automation is not enabled');
      const a = await deps.store.automations.get(tenantId, automationId);
      if (a) await schedules.sync(a);
      return null;
    }
    const { run, replayed } = await runs.createIdempotent(tenantId, idempotencyKey, { trigger }, request);
    // disabled or archived between the read above and the run's insert (a request answered meanwhile): the run
    // it made is canceled before it starts, as its answer promised (a fire never runs past a disable). A store that
    // does not answer this read leaves the run as made: the automation was enabled as it fired
    const now = await deps.store.automations.get(tenantId, automationId).catch(() => undefined);
    if (now === undefined || now?.status === 'enabled') {
      // what its overlap policy asks, once the run stands (a replay's too: the process that made the run may have
      // died before it); a fire a disable cancels replaces nothing
      await deps.overlap.fired(run);
      return run;
    }
    if (replayed) return run;
    deps.log.info({ automation_id: automationId, run_id: run.id, trigger: trigger.type }, 'fire canceled: the automation was disabled as it fired');
    return runs.cancel(tenantId, run.id).catch(() => run);
  }

  /** One fire of a cron trigger: its job id makes the run once, even if the job runs twice. */
  async function fireCron(job: CronJob, jobId: string, firedAt: Date) {
    const a = await deps.store.automations.get(job.tenant_id, job.automation_id);
    const t = a?.triggers[job.trigger_index];
    // a fire handed over just before its trigger's schedule changed is not the new schedule's, unless the new
    // schedule gives that time too: its own fire has this job's id, and was not added as another job
    const changed = job.schedule !== undefined && (t?.type !== 'cron' || t.schedule !== job.schedule || t.timezone !== job.timezone);
    if (changed && !(t?.type === 'cron' && isCronFire(t.schedule, t.timezone, firedAt.getTime()))) {
      deps.log.info({ automation_id: job.automation_id, trigger_index: job.trigger_index }, 'cron fire ignored: its trigger changed since it was handed over');
      return null;
    }
    const trigger: RunTrigger = {
      type: 'cron',
      schedule: t?.type === 'cron' ? t.schedule : '',
      timezone: t?.type === 'cron' ? t.timezone : '',
      fire_at: firedAt.toISOString(),
    };
    return fire(job.tenant_id, job.automation_id, trigger, serviceKey(`cron:${jobId}`));
  }

  return { fire, fireCron };
}

export type Fires = ReturnType<typeof firesOf>;
