// The BullMQ workers of this process: one Worker per queue that has a processor. Each Worker
// duplicates the connection for its blocking reads. close() lets running jobs finish.
import { Worker, type Processor } from 'bullmq';
import type { QueueName } from '../engine/queues.js';
import type { Runtime } from '../engine/runtime.js';

export type Processors = Partial<Record<QueueName, { processor: Processor; concurrency: number }>>;

/** The processors of this service, by queue. The run engine adds its own here. */
export function processorsOf(_rt: Runtime): Processors {
  return {};
}

export type Workers = { workers: Worker[]; close(): Promise<void> };

export async function startWorkers(rt: Runtime, processors: Processors = processorsOf(rt)): Promise<Workers> {
  const workers = Object.entries(processors).map(([name, p]) => {
    const worker = new Worker(name, p!.processor, { connection: rt.redis, prefix: rt.config.queuePrefix, concurrency: p!.concurrency });
    worker.on('failed', (job, err) => rt.log.warn({ queue: name, job_id: job?.id, err: err.message }, 'job failed'));
    worker.on('error', (err) => rt.log.error({ queue: name, err: err.message }, 'worker error'));
    return worker;
  });
  await Promise.all(workers.map((w) => w.waitUntilReady()));
  rt.log.info({ queues: workers.map((w) => w.name) }, workers.length ? 'workers ready' : 'worker process ready; no queue has a processor yet');
  return {
    workers,
    async close() {
      await Promise.all(workers.map((w) => w.close()));
    },
  };
}
