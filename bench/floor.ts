// npm run bench (the run engine's floor): what a no-op run cannot do without, each part measured alone in
// the same run, as the CPU it costs the process and Redis a run, against the service's whole run and raw
// BullMQ's job. A run is durable and conditional at each transition (issue 14 gives up neither): its job,
// its start and its end written to the store (with its step's row and its session's move), and the events
// a client streams. If the parts alone cost a process more than the goal leaves a run, no engine built of
// them reaches the goal on this machine, whatever the code around them does.
//  - a BullMQ job: 10,000 no-op jobs at concurrency 10 (the runs bench's baseline)
//  - the store's writes of a run, through the real SQLite store, as many runs a turn as the workers' concurrency
//    (BENCH_CONCURRENCY, 10) asks for
//  - the run's six events (run.started, three of its step, run.finished, session.updated), through the real
//    event log, as many runs a turn
//  - the service: the same no-op runs through the workers (the runs bench's figure), measured the same way
//  - the least engine (since 2026-11-28): not the service's design but the cheapest one that keeps the contract,
//    each no-op run a BullMQ job whose state lives in Redis: one conditional script a transition carrying its
//    event, its step's three events through the event log, its session.updated and its slot's release in its
//    end's script, and the store written once, at its end, WRITE_BEHIND runs a commit; with and without that
//    write. Its BullMQ job and it are measured in 3 alternating rounds (medians): BullMQ's job costs a third
//    less once warm, and a floor against a cold baseline reads too high
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { Redis } from 'ioredis';
import { Queue, Worker } from 'bullmq';
import { createEventLog, type NewEvent, redisBatch, type Run, type StepRecord } from '../engine/platform/index.js';
import { openSqliteStore } from '../engine/store/sqlite/index.js';
import { startWorkers } from '../workers/index.js';
import { deleteRedisPrefix, uniquePrefix } from '../test/support/harness.js';
import { runFixture } from '../test/integration/store-contract.js';
import { rawJobs, runsFinished, service } from './runs.js';

const RUNS = Number(process.env.BENCH_RUNS ?? 10_000);
const CONCURRENCY = Number(process.env.BENCH_CONCURRENCY ?? 10);
const REDIS_URL = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
const NOOP = [{ tool: 'message' as const, args: { text: 'noop' } }];
const WRITE_BEHIND = 100;
const ROUNDS = 3;

/** CPU a unit, in ms: the process's (user and system) and Redis's (INFO cpu), and the units a second. */
type Cost = { process: number; redis: number; rate: number };

/** What `work` costs the process and the Redis server a unit, measured around it. */
async function costOf(redis: Redis, units: number, work: () => Promise<void>): Promise<Cost> {
  const redisCpu = async () => {
    const info = await redis.info('cpu');
    const field = (name: string) => Number(new RegExp(`${name}:([0-9.]+)`).exec(info)?.[1] ?? 0);
    return field('used_cpu_user') + field('used_cpu_sys');
  };
  const r0 = await redisCpu();
  const c0 = process.cpuUsage();
  const t0 = performance.now();
  await work();
  const seconds = (performance.now() - t0) / 1000;
  const cpu = process.cpuUsage(c0);
  return { process: (cpu.user + cpu.system) / 1000 / units, redis: (((await redisCpu()) - r0) * 1000) / units, rate: units / seconds };
}

/** The medians of each figure of `costs` (each of an odd number of rounds). */
function medianCost(costs: Cost[]): Cost {
  const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
  return { process: median(costs.map((c) => c.process)), redis: median(costs.map((c) => c.redis)), rate: median(costs.map((c) => c.rate)) };
}

function bullmqJob(redis: Redis): Promise<Cost> {
  return rawJobs((drain) => costOf(redis, RUNS, drain));
}

/** A queued no-op run as `runs.create` stores it (an autonomy run of one `message` step). */
const queuedRun = (at: string): Run =>
  runFixture('bench', {
    kind: 'autonomy',
    plan: NOOP,
    tool_allowlist: ['message'],
    workspace: '/tmp/bench-floor/workspace/bench',
    budget: { seconds: 600 },
    agent: null,
    created_at: at,
  });

