// Queue names and the queue registry, in one place. Every queue shares one connection and the
// SERVICE_QUEUE_PREFIX, so tests and deployments sharing a Redis never see each other's jobs.
import { Queue, type FlowJob } from 'bullmq';
import type { Run } from './records.js';
import type { Redis } from './redis.js';

export const QUEUE_NAMES = ['runs', 'triggers', 'webhooks', 'gates', 'audits', 'notifications'] as const;
export type QueueName = (typeof QUEUE_NAMES)[number];

/**
 * Job ids derive from domain ids, so adding a job twice is a no-op. One job per attempt of a run: a
 * retry or an interrupted attempt gets a job of its own. A session task's run is named by its task,
 * `{session}__{task}__{attempt}`, the attempt counted over the task's runs; other runs' first attempt
 * keeps the id runs have always had, so jobs queued before attempts existed are still found.
 */
export function jobIdOfRun(run: Pick<Run, 'id' | 'session_id' | 'trigger'>, attempt: number): string {
  if (run.trigger.type === 'task') return `${run.session_id}__${run.trigger.task_id}__${(run.trigger.prior_attempts ?? 0) + attempt}`;
  return attempt === 1 ? `run-${run.id}` : `run-${run.id}-${attempt}`;
}

const KEPT = { removeOnComplete: { count: 1000 }, removeOnFail: { count: 5000 } };

/**
 * A tree of jobs on one queue (a gate run's gates under its seal, an audit's phases under its report):
 * ids `{id}__{parent}` and `{id}__{child}`, so adding it twice is a no-op; every child with
 * `ignoreDependencyOnFailure`, so a failed child never strands its parent, which then finds what the
 * child did not report and says so.
 */
export function jobTree<T>(queueName: QueueName, id: string, parent: { name: string; data: T }, children: { key: string; name: string; data: T }[]): FlowJob {
  return {
    name: parent.name,
    queueName,
    data: parent.data,
    opts: { jobId: `${id}__${parent.name}`, ...KEPT },
    children: children.map((c) => ({ name: c.name, queueName, data: c.data, opts: { jobId: `${id}__${c.key}`, ignoreDependencyOnFailure: true, ...KEPT } })),
  };
}

/**
 * What the reconcilers do with items stored as waiting for a job: one whose job is gone (its process died
 * between the store and the queue) is queued again; one whose job used up its attempts is tried again. An
 * item that cannot be repaired now (Redis refused, another process retried its job first) is counted in
 * `errors` and left for the next pass: it does not end this one.
 */
export async function repairJobs<T>(
  queue: Queue,
  items: T[],
  jobIdOf: (item: T) => string,
  enqueue: (item: T) => Promise<void>,
): Promise<{ requeued: number; retried: number; errors: number }> {
  let requeued = 0;
  let retried = 0;
  let errors = 0;
  for (const item of items) {
    try {
      const job = await queue.getJob(jobIdOf(item));
      if (!job) {
        await enqueue(item);
        requeued++;
      } else if (await job.isFailed()) {
        await job.retry('failed');
        retried++;
      }
    } catch {
      errors++;
    }
  }
  return { requeued, retried, errors };
}

/**
 * A reconciler's pass over stored items waiting for a job, oldest first, a page at a time by a keyset cursor
 * (its time, then its id): items whose jobs merely wait in a backlog hide none behind them. A pass reads at
 * most `perPass` and the next goes on from where it stopped, from the oldest again once it reached the end.
 */
export function staleJobRepair<T, C>(opts: {
  queue: () => Queue;
  /** a page of the items stale since `before`, after `after` */
  read: (before: string, after: C | undefined, limit: number) => Promise<T[]>;
  cursorOf: (item: T) => C;
  jobIdOf: (item: T) => string;
  enqueue: (item: T) => Promise<void>;
  page?: number;
  perPass?: number;
}): (before: string) => Promise<{ requeued: number; retried: number; errors: number }> {
  const page = opts.page ?? 500;
  const perPass = opts.perPass ?? 5000;
  let after: C | undefined;
  return async (before) => {
    const total = { requeued: 0, retried: 0, errors: 0 };
    for (let read = 0; read < perPass;) {
      const items = await opts.read(before, after, page);
      const done = await repairJobs(opts.queue(), items, opts.jobIdOf, opts.enqueue);
      total.requeued += done.requeued;
      total.retried += done.retried;
      total.errors += done.errors;
      read += items.length;
      after = items.length < page ? undefined : opts.cursorOf(items.at(-1)!);
      if (after === undefined) break;
    }
    return total;
  };
}

export type Queues = {
  readonly prefix: string;
  get(name: QueueName): Queue;
  all(): Queue[];
  close(): Promise<void>;
};

export function createQueues(connection: Redis, prefix: string): Queues {
  const queues = new Map<QueueName, Queue>(QUEUE_NAMES.map((name) => [name, new Queue(name, { connection, prefix })]));
  return {
    prefix,
    get: (name) => queues.get(name)!,
    all: () => [...queues.values()],
    async close() {
      await Promise.all([...queues.values()].map((q) => q.close()));
    },
  };
}

/** Records a reconciler's pass deletes at a time, and how long a pass spends deleting them at most. */
const PRUNE_PAGE = 1000;
const PRUNE_BUDGET_MS = 2000;

/**
 * Deletes a page at a time (`prune(limit)` answers how many went; `page` records, PRUNE_PAGE unless a record may
 * be large) until none is left or PRUNE_BUDGET_MS has
 * passed: a reconciler's pass keeps up with any rate of new records and is never held long by them.
 */
export async function pruneInPages(prune: (limit: number) => Promise<number>, page = PRUNE_PAGE): Promise<void> {
  for (const until = Date.now() + PRUNE_BUDGET_MS; Date.now() < until;) if ((await prune(page)) < page) return;
}
