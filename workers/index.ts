// The BullMQ workers of this process: one Worker per queue that has a processor, plus the listener
// for cancel requests and the reconciler. Each Worker duplicates the connection for its blocking
// reads. close() stops taking jobs and lets running ones finish.
import { Worker, type Processor } from 'bullmq';
import type { QueueName } from '../engine/platform/index.js';
import type { CronJob } from '../engine/automations/index.js';
import type { Runtime } from '../engine/process/index.js';

export type Processors = Partial<Record<QueueName, { processor: Processor; concurrency: number }>>;

type RunJob = { run_id: string; tenant_id: string };

/** The processors of this service, by queue: thin, they parse the job and call the engine. */
export function processorsOf(rt: Runtime): Processors {
  return {
    runs: {
      concurrency: rt.config.workerConcurrency,
      processor: async (job) => {
        const { run_id, tenant_id } = job.data as RunJob;
        await rt.engine.executor.execute(run_id, tenant_id);
      },
    },
    triggers: {
      concurrency: 5,
      processor: async (job) => {
        if (job.name === 'cron') await rt.engine.fireCron(job.data as CronJob, String(job.id), new Date(job.timestamp));
      },
    },
    webhooks: {
      concurrency: 10,
      processor: async (job) => {
        const { tenant_id, delivery_id } = job.data as { tenant_id: string; delivery_id: string };
        await rt.engine.webhooks.process(tenant_id, delivery_id);
      },
    },
  };
}

export type Workers = { workers: Worker[]; close(): Promise<void> };

export async function startWorkers(rt: Runtime, processors: Processors = processorsOf(rt)): Promise<Workers> {
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

  const fileTriggers = rt.engine.watchFiles({ refreshMs: rt.config.fileTriggerRefreshSeconds * 1000, ignore: [rt.config.dataDir] });
  await fileTriggers.start();

  const reconcile = () =>
    Promise.all([rt.engine.runs.reconcile(), rt.engine.schedules.reconcile(), rt.engine.webhooks.reconcile()]).catch((err: unknown) =>
      rt.log.warn({ err: (err as Error).message }, 'reconcile failed'),
    );
  const reconciler = setInterval(reconcile, rt.config.reconcileIntervalSeconds * 1000);
  reconciler.unref();
  void reconcile();

  rt.log.info({ queues: workers.map((w) => w.name), concurrency: rt.config.workerConcurrency }, 'workers ready');
  return {
    workers,
    async close() {
      clearInterval(reconciler);
      await fileTriggers.close();
      await Promise.all(workers.map((w) => w.close()));
      await cancels.quit().catch(() => cancels.disconnect());
    },
  };
}