/** A SQLite store in a folder of its own holding `runs`, queued, and their sessions, as the API stores them. */
async function storeWith<T>(runs: Run[], use: (store: ReturnType<typeof openSqliteStore>) => Promise<T>): Promise<T> {
  const dir = await fs.mkdtemp(path.join(os.tmpdir(), 'svc-bench-floor-'));
  const store = openSqliteStore(path.join(dir, 'service.db'));
  try {
    for (const run of runs)
      await Promise.all([
        store.runs.insert(run),
        store.sessions.insert({
          id: run.session_id,
          tenant_id: run.tenant_id,
          title: '1 step',
          goal: null,
          kind: 'autonomy',
          status: 'running',
          outcome: null,
          metadata: { run_id: run.id },
          created_at: run.created_at,
          updated_at: run.created_at,
        }),
      ]);
    return await use(store);
  } finally {
    await store.close();
    await fs.rm(dir, { recursive: true, force: true });
  }
}

/** The record of a no-op run's one step, done at `now`. */
const noopStep = (now: string): StepRecord => ({
  index: 0,
  tool: 'message',
  name: null,
  args: { text: 'noop' },
  source: 'plan',
  status: 'succeeded',
  started_at: now,
  finished_at: now,
  duration_ms: 0,
  output: { text: 'noop' },
  error: null,
});

/** The run's end, as the store keeps it: its status, timings, usage and step, and its session's move. */
const endWrites = (store: ReturnType<typeof openSqliteStore>, r: Run, now: string, from: 'queued' | 'running', started?: string) => [
  store.runs.update(
    'bench',
    r.id,
    {
      status: 'succeeded',
      ...(started ? { started_at: started, sandbox: 'none' as const } : {}),
      finished_at: now,
      duration_ms: 1,
      summary: '1 step succeeded',
      usage: { steps: 1, model_turns: 0, seconds: 0.001 },
    },
    { status: [from], attempt: 1 },
    [noopStep(now)],
  ),
  store.sessions.update('bench', r.session_id, { status: 'idle', outcome: 'succeeded', updated_at: now }, ['running']),
];

/** The store's writes of each run, CONCURRENCY runs a turn: its start; then its end with its step, and its session's move. */
async function storeWrites(redis: Redis): Promise<Cost> {
  const at = new Date().toISOString();
  const runs = Array.from({ length: RUNS }, () => queuedRun(at));
  return storeWith(runs, (store) =>
    costOf(redis, RUNS, async () => {
      for (let i = 0; i < RUNS; i += CONCURRENCY) {
        const group = runs.slice(i, i + CONCURRENCY);
        await Promise.all(
          group.map((r) =>
            store.runs.update('bench', r.id, { status: 'running', started_at: new Date().toISOString(), sandbox: 'none' }, { status: ['queued'], attempt: 1 }),
          ),
        );
        const now = new Date().toISOString();
        await Promise.all(group.flatMap((r) => endWrites(store, r, now, 'running')));
      }
    }),
  );
}

/** A no-op run's six events, in the three turns the engine asks for them: its start, its step's, its end's. */
function eventsOf(r: Run): { start: NewEvent; step: NewEvent[]; end: NewEvent[] } {
  const of = { tenant_id: r.tenant_id, session_id: r.session_id, run_id: r.id };
  return {
    start: { ...of, type: 'run.started', data: { kind: 'autonomy', attempt: 1, budget: r.budget, queued_ms: 3, sandbox: 'none' } },
    step: [
      { ...of, type: 'step.started', data: { index: 0, tool: 'message', name: null, args: { text: 'noop' }, source: 'plan' } },
      { ...of, type: 'message.created', data: { role: 'assistant', text: 'noop', step: 0 } },
      { ...of, type: 'step.finished', data: { index: 0, tool: 'message', status: 'succeeded', duration_ms: 0, error: null } },
    ],
    end: [
      { ...of, type: 'run.finished', data: { status: 'succeeded', attempt: 1, summary: '1 step succeeded', error: null, duration_ms: 1, result: null } },
      { type: 'session.updated', tenant_id: r.tenant_id, session_id: r.session_id, data: { status: 'idle', outcome: 'succeeded', title: '1 step' } },
    ],
  } as { start: NewEvent; step: NewEvent[]; end: NewEvent[] };
}

const scopeOf = (r: Run) => `session:${r.session_id}`;

