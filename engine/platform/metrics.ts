// Prometheus metrics (prom-client). Counts that must hold across processes (runs by kind and status,
// queue depths) are read from the store and Redis at scrape time, so every process reports the same
// figure (aggregate them with max, not sum); latencies and counters are this process's own: the web
// process serves them at /metrics, a worker at SERVICE_WORKER_METRICS_PORT.
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';
import type { Queues } from './queues.js';
import { withTimeout } from './redis.js';

/** How long a scrape waits for the queues' counts. */
const QUEUE_COUNTS_DEADLINE_MS = 1000;

/** Every metric of this service starts with it, the process's default metrics too. */
export const METRIC_PREFIX = 'automation_';

export type Metrics = {
  registry: Registry;
  httpDuration: Histogram<'method' | 'route' | 'status'>;
  runDuration: Histogram<'kind' | 'status'>;
  runsFinished: Counter<'kind' | 'status' | 'reason'>;
  runsRetried: Counter<'kind' | 'status'>;
  runQueueWait: Histogram<'kind'>;
  webhookRequests: Counter<'kind' | 'outcome'>;
};

/** How many runs there are, by kind and status, over every tenant: read at scrape time. */
export type RunCounter = () => Promise<{ kind: string; status: string; count: number }[]>;

export function createMetrics(deps: { countRuns: RunCounter; queues: Queues }): Metrics {
  const registry = new Registry();
  collectDefaultMetrics({ register: registry, prefix: METRIC_PREFIX });
  const httpDuration = new Histogram({
    name: `${METRIC_PREFIX}http_request_duration_seconds`,
    help: 'HTTP request latency by method, route and status',
    labelNames: ['method', 'route', 'status'] as const,
    buckets: [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5],
    registers: [registry],
  });
  const runDuration = new Histogram({
    name: `${METRIC_PREFIX}run_duration_seconds`,
    help: 'Duration of runs finished by this process, by kind and final status',
    labelNames: ['kind', 'status'] as const,
    buckets: [0.05, 0.1, 0.5, 1, 5, 15, 60, 300, 900, 3600],
    registers: [registry],
  });
  const runsFinished = new Counter({
    name: `${METRIC_PREFIX}runs_finished_total`,
    help: 'Runs finished by this process, by kind, status and reason (the error code; none when it succeeded)',
    labelNames: ['kind', 'status', 'reason'] as const,
    registers: [registry],
  });
  const runsRetried = new Counter({
    name: `${METRIC_PREFIX}runs_retried_total`,
    help: "Attempts that failed and were retried by their run's retry policy, by kind and status",
    labelNames: ['kind', 'status'] as const,
    registers: [registry],
  });
  const runQueueWait = new Histogram({
    name: `${METRIC_PREFIX}run_queue_wait_seconds`,
    help: 'Time from a run (or its next attempt) being queued to its start, by kind',
    labelNames: ['kind'] as const,
    buckets: [0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 15, 60, 300],
    registers: [registry],
  });
  new Gauge({
    name: `${METRIC_PREFIX}runs`,
    help: 'Runs in the store by kind and status (all processes)',
    labelNames: ['kind', 'status'] as const,
    registers: [registry],
    async collect() {
      this.reset();
      // a store that does not answer (closed, or a MongoDB away) costs a scrape this gauge, as Redis costs the queues'
      const rows = await withTimeout(Promise.resolve().then(deps.countRuns), QUEUE_COUNTS_DEADLINE_MS, 'the runs count').catch(() => []);
      for (const row of rows) this.set({ kind: row.kind, status: row.status }, row.count);
    },
  });
  new Gauge({
    name: `${METRIC_PREFIX}queue_jobs`,
    help: 'BullMQ jobs by queue and state',
    labelNames: ['queue', 'state'] as const,
    registers: [registry],
    async collect() {
      this.reset();
      // a Redis that does not answer costs a scrape these gauges, not the scrape (the process's own metrics still answer)
      const counted = await withTimeout(
        Promise.all(
          deps.queues
            .all()
            .map(
              async (q) => [q.name, await q.getJobCounts('waiting', 'waiting-children', 'active', 'delayed', 'prioritized', 'failed', 'completed')] as const,
            ),
        ),
        QUEUE_COUNTS_DEADLINE_MS,
        'the queue counts',
      ).catch(() => []);
      for (const [queue, counts] of counted) for (const [state, n] of Object.entries(counts)) this.set({ queue, state }, n);
    },
  });
  const webhookRequests = new Counter({
    name: `${METRIC_PREFIX}webhook_requests_total`,
    help: 'Webhook requests seen by this process, by kind and outcome (accepted, duplicate, handshake, or the rejection code)',
    labelNames: ['kind', 'outcome'] as const,
    registers: [registry],
  });
  return { registry, httpDuration, runDuration, runsFinished, runsRetried, runQueueWait, webhookRequests };
}
