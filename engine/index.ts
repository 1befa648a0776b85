// The engine: what the service does, with no knowledge of HTTP or of BullMQ's workers.
import { apiKeysOf } from './api-keys.js';
import { automationsOf } from './automations.js';
import type { EngineDeps } from './deps.js';
import { ConflictError, NotFoundError } from './errors.js';
import { executorOf } from './executor.js';
import type { RunTrigger } from './model.js';
import { runsOf } from './runs.js';
import { schedulesOf, type CronJob } from './schedules.js';
import { webhooksOf } from './webhooks/index.js';

export function createEngine(deps: EngineDeps) {
  const runs = runsOf(deps);
  const schedules = schedulesOf(deps);
  const automations = automationsOf(deps, { changed: (a, before) => schedules.sync(a, before) });

  /** Starts an automation's run from a trigger; a disabled or archived automation never fires. */
  async function fire(tenantId: string, automationId: string, trigger: RunTrigger, idempotencyKey?: string, inputs?: Record<string, unknown>) {
    try {
      const request = await automations.runRequest(tenantId, automationId, { trigger, inputs });
      return (await runs.createIdempotent(tenantId, idempotencyKey, { trigger }, request)).run;
    } catch (err) {
      if (!(err instanceof NotFoundError || err instanceof ConflictError)) throw err;
      deps.log.info({ automation_id: automationId, trigger: trigger.type }, 'trigger ignored: the automation is not enabled');
      const a = await deps.store.automations.get(tenantId, automationId);
      if (a) await schedules.sync(a);
      return null;
    }
  }

  return {
    automations,
    apiKeys: apiKeysOf(deps),
    templates: deps.templates,
    runs,
    schedules,
    executor: executorOf(deps, runs),
    webhooks: webhooksOf(deps, fire),
    fire,
    /** one tick of a cron scheduler: its job id makes the run once, even if the job runs twice */
    fireCron: async (job: CronJob, jobId: string, firedAt: Date) => {
      const a = await deps.store.automations.get(job.tenant_id, job.automation_id);
      const t = a?.triggers[job.trigger_index];
      const trigger: RunTrigger = {
        type: 'cron',
        schedule: t?.type === 'cron' ? t.schedule : '',
        timezone: t?.type === 'cron' ? t.timezone : '',
        fire_at: firedAt.toISOString(),
      };
      return fire(job.tenant_id, job.automation_id, trigger, `cron:${jobId}`);
    },
    deps,
  };
}

export type Engine = ReturnType<typeof createEngine>;
export type { EngineDeps } from './deps.js';