/** The six events of each run, CONCURRENCY runs a turn, in the three turns the engine asks for them. */
async function events(redis: Redis): Promise<Cost> {
  const prefix = uniquePrefix();
  const connection = new Redis(REDIS_URL, { maxRetriesPerRequest: null });
  const log = createEventLog(connection, prefix);
  try {
    return await costOf(redis, RUNS, async () => {
      for (let i = 0; i < RUNS; i += CONCURRENCY) {
        const group = Array.from({ length: Math.min(CONCURRENCY, RUNS - i) }, () => eventsOf(queuedRun('')));
        const scope = (e: NewEvent) => `session:${e.session_id}`;
        await Promise.all(group.map((g) => log.append(scope(g.start), g.start)));
        await Promise.all(group.flatMap((g) => g.step.map((e) => log.append(scope(e), e))));
        await Promise.all(group.flatMap((g) => g.end.map((e) => log.append(scope(e), e))));
      }
    });
  } finally {
    connection.disconnect();
    await deleteRedisPrefix(prefix);
  }
}

// the least engine's transitions: conditional on the run's state in Redis, each appending its events (the
// event log's own append, but for its trim) and the end freeing the run's tenant slot, in one script each
const LEAST_START = `if redis.call('HGET', KEYS[1], 's') ~= 'queued' then return 0 end
redis.call('HSET', KEYS[1], 's', 'running', 'started_at', ARGV[1])
local id = redis.call('XADD', KEYS[2], '*', 'e', ARGV[2])
redis.call('EXPIRE', KEYS[2], 604800)
redis.call('XLEN', KEYS[2])
return id`;
const LEAST_END = `if redis.call('HGET', KEYS[1], 's') ~= 'running' then return 0 end
redis.call('HSET', KEYS[1], 's', 'succeeded', 'finished_at', ARGV[1])
redis.call('XADD', KEYS[2], '*', 'e', ARGV[2])
redis.call('XADD', KEYS[2], '*', 'e', ARGV[3])
redis.call('EXPIRE', KEYS[2], 604800)
redis.call('XLEN', KEYS[2])
redis.call('SREM', KEYS[3], ARGV[4])
return 1`;

/**
 * The least engine that keeps the contract (see the top of the file): RUNS no-op runs as BullMQ jobs at
 * CONCURRENCY, each run's state in Redis, the store (with `write`) written once a run, WRITE_BEHIND a commit.
 */
async function leastEngine(redis: Redis, write: boolean): Promise<Cost> {
  const prefix = uniquePrefix();
  const connection = new Redis(REDIS_URL, { maxRetriesPerRequest: null });
  const log = createEventLog(connection, prefix);
  const batch = redisBatch(connection);
  batch.define('least.start', { keys: 2, args: 2, lua: LEAST_START });
  batch.define('least.end', { keys: 3, args: 4, lua: LEAST_END });
  const queue = new Queue('least', { connection, prefix });
  const at = new Date().toISOString();
  const runs = Array.from({ length: RUNS }, () => queuedRun(at));
  const byId = new Map(runs.map((r) => [r.id, r]));
  const state = (r: Run) => `${prefix}:run:${r.id}`;
  try {
    return await storeWith(write ? runs : [], async (store) => {
      for (let i = 0; i < RUNS; i += 1000) {
        const part = runs.slice(i, i + 1000);
        await part.reduce((p, r) => p.hset(state(r), 's', 'queued').sadd(`${prefix}:running:bench`, r.id), connection.pipeline()).exec();
        await queue.addBulk(part.map((r) => ({ name: 'run', data: { run_id: r.id }, opts: { jobId: r.id, removeOnComplete: true } })));
      }
      let ended: { run: Run; started: string; now: string }[] = [];
      let writing = Promise.resolve();
      const writeBehind = () => {
        const items = ended;
        ended = [];
        if (write) writing = writing.then(async () => void (await Promise.all(items.flatMap((e) => endWrites(store, e.run, e.now, 'queued', e.started)))));
      };
      return costOf(redis, RUNS, async () => {
        let done = 0;
        await new Promise<void>((resolve) => {
          const worker = new Worker(
            'least',
            async (job) => {
              const r = byId.get((job.data as { run_id: string }).run_id)!;
              const e = eventsOf(r);
              const json = (ev: NewEvent) => JSON.stringify({ ...ev, at: new Date().toISOString() });
              const started = new Date().toISOString();
              if (!(await batch.call('least.start', [state(r), log.key(scopeOf(r))], [started, json(e.start)]))) throw new Error('started twice');
              await Promise.all(e.step.map((ev) => log.append(scopeOf(r), ev)));
              const now = new Date().toISOString();
              const end = [now, ...e.end.map(json), r.id];
              if (!(await batch.call('least.end', [state(r), log.key(scopeOf(r)), `${prefix}:running:bench`], end))) throw new Error('ended twice');
              if (ended.push({ run: r, started, now }) >= WRITE_BEHIND) writeBehind();
            },
            { connection, prefix, concurrency: CONCURRENCY },
          );
          worker.on('completed', () => {
            if (++done === RUNS) void worker.close().then(() => resolve());
          });
        });
        writeBehind();
        await writing;
      });
    });
  } finally {
    await queue.close();
    connection.disconnect();
    await deleteRedisPrefix(prefix);
  }
}

