// The BullMQ workers of this process: one Worker per queue that has a processor, plus the listener
// for cancel requests and the reconciler. Each Worker duplicates the connection for its blocking
// reads. close() stops taking jobs and lets running ones finish.
import { DelayedError, UnrecoverableError, Worker, type Job, type Processor } from 'bullmq';
import { AppError, SHUTDOWN_REASON, type QueueName } from '../engine/platform/index.js';
import { CRON_TICK, type CronJob } from '../engine/automations/index.js';
import type { GateJob } from '../engine/gates/index.js';
import type { AuditJob } from '../engine/audit/index.js';
import { notifyBusyWaitMs, type NotificationJob } from '../engine/connections/index.js';
import type { Runtime } from '../engine/process/index.js';
import { assertStoreIsOurs } from '../engine/store/index.js';

/** How long a held run's job waits before it is offered again, when no resume promotes it sooner. */
const HELD_RETRY_MS = 5000;
/**
 * How long a job that found no place waits (with jitter) before it asks again: a gate whose workspace another gate
 * run holds, or whose tenant's gates hold every place of its own; an audit phase whose tenant's phases do.
 */
const BUSY_RETRY_MS = 500;

/** Hands back to the queue, at once, a job whose work this process stopped as it shuts down: none of its attempts or stalls spent. */
async function handedBack(job: Job, token: string | undefined): Promise<never> {
  await job.moveToDelayed(Date.now(), token);
  throw new DelayedError();
}

/**
 * How long before the end of the grace period running attempts are interrupted (at once when the grace
 * is shorter): the time left for their steps to be killed and their next attempts to be queued.
 */
const INTERRUPT_MARGIN_MS = 2500;
/** How often the runs executing here have their cancel keys read (a cancel's message can be lost; its key is not). */
const CANCEL_POLL_MS = 2000;

export type Processors = Partial<Record<QueueName, { processor: Processor; concurrency: number }>>;

type RunJob = { run_id: string; tenant_id: string; attempt?: number };

/**
 * The worker edge: an error the engine says is not worth retrying becomes BullMQ's UnrecoverableError;
 * anything else (the store or Redis briefly away) is retried by BullMQ with the job's backoff.
 */
export function jobErrorOf(err: unknown): Error {
  if (err instanceof AppError && !err.retryable) return new UnrecoverableError(`${err.code}: ${err.message}`);
  return err instanceof Error ? err : new Error(String(err));
}

/** The processors of this service, by queue: thin, they parse the job and call the engine. */
export function processorsOf(rt: Runtime): Processors {
  return {
    runs: {
      concurrency: rt.config.workerConcurrency,
      processor: async (job, token) => {
        const { run_id, tenant_id, attempt } = job.data as RunJob;
        let settled;
        try {
          settled = await rt.engine.executor.execute(run_id, tenant_id, attempt ?? 1);
        } catch (err) {
          throw jobErrorOf(err);
        }
        // a run that fails or times out fails its job too, so the dashboard shows the truth; BullMQ
        // does not retry it (the run's own retry policy does, with a job per attempt)
        if (!settled) return { skipped: true };
        const { run, next } = settled;
        // held (its session is paused): the job waits, delayed, holding no worker; a resume promotes it
        if (next === 'held') {
          await job.moveToDelayed(Date.now() + HELD_RETRY_MS, token);
          throw new DelayedError();
        }
        if (next === 'retry' || run.status === 'failed' || run.status === 'timed_out') {
          const what = next === 'retry' ? `attempt ${run.attempt - 1} failed; retrying as attempt ${run.attempt}` : `run ${run.status}`;
          throw new UnrecoverableError(`${what}: ${run.error?.code ?? ''} ${run.error?.message ?? ''}`.trim());
        }
        return { status: run.status, next };
      },
    },
    gates: {
      concurrency: rt.config.gatesConcurrency,
      processor: async (job, token) => {
        const { tenant_id, gate_run_id, gate_id } = job.data as GateJob;
        try {
          // a child runs one gate; the parent seals the results once every child has ended
          if (job.name === 'gate' && gate_id) {
            const result = await rt.engine.gates.runGateJob(tenant_id, gate_run_id, gate_id);
            if (result === 'interrupted') return await handedBack(job, token);
            if (result !== 'busy') return result && { gate_id, conclusion: result.conclusion };
          } else {
            const sealed = await rt.engine.gates.seal(tenant_id, gate_run_id);
            return sealed && { status: sealed.status };
          }
        } catch (err) {
          throw jobErrorOf(err);
        }
        // another gate run holds the workspace: this gate waits for it, holding no worker
        await job.moveToDelayed(Date.now() + BUSY_RETRY_MS * (1 + Math.random()), token);
        throw new DelayedError();
      },
    },
    audits: {
      concurrency: rt.config.audit.concurrency,
      processor: async (job, token) => {
        const { tenant_id, report_id, phase } = job.data as AuditJob;
        try {
          // a child runs one phase; the parent assembles the report once every child has ended
          if (job.name === 'phase' && phase) {
            const result = await rt.engine.audits.runPhaseJob(tenant_id, report_id, phase);
            if (result === 'interrupted') return await handedBack(job, token);
            if (result !== 'busy') return result && { phase, status: result.status };
          } else {
            const report = await rt.engine.audits.assemble(tenant_id, report_id);
            return report && { status: report.status };
          }
        } catch (err) {
          throw jobErrorOf(err);
        }
        // its tenant's other phases hold every place of its own: this one waits, holding no worker
        await job.moveToDelayed(Date.now() + BUSY_RETRY_MS * (1 + Math.random()), token);
        throw new DelayedError();
      },
    },
    triggers: {
      concurrency: 5,
      processor: async (job) => {
        if (job.name === CRON_TICK) return { handed_over: await rt.engine.schedules.tick() };
        if (job.name !== 'cron') return;
        // a fire's job names its time; one of the earlier per-trigger schedulers has it in opts.prevMillis
        const data = job.data as CronJob;
        const at = data.fire_at ? Date.parse(data.fire_at) : ((job.opts as { prevMillis?: number }).prevMillis ?? job.timestamp + (job.delay ?? 0));
        await rt.engine.fireCron(data, String(job.id), new Date(at)).catch((err) => {
          throw jobErrorOf(err);
        });
      },
    },
    webhooks: {
      concurrency: 10,
      processor: async (job) => {
        const { tenant_id, delivery_id } = job.data as { tenant_id: string; delivery_id: string };
        await rt.engine.webhooks.process(tenant_id, delivery_id).catch((err) => {
          throw jobErrorOf(err);
        });
      },
    },
    notifications: {
      concurrency: 20,
      processor: async (job, token) => {
        const { tenant_id, delivery_id } = job.data as NotificationJob;
        // the last try counts a failure against the endpoint; the ones before are retried by BullMQ with backoff
        const last = job.attemptsMade + 1 >= (job.opts.attempts ?? 1);
        const d = await rt.engine.notifications.deliver(tenant_id, delivery_id, last).catch((err) => {
          throw jobErrorOf(err);
        });
        // its tenant has all its tries in flight: the job waits, delayed, holding no worker and spending no try
        // (each start that found it busy is a start that was not a try)
        if (d === 'interrupted') return await handedBack(job, token);
        if (d === 'busy') {
          await job.moveToDelayed(Date.now() + notifyBusyWaitMs(job.attemptsStarted - job.attemptsMade) * (1 + Math.random()), token);
          throw new DelayedError();
        }
        return d && { status: d.status };
      },
    },
  };
}

