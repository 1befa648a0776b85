// npm run bench (part three): the task DAG against a BullMQ flow, in one process, on the same Redis.
//  - 100 no-op tasks (a random DAG, each with one `message` step) from POST to the session's end,
//    against a BullMQ flow of one parent and 100 no-op children from add to the parent's completion
//  - a layered DAG, 10 wide and 10 deep (each task after every task of the layer before)
//  - where the time goes: 100 tasks with no dependencies, and 100 plain no-op runs (the floor under any DAG);
//    a chain of 30 tasks against a chain of 30 BullMQ jobs, each added by the one before (a hop's cost)
// The flow is a tree and runs its children in parallel; the DAG runs each task as a full run (stored,
// events, tenant slot), at the same worker concurrency.
import { FlowProducer, type Job, Queue, Worker } from 'bullmq';
import { Redis } from 'ioredis';
import { deleteRedisPrefix, uniquePrefix } from '../test/support/harness.js';
import { runsFinished, service } from './runs.js';

const REDIS_URL = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
const CONCURRENCY = Number(process.env.BENCH_CONCURRENCY ?? 10);
const NOOP = [{ tool: 'message' as const, args: { text: 'noop' } }];
const ROUNDS = 5;

/**
 * BullMQ alone on a fresh prefix: a worker of queue `name`, at the bench's concurrency, runs `work`, which
 * calls `done` at the last job. Timed from `start` (adding the first work) to then.
 */
async function timedBullmq(
  name: string,
  work: (job: Job, done: () => void, queue: Queue) => Promise<void>,
  start: (queue: Queue, flows: FlowProducer) => Promise<unknown>,
): Promise<number> {
  const prefix = uniquePrefix();
  const connection = new Redis(REDIS_URL, { maxRetriesPerRequest: null });
  const queue = new Queue(name, { connection, prefix });
  const flows = new FlowProducer({ connection, prefix });
  let done!: () => void;
  const finished = new Promise<void>((r) => (done = r));
  const worker = new Worker(name, (job) => work(job, done, queue), { connection, prefix, concurrency: CONCURRENCY });
  await worker.waitUntilReady();
  try {
    const t0 = performance.now();
    await start(queue, flows);
    await finished;
    return performance.now() - t0;
  } finally {
    await worker.close();
    await flows.close();
    await queue.close();
    connection.disconnect();
    await deleteRedisPrefix(prefix);
  }
}

/** A flow of one parent and `children` no-op children, from its add to the parent's job. */
const rawFlow = (children: number) =>
  timedBullmq(
    'flow',
    async (job, done) => {
      if (job.name === 'parent') done();
    },
    (_, flows) =>
      flows.add({
        name: 'parent',
        queueName: 'flow',
        children: Array.from({ length: children }, (_, i) => ({ name: 'child', queueName: 'flow', data: { i } })),
      }),
  );

/**
 * A chain of `n` BullMQ jobs, each added by the one before as it runs, from the first add to the last job:
 * what a DAG's hop (a task that starts when the one before it ends) costs BullMQ alone.
 */
const rawChain = (n: number) =>
  timedBullmq(
    'chain',
    async (job, done, queue) => {
      const i = (job.data as { i: number }).i;
      if (i + 1 < n) await queue.add('link', { i: i + 1 }, { removeOnComplete: true });
      else done();
    },
    (queue) => queue.add('link', { i: 0 }, { removeOnComplete: true }),
  );

type TaskSpec = { id: string; depends_on: string[]; steps: typeof NOOP };

