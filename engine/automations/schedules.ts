// Cron triggers as BullMQ job schedulers on the `triggers` queue: one scheduler per cron trigger of an
// enabled automation, kept in step with every change and reconciled at start-up. BullMQ makes one
// job per tick, however many processes run, and a tick's run is created once (its job id is the
// Idempotency-Key), even if its job is delivered twice.
import type { Platform } from '../deps.js';
import type { Automation } from '../platform/index.js';

const PREFIX = 'cron-';
export const schedulerIdOf = (automationId: string, triggerIndex: number) => `${PREFIX}${automationId}-${triggerIndex}`;

export type CronJob = { tenant_id: string; automation_id: string; trigger_index: number };

export function schedulesOf(deps: Pick<Platform, 'queues' | 'store' | 'log'>) {
  const queue = deps.queues.get('triggers');

  async function existingIds(): Promise<string[]> {
    const ids: string[] = [];
    for (let start = 0; ; start += 500) {
      const page = await queue.getJobSchedulers(start, start + 499, true);
      ids.push(...page.map((s) => s.key).filter((k) => k.startsWith(PREFIX)));
      if (page.length < 500) return ids;
    }
  }

  function wanted(a: Automation): Map<string, { pattern: string; tz: string; data: CronJob }> {
    const out = new Map<string, { pattern: string; tz: string; data: CronJob }>();
    if (a.status !== 'enabled') return out;
    a.triggers.forEach((t, i) => {
      if (t.type === 'cron')
        out.set(schedulerIdOf(a.id, i), { pattern: t.schedule, tz: t.timezone, data: { tenant_id: a.tenant_id, automation_id: a.id, trigger_index: i } });
    });
    return out;
  }

  async function apply(want: Map<string, { pattern: string; tz: string; data: CronJob }>, have: string[]): Promise<void> {
    for (const [id, w] of want) {
      // one scheduler BullMQ cannot place (a time zone's transition it cannot step over) holds back no other;
      // the reconciler tries it again at its next pass
      await queue
        .upsertJobScheduler(
          id,
          { pattern: w.pattern, tz: w.tz },
          { name: 'cron', data: w.data, opts: { removeOnComplete: { count: 100 }, removeOnFail: { count: 500 } } },
        )
        .catch((err: Error) =>
          deps.log.warn({ scheduler_id: id, automation_id: w.data.automation_id, tenant_id: w.data.tenant_id, err: err.message }, 'cron scheduler not placed'),
        );
    }
    for (const id of have) if (!want.has(id)) await queue.removeJobScheduler(id); // a no-op when absent
  }

  return {
    /**
     * Brings one automation's schedulers in line with its triggers and status. `before` is the
     * automation as it was, so only its own scheduler ids are touched: no listing of all schedulers.
     */
    async sync(a: Automation, before?: Automation): Promise<void> {
      const had = (before ?? a).triggers.flatMap((t, i) => (t.type === 'cron' ? [schedulerIdOf(a.id, i)] : []));
      await apply(wanted(a), had);
    },
    /** Brings every scheduler in line with the store: what start-up runs. */
    async reconcile(): Promise<{ schedulers: number }> {
      const want = new Map<string, { pattern: string; tz: string; data: CronJob }>();
      for (const a of await deps.store.automations.listEnabledWithTrigger('cron')) for (const [id, w] of wanted(a)) want.set(id, w);
      await apply(want, await existingIds());
      deps.log.debug({ schedulers: want.size }, 'cron schedulers reconciled');
      return { schedulers: want.size };
    },
  };
}

export type Schedules = ReturnType<typeof schedulesOf>;