/** close(deadline): the end of the grace period (epoch ms; by default SERVICE_SHUTDOWN_GRACE_SECONDS from now). */
export type Workers = { workers: Worker[]; close(deadline?: number): Promise<void> };

/** `stopping`: aborted when the process was asked to stop as it started; its workers then take no job. */
export async function startWorkers(rt: Runtime, processors: Processors = processorsOf(rt), stopping?: AbortSignal): Promise<Workers> {
  const stalledMs = rt.config.stalledIntervalSeconds * 1000;
  const workers = Object.entries(processors).map(([name, p]) => {
    const worker = new Worker(name, p!.processor, {
      connection: rt.redis,
      prefix: rt.config.queuePrefix,
      concurrency: p!.concurrency,
      // a dead worker's job is noticed within about two intervals, then re-delivered once: the
      // executor fences it (a run found `running` ends failed with worker-lost)
      lockDuration: stalledMs,
      stalledInterval: stalledMs,
      maxStalledCount: 1,
      // it takes jobs once the process is ready to give them back (its signal handling, its cancel listener,
      // its file triggers): a stop while it started killed a run it had taken, which ended worker-lost
      autorun: false,
    });
    worker.on('failed', (job, err) => rt.log.warn({ queue: name, job_id: job?.id, err: err.message }, 'job failed'));
    worker.on('error', (err) => rt.log.error({ queue: name, err: err.message }, 'worker error'));
    return worker;
  });
  await Promise.all(workers.map((w) => w.waitUntilReady()));

  const cancels = rt.redis.duplicate({ connectionName: `${rt.config.queuePrefix}:cancels` });
  cancels.on('error', (err) => rt.log.warn({ err: err.message }, 'cancel listener connection error'));
  await cancels.subscribe(rt.engine.runs.cancelChannel);
  cancels.on('message', (_channel, runId: string) => {
    if (rt.engine.executor.abort(runId)) rt.log.info({ run_id: runId }, 'run cancel requested');
  });
  // a message published while the listener reconnects is lost: the cancel keys of the runs executing here
  // are read when it is back, and every few seconds in any case
  const checkCancels = () =>
    void rt.engine.executor.abortCanceled().then(
      (n) => n && rt.log.info({ aborted: n }, 'run cancels found by their keys'),
      () => undefined,
    );
  cancels.on('ready', checkCancels);
  const cancelPoll = setInterval(checkCancels, CANCEL_POLL_MS);
  cancelPoll.unref();

  // the runs and the gate runs this process executes, told to the others a few times per lock: another
  // process's reconciler never takes one for lost (a run whose job's lock lapsed while it still runs here)
  const stopClaims = rt.engine.runs.claims.start(
    () => [...rt.engine.executor.executing(), ...rt.engine.gates.executing()],
    Math.max(100, Math.round(stalledMs / 3)),
  );

  const fileTriggers = rt.engine.watchFiles({ refreshMs: rt.config.fileTriggerRefreshSeconds * 1000 });
  await fileTriggers.start();

  // one pass at a time: a pass longer than the interval (a large repair after Redis lost its data) is not joined by the next
  let reconciling: Promise<unknown> | null = null;
  const reconcile = () => (reconciling ??= reconcilePass().finally(() => (reconciling = null)));
  const reconcilers: [string, () => Promise<unknown>][] = [
    ['runs', () => rt.engine.runs.reconcile({ isExecuting: rt.engine.executor.isExecuting })],
    ['sessions', () => rt.engine.sessions.reconcile()],
    ['schedules', () => rt.engine.schedules.reconcile()],
    ['webhooks', () => rt.engine.webhooks.reconcile()],
    ['notifications', () => rt.engine.notifications.reconcile()],
    ['gates', () => rt.engine.gates.reconcile(undefined, { elsewhere: () => rt.engine.runs.claims.elsewhere(), isExecuting: rt.engine.executor.isExecuting })],
    ['audits', () => rt.engine.audits.reconcile()],
    ['api-keys', () => rt.engine.apiKeys.prune()],
  ];
  // a pass ends when every reconciler has (one that fails holds back no other, and is logged by its name)
  const reconcilePass = async () => {
    // a store moved to a new prefix's deployment: its runs are that deployment's to judge (this process sees none
    // of its jobs or claims, and would take every one for lost)
    const ours = await assertStoreIsOurs(rt.store, rt.config.queuePrefix).then(
      () => true,
      (err: Error) => (rt.log.error({ err: err.message }, 'reconcile skipped: stop this process (its /healthz says so)'), false),
    );
    if (!ours) return;
    const settled = await Promise.allSettled(reconcilers.map(([, pass]) => pass()));
    settled.forEach((r, i) => {
      if (r.status === 'rejected') rt.log.warn({ reconciler: reconcilers[i]![0], err: (r.reason as Error)?.message }, 'reconcile failed');
    });
  };
  const reconciler = setInterval(reconcile, rt.config.reconcileIntervalSeconds * 1000);
  reconciler.unref();
  void reconcile();
  // what attempts of a process that died left on disk (a vibe run's copy, a checkout): its restart removes it
  const swept = rt.engine.runs.sweepLeftovers().then(
    (n) => n && rt.log.info({ removed: n }, 'removed what attempts of a process that died left on disk'),
    (err: Error) => rt.log.warn({ err: err.message }, 'leftovers of dead attempts not removed'),
  );

  if (stopping?.aborted) rt.log.info('workers take no job: the process was asked to stop as it started');
  else {
    for (const w of workers) void w.run().catch((err: Error) => rt.log.error({ queue: w.name, err: err.message }, 'worker stopped taking jobs'));
    rt.log.info({ queues: workers.map((w) => w.name), concurrency: rt.config.workerConcurrency }, 'workers ready');
  }
  return {
    workers,
    async close(deadline = Date.now() + rt.config.shutdownGraceSeconds * 1000) {
      // from now a step killed by the platform's own signal (it stops every process of the machine) is a deploy
      rt.engine.executor.drain();
      // near the end of the grace period, attempts still running are interrupted: their steps are
      // stopped (process groups killed) and they go back to the queue for another worker, rather
      // than being cut off by the exit and found lost later
      const timer = setTimeout(
        () => {
          const n = rt.engine.executor.interruptAll(SHUTDOWN_REASON);
          // and gates and audit phases: waited for, they outlived the grace period, and each job spent its one stall
          const gates = rt.engine.gates.interruptAll();
          const phases = rt.engine.audits.interruptAll();
          // and notifications' POSTs, which may wait SERVICE_NOTIFY_TIMEOUT_SECONDS (15 s) for an answer, past the grace period
          const notifications = rt.engine.notifications.interruptAll();
          if (n || gates || phases || notifications)
            rt.log.warn(
              { runs: n, gates, phases, notifications },
              'grace period ending: interrupting runs, gates, audit phases and notifications; they go back to the queue',
            );
        },
        Math.max(0, deadline - Date.now() - INTERRUPT_MARGIN_MS),
      );
      clearInterval(reconciler);
      try {
        await fileTriggers.close();
        await Promise.all(workers.map((w) => w.close()));
      } finally {
        clearTimeout(timer);
      }
      clearInterval(cancelPoll);
      await cancels.quit().catch(() => cancels.disconnect());
      // the ends still being stored keep their runs claimed until they are, or the grace period ends
      await rt.engine.executor.settled(deadline);
      await stopClaims();
      await swept;
    },
  };
}