/** A seeded generator (mulberry32): every bench run measures the same random DAG. */
function seeded(seed: number): () => number {
  return () => {
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function randomDag(n: number): TaskSpec[] {
  const random = seeded(11);
  const tasks: TaskSpec[] = [];
  for (let i = 0; i < n; i++) {
    const deps = new Set<string>();
    for (let k = 0; k < 3 && i > 0; k++) if (random() < 0.5) deps.add(`t${Math.floor(random() * i)}`);
    tasks.push({ id: `t${i}`, depends_on: [...deps], steps: NOOP });
  }
  return tasks;
}

function layeredDag(width: number, depth: number): TaskSpec[] {
  const tasks: TaskSpec[] = [];
  for (let d = 0; d < depth; d++)
    for (let w = 0; w < width; w++)
      tasks.push({ id: `l${d}w${w}`, depends_on: d ? Array.from({ length: width }, (_, k) => `l${d - 1}w${k}`) : [], steps: NOOP });
  return tasks;
}

const CHAIN = 30;

function chainDag(n: number): TaskSpec[] {
  return Array.from({ length: n }, (_, i) => ({ id: `c${i}`, depends_on: i ? [`c${i - 1}`] : [], steps: NOOP }));
}

/** The longest chain of dependencies: how many tasks must run one after another. */
function depthOf(tasks: TaskSpec[]): number {
  const depth = new Map<string, number>();
  for (const t of tasks) depth.set(t.id, 1 + Math.max(0, ...t.depends_on.map((d) => depth.get(d) ?? 0)));
  return Math.max(...depth.values());
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

type Rt = Parameters<Parameters<typeof service>[0]>[0];

/**
 * The median of ROUNDS timed rounds in one service with its workers (the first warms it up). Each round
 * prepares what it needs off the clock (`prepare`), then the clock runs until `timed` answers.
 */
async function medianMs<T>(prepare: (rt: Rt) => Promise<T>, timed: (rt: Rt, prepared: T) => Promise<void>): Promise<number> {
  return service(async (rt) => {
    const { startWorkers } = await import('../workers/index.js');
    const workers = await startWorkers(rt);
    try {
      const times: number[] = [];
      for (let i = 0; i < ROUNDS; i++) {
        const prepared = await prepare(rt);
        const t0 = performance.now();
        await timed(rt, prepared);
        times.push(performance.now() - t0);
      }
      return median(times);
    } finally {
      await workers.close();
    }
  });
}

const tick = () => new Promise((r) => setTimeout(r, 2));

/** The floor under the DAG: `n` no-op runs (no session, no task), all created at once, to the last run's end. */
const runsMs = (n: number) =>
  medianMs(
    (rt) => runsFinished(rt),
    async (rt, before) => {
      await Promise.all(Array.from({ length: n }, () => rt.engine.runs.create('bench', { kind: 'autonomy', steps: NOOP, trigger: { type: 'api' } })));
      while ((await runsFinished(rt)) < before + n) await tick();
    },
  );

/** A session of the DAG, from adding its tasks to the session's end. */
const dagMs = (tasks: TaskSpec[]) =>
  medianMs(
    (rt) => rt.engine.sessions.create('bench', { title: 'bench' }),
    async (rt, session) => {
      await rt.engine.sessions.addTasks('bench', session.id, tasks);
      for (;;) {
        const s = await rt.store.sessions.get('bench', session.id);
        if (s?.outcome) {
          if (s.outcome !== 'succeeded') throw new Error(`the bench DAG ended ${s.outcome}`);
          return;
        }
        await tick();
      }
    },
  );

export async function dagBenchmarks(): Promise<string[]> {
  const step = (what: string) => process.stderr.write(`bench: ${what}\n`);
  step('BullMQ flow, 100 children');
  const flows: number[] = [];
  for (let i = 0; i < ROUNDS; i++) flows.push(await rawFlow(100));
  const flow = median(flows);
  const dag = randomDag(100);
  step(`task DAG, 100 random tasks (longest chain ${depthOf(dag)})`);
  const random = await dagMs(dag);
  step('task DAG, 10 wide x 10 deep');
  const layered = await dagMs(layeredDag(10, 10));
  step('100 tasks with no dependencies');
  const flat = await dagMs(layeredDag(100, 1));
  step('100 no-op runs, no session');
  const runs = await runsMs(100);
  step(`a chain of ${CHAIN} tasks, and of ${CHAIN} BullMQ jobs`);
  const chain = await dagMs(chainDag(CHAIN));
  const rawChains: number[] = [];
  for (let i = 0; i < ROUNDS; i++) rawChains.push(await rawChain(CHAIN));
  const rawChainMs = median(rawChains);
  const f = (n: number) => n.toFixed(0);
  return [
    `| 100 no-op tasks, random DAG (seeded; longest chain ${depthOf(dag)} tasks), POST to the session's end vs a BullMQ flow of 100 no-op children | ${f(random)} ms | ${f(flow)} ms | ${(random / flow).toFixed(2)}x |`,
    `| 100 no-op tasks, 10 wide x 10 deep (each after the whole layer before) vs the same flow | ${f(layered)} ms | ${f(flow)} ms | ${(layered / flow).toFixed(2)}x |`,
    `| where it goes: 100 no-op tasks with no dependencies (a session, no waiting) vs the same flow | ${f(flat)} ms | ${f(flow)} ms | ${(flat / flow).toFixed(2)}x |`,
    `| where it goes: 100 no-op runs created at once (no session, no task) vs the same flow | ${f(runs)} ms | ${f(flow)} ms | ${(runs / flow).toFixed(2)}x |`,
    `| where it goes: a chain of ${CHAIN} no-op tasks (each after the one before) vs ${CHAIN} BullMQ jobs each added by the one before; a hop | ${f(chain)} ms; ${(chain / CHAIN).toFixed(1)} ms | ${f(rawChainMs)} ms; ${(rawChainMs / CHAIN).toFixed(1)} ms | ${(chain / rawChainMs).toFixed(2)}x |`,
  ];
}