/** The service's no-op runs through its workers (stored first; the clock from the workers' start to the last end). */
async function serviceRuns(redis: Redis): Promise<Cost> {
  return service(async (rt) => {
    for (let i = 0; i < RUNS; i++) await rt.engine.runs.create('bench', { kind: 'autonomy', steps: NOOP, trigger: { type: 'api' } });
    let workers: Awaited<ReturnType<typeof startWorkers>> | undefined;
    try {
      return await costOf(redis, RUNS, async () => {
        workers = await startWorkers(rt);
        while ((await runsFinished(rt)) < RUNS) await new Promise((r) => setTimeout(r, 10));
      });
    } finally {
      await workers?.close();
    }
  });
}

export async function floorBenchmarks(): Promise<string[]> {
  const step = (what: string) => process.stderr.write(`bench: ${what}\n`);
  const redis = new Redis(REDIS_URL);
  try {
    // BullMQ's job and the least engine in alternating rounds: a job costs a third less once warm
    const rounds: { job: Cost; least: Cost; bare: Cost }[] = [];
    for (let i = 0; i < ROUNDS; i++) {
      step(`the floor, round ${i + 1} of ${ROUNDS}: raw BullMQ, ${RUNS} jobs`);
      const job = await bullmqJob(redis);
      step(`the floor, round ${i + 1} of ${ROUNDS}: the least engine, ${RUNS} runs, with and without the store`);
      rounds.push({ job, least: await leastEngine(redis, true), bare: await leastEngine(redis, false) });
    }
    const job = medianCost(rounds.map((r) => r.job));
    const least = medianCost(rounds.map((r) => r.least));
    const bare = medianCost(rounds.map((r) => r.bare));
    step(`the floor: the store's writes of ${RUNS} runs`);
    const writes = await storeWrites(redis);
    step(`the floor: the events of ${RUNS} runs`);
    const appends = await events(redis);
    step(`the floor: the service, ${RUNS} runs`);
    const ours = await serviceRuns(redis);
    const floor = { process: job.process + writes.process + appends.process, redis: job.redis + writes.redis + appends.redis };
    // a process bound by its own CPU, or by Redis's on the other core, runs at most this many a second
    const floorRate = Math.min(1000 / floor.process, 1000 / floor.redis);
    const f = (ms: number) => `${(ms * 1000).toFixed(0)} µs`;
    const row = (what: string, c: { process: number; redis: number }, rate: string) => `| ${what} | ${f(c.process)} | ${f(c.redis)} | ${rate} |`;
    return [
      row(`a no-op BullMQ job (${RUNS}, concurrency ${CONCURRENCY}; median of ${ROUNDS} rounds)`, job, `${job.rate.toFixed(0)} jobs/s`),
      row(`a run's store writes: its start, its end with its step's row, its session's move (SQLite, ${CONCURRENCY} runs a turn)`, writes, ''),
      row(`a run's six events (the event log, ${CONCURRENCY} runs a turn)`, appends, ''),
      row('the floor: the three together', floor, `at most ${floorRate.toFixed(0)} runs/s: ${(floorRate / job.rate).toFixed(2)} of BullMQ's rate`),
      row('the service: a no-op run through the workers', ours, `${ours.rate.toFixed(0)} runs/s: ${(ours.rate / job.rate).toFixed(2)}`),
      row(
        `the least engine: a run's state in Redis, a script a transition with its events, the store written once a run, ${WRITE_BEHIND} a commit`,
        least,
        `${least.rate.toFixed(0)} runs/s: ${(least.rate / job.rate).toFixed(2)}`,
      ),
      row('the least engine without the store', bare, `${bare.rate.toFixed(0)} runs/s: ${(bare.rate / job.rate).toFixed(2)}`),
    ];
  } finally {
    redis.disconnect();
  }
}
