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
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { Redis } from 'ioredis';
import { createEventLog, type Run, type StepRecord } from '../engine/platform/index.js';
import { openSqliteStore } from '../engine/store/sqlite/index.js';
import { startWorkers } from '../workers/index.js';
import { deleteRedisPrefix, uniquePrefix } from '../test/support/harness.js';
import { runFixture } from '../test/integration/store-contract.js';
import { rawJobs, runsFinished, service } from './runs.js';

const RUNS = Number(process.env.BENCH_RUNS ?? 10_000);
const CONCURRENCY = Number(process.env.BENCH_CONCURRENCY ?? 10);
const REDIS_URL = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
const NOOP = [{ tool: 'message' as const, args: { text: 'noop' } }];

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

/** The store's writes of each run, CONCURRENCY runs a turn: its start; then its end with its step, and its session's move. */
async function storeWrites(redis: Redis): Promise<Cost> {
  const dir = await fs.mkdtemp(path.join(os.tmpdir(), 'svc-bench-floor-'));
  const store = openSqliteStore(path.join(dir, 'service.db'));
  try {
    const at = new Date().toISOString();
    const runs = Array.from({ length: RUNS }, () => queuedRun(at));
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
          created_at: at,
          updated_at: at,
        }),
      ]);
    return await costOf(redis, RUNS, async () => {
      for (let i = 0; i < RUNS; i += CONCURRENCY) {
        const group = runs.slice(i, i + CONCURRENCY);
        await Promise.all(
          group.map((r) =>
            store.runs.update('bench', r.id, { status: 'running', started_at: new Date().toISOString(), sandbox: 'none' }, { status: ['queued'], attempt: 1 }),
          ),
        );
        const now = new Date().toISOString();
        const step: StepRecord = {
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
        } as StepRecord;
        await Promise.all(
          group.flatMap((r) => [
            store.runs.update(
              'bench',
              r.id,
              { status: 'succeeded', finished_at: now, duration_ms: 1, summary: '1 step succeeded', usage: { steps: 1, model_turns: 0, seconds: 0.001 } },
              { status: ['running'], attempt: 1 },
              [step],
            ),
            store.sessions.update('bench', r.session_id, { status: 'idle', outcome: 'succeeded', updated_at: now }, ['running']),
          ]),
        );
      }
    });
  } finally {
    await store.close();
    await fs.rm(dir, { recursive: true, force: true });
  }
}

/** The six events of each run, CONCURRENCY runs a turn, in the three turns the engine asks for them. */
async function events(redis: Redis): Promise<Cost> {
  const prefix = uniquePrefix();
  const connection = new Redis(REDIS_URL, { maxRetriesPerRequest: null });
  const log = createEventLog(connection, prefix);
  try {
    return await costOf(redis, RUNS, async () => {
      for (let i = 0; i < RUNS; i += CONCURRENCY) {
        const group = Array.from({ length: Math.min(CONCURRENCY, RUNS - i) }, () => queuedRun(''));
        const of = (r: Run) => ({ tenant_id: r.tenant_id, session_id: r.session_id, run_id: r.id });
        const scope = (r: Run) => `session:${r.session_id}`;
        await Promise.all(
          group.map((r) =>
            log.append(scope(r), { ...of(r), type: 'run.started', data: { kind: 'autonomy', attempt: 1, budget: r.budget, queued_ms: 3, sandbox: 'none' } }),
          ),
        );
        await Promise.all(
          group.flatMap((r) => [
            log.append(scope(r), { ...of(r), type: 'step.started', data: { index: 0, tool: 'message', name: null, args: { text: 'noop' }, source: 'plan' } }),
            log.append(scope(r), { ...of(r), type: 'message.created', data: { role: 'assistant', text: 'noop', step: 0 } }),
            log.append(scope(r), { ...of(r), type: 'step.finished', data: { index: 0, tool: 'message', status: 'succeeded', duration_ms: 0, error: null } }),
          ]),
        );
        await Promise.all(
          group.flatMap((r) => [
            log.append(scope(r), {
              ...of(r),
              type: 'run.finished',
              data: { status: 'succeeded', attempt: 1, summary: '1 step succeeded', error: null, duration_ms: 1, result: null },
            }),
            log.append(scope(r), {
              type: 'session.updated',
              tenant_id: r.tenant_id,
              session_id: r.session_id,
              data: { status: 'idle', outcome: 'succeeded', title: '1 step' },
            }),
          ]),
        );
      }
    });
  } finally {
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
    step(`the floor: raw BullMQ, ${RUNS} jobs`);
    const job = await bullmqJob(redis);
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
      row(`a no-op BullMQ job (${RUNS}, concurrency ${CONCURRENCY})`, job, `${job.rate.toFixed(0)} jobs/s`),
      row(`a run's store writes: its start, its end with its step's row, its session's move (SQLite, ${CONCURRENCY} runs a turn)`, writes, ''),
      row(`a run's six events (the event log, ${CONCURRENCY} runs a turn)`, appends, ''),
      row('the floor: the three together', floor, `at most ${floorRate.toFixed(0)} runs/s: ${(floorRate / job.rate).toFixed(2)} of BullMQ's rate`),
      row('the service: a no-op run through the workers', ours, `${ours.rate.toFixed(0)} runs/s: ${(ours.rate / job.rate).toFixed(2)}`),
    ];
  } finally {
    redis.disconnect();
  }
}
