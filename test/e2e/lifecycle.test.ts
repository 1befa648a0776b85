// The run lifecycle under faults: every run reaches an end and every tenant slot is freed, whatever
// fails (the store once, a job lost or failed, a worker gone); retry policies, re-runs and the list.
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { UnrecoverableError, Worker } from 'bullmq';
import { expect } from 'chai';
import { jobIdOfRun } from '../../engine/platform/index.js';
import { ConfigError, parseEnv } from '../../config/env.js';
import { createLogger } from '../../engine/platform/index.js';
import { openRuntime } from '../../engine/process/index.js';
import { createTenantSlots } from '../../engine/runs/index.js';
import { runFixture } from '../integration/store-contract.js';
import {
  deleteRedisPrefix,
  eventually,
  finishedRun,
  heldTogether,
  KEYS,
  refusalToOpen,
  sameDeployment,
  startHarness,
  type Harness,
} from '../support/harness.js';

type Body = Record<string, any>;

/** The job of an API run's attempt. */
const jobOf = (id: string, attempt: number) => jobIdOfRun({ id, session_id: '', trigger: { type: 'api' } }, attempt);

describe('run lifecycle', function () {
  this.timeout(40_000);
  let h: Harness;
  before(async () => {
    h = await startHarness({ env: { SERVICE_TENANT_MAX_RUNNING: '3' } });
  });
  after(async () => {
    await h.close();
  });

  const start = async (body: object, key = KEYS.a) => {
    const res = await h.call<Body>('POST', '/api/v1/autonomy/run', { body, key });
    expect(res.status, res.text).to.equal(202);
    return res.body.run_id as string;
  };
  const slotsOf = async (tenant: string) => ({ running: await h.rt.engine.runs.reliabilityContext(tenant).then((c) => c.tenant.running) });

  it('finishes a run whose store read failed once inside the worker (the job is retried), and frees its slot', async () => {
    const runs = h.rt.store.runs;
    const original = runs.get.bind(runs);
    let failed = 0;
    runs.get = async (tenantId, id) => {
      if (tenantId === 'tenant-a' && failed === 0 && new Error().stack?.includes('execute')) {
        failed++;
        throw new Error('SQLITE_BUSY: injected once');
      }
      return original(tenantId, id);
    };
    try {
      const id = await start({ steps: [{ tool: 'shell', args: { command: 'echo survived' } }] });
      const run = await finishedRun(h, id);
      expect(failed).to.equal(1);
      expect(run.status).to.equal('succeeded');
      expect(run.steps[0].output.stdout).to.equal('survived\n');
      await eventually(async () => (await slotsOf('tenant-a')).running === 0, 'the slot to be freed');
    } finally {
      runs.get = original;
    }
  });

  it('retries a failed attempt by the run’s policy, shows each attempt, and fails the attempt’s job in BullMQ', async () => {
    const marker = `retry-${Date.now()}`;
    const id = await start({
      steps: [{ tool: 'shell', args: { command: `if [ -f ${marker} ]; then echo second; else touch ${marker}; exit 7; fi` } }],
      retry: { attempts: 3, backoff: { type: 'fixed', delay_ms: 100 } },
    });
    const run = await finishedRun(h, id);
    expect(run.status).to.equal('succeeded');
    expect(run.attempt).to.equal(2);
    expect(run.attempts).to.have.length(1);
    expect(run.attempts[0]).to.deep.include({ attempt: 1, outcome: 'retried', status: 'failed' });
    expect(run.attempts[0].error.code).to.equal('nonzero-exit');
    expect(run.steps[0].output.stdout).to.equal('second\n');
    // the run's span is over both attempts and the backoff between them, as a cancel between two counts it
    expect(run.started_at).to.equal(run.attempts[0].started_at);
    expect(run.duration_ms).to.equal(Date.parse(run.finished_at) - Date.parse(run.attempts[0].started_at));
    expect(run.duration_ms).to.be.at.least(run.attempts[0].duration_ms + 100);
    const events = await h.rt.events.after(`session:${run.session_id}`, '0-0');
    expect(events.map((e) => e.type).filter((t) => t.startsWith('run.'))).to.deep.equal([
      'run.queued',
      'run.started',
      'run.retrying',
      'run.started',
      'run.finished',
    ]);
    const first = await eventually(async () => {
      const job = await h.rt.queues.get('runs').getJob(jobOf(id, 1));
      return (await job?.getState()) === 'failed' ? job : null;
    }, 'attempt 1’s job to fail');
    expect(first.failedReason).to.match(/retrying as attempt 2/);
    await eventually(async () => (await (await h.rt.queues.get('runs').getJob(jobOf(id, 2)))?.getState()) === 'completed', 'attempt 2’s job to complete');
  });

  it('does not retry a timed-out run unless asked, and stops after the policy’s attempts', async () => {
    const timedOut = await finishedRun(h, await start({ steps: [{ tool: 'shell', args: { command: 'sleep 5' } }], budget_seconds: 1, retry: { attempts: 3 } }));
    expect(timedOut).to.deep.include({ status: 'timed_out', attempt: 1 });
    const exhausted = await finishedRun(
      h,
      await start({ steps: [{ tool: 'shell', args: { command: 'exit 1' } }], retry: { attempts: 2, backoff: { type: 'fixed', delay_ms: 50 } } }),
    );
    expect(exhausted).to.deep.include({ status: 'failed', attempt: 2 });
    expect(exhausted.attempts.map((a: Body) => a.outcome)).to.deep.equal(['retried']);
    // the last attempt's job failed too: the dashboard's Failed tab shows the run
    // (the job fails just after the run's end is written)
    const job = await eventually(async () => {
      const j = await h.rt.queues.get('runs').getJob(jobOf(exhausted.id, 2));
      return (await j?.getState()) === 'failed' ? j : null;
    }, 'the last attempt’s job to fail');
    expect(job.failedReason).to.match(/run failed: nonzero-exit/);
  });

  it('cancels a running run whose cancel message was lost (its listener reconnecting): its key is read again', async () => {
    const id = await start({ steps: [{ tool: 'shell', args: { command: 'sleep 30' } }] });
    await eventually(async () => (await h.call<Body>('GET', `/api/v1/runs/${id}`)).body.steps[0]?.status === 'running', 'the step to run', 15_000);
    // what runs.cancel writes, without the message that a reconnecting listener would miss
    await h.rt.redis.set(`${h.config.queuePrefix}:run-cancel:${id}`, '1', 'EX', 60);
    const run = await finishedRun(h, id);
    expect(run).to.deep.include({ status: 'canceled', attempt: 1 });
  });

  it('cancels, never retries, a run whose failed attempt settled into its backoff while the cancel was asked for', async () => {
    const id = await start({ steps: [{ tool: 'shell', args: { command: 'exit 3' } }], retry: { attempts: 2, backoff: { type: 'fixed', delay_ms: 4000 } } });
    const waiting = await eventually(async () => {
      const r = (await h.call<Body>('GET', `/api/v1/runs/${id}`)).body;
      return r.status === 'queued' && r.attempt === 2 ? r : null;
    }, 'the first attempt to fail into its backoff');
    // the cancel's first read finds the attempt still running (it settles just after), as a cancel racing the settle does
    const get = h.rt.store.runs.get;
    let stale = true;
    h.rt.store.runs.get = (async (...args: Parameters<typeof get>) => {
      const r = await get.apply(h.rt.store.runs, args);
      if (r && r.id === id && stale) {
        stale = false;
        return { ...r, status: 'running', attempt: 1 };
      }
      return r;
    }) as typeof get;
    let canceled: Body;
    try {
      canceled = await h.call<Body>('POST', `/api/v1/runs/${id}/cancel`);
    } finally {
      h.rt.store.runs.get = get;
    }
    expect(canceled.status, canceled.text).to.equal(200);
    expect(canceled.body.status).to.equal('canceled');
    // its backoff over, the second attempt never starts
    await new Promise((r) => setTimeout(r, 4500));
    const after = (await h.call<Body>('GET', `/api/v1/runs/${id}`)).body;
    expect(after).to.deep.include({ status: 'canceled', attempt: waiting.attempt });
    const events = await h.rt.events.after(`session:${after.session_id}`, '0-0');
    expect(events.filter((e) => e.type === 'run.started')).to.have.length(1);
  });

  it('ends canceled a run whose cancel was answered 202 after its attempt’s work was done but before its end was written', async () => {
    const id = await start({ steps: [{ tool: 'shell', args: { command: 'true' } }] });
    // its end, succeeded, held until the cancel has been answered: the cancel's write comes first
    const update = h.rt.store.runs.update;
    let open!: () => void;
    const gate = new Promise<void>((r) => (open = r));
    let held = false;
    h.rt.store.runs.update = (async (...args: Parameters<typeof update>) => {
      if (args[1] === id && args[2].status === 'succeeded' && !held) {
        held = true;
        await gate;
      }
      return update.apply(h.rt.store.runs, args);
    }) as typeof update;
    try {
      await eventually(() => held || null, 'the end to be held');
      const asked = await h.call<Body>('POST', `/api/v1/runs/${id}/cancel`);
      expect(asked.status, asked.text).to.equal(202);
      expect(asked.body.status).to.equal('running');
    } finally {
      open();
      h.rt.store.runs.update = update;
    }
    const run = await finishedRun(h, id);
    expect(run).to.deep.include({ status: 'canceled', summary: 'canceled (its attempt had ended succeeded)' });
    expect(run.error).to.deep.equal({ code: 'canceled', message: 'canceled while running' });
    // what the attempt did is kept: its step ran and succeeded
    expect(run.steps.map((st: Body) => st.status)).to.deep.equal(['succeeded']);
    const events = await h.rt.events.after(`session:${run.session_id}`, '0-0');
    expect(events.filter((e) => e.type === 'run.finished').map((e) => (e.data as Body).status)).to.deep.equal(['canceled']);
  });

  it('answers one of two cancels of a queued run sent at once 200 and the other 409, as if it came after', async () => {
    const idle = await startHarness({ workers: false });
    try {
      const made = await idle.call<Body>('POST', '/api/v1/autonomy/run', { body: { steps: [{ tool: 'shell', args: { command: 'true' } }] } });
      expect(made.status, made.text).to.equal(202);
      const id = made.body.run_id as string;
      // both read it queued before either cancels it
      const release = heldTogether(idle.rt.store.runs, 'get', 2);
      let answers: Body[];
      try {
        answers = await Promise.all([1, 2].map(() => idle.call<Body>('POST', `/api/v1/runs/${id}/cancel`)));
      } finally {
        release();
      }
      expect(answers.map((a) => a.status).sort()).to.deep.equal([200, 409]);
      const refused = answers.find((a) => a.status === 409)!;
      expect(refused.body.detail).to.equal(`run ${id} is canceled already`);
      // the loser neither asked a worker to stop it nor kept a cancel for it
      expect(await idle.rt.redis.exists(`${idle.config.queuePrefix}:run-cancel:${id}`)).to.equal(0);
      expect((await idle.call<Body>('GET', `/api/v1/runs/${id}`)).body.status).to.equal('canceled');
    } finally {
      await idle.close();
    }
  });

  it('ends the session of a run whose process died after storing its end, before its hooks ran, when its job comes back (it said running for good)', async () => {
    const idle = await startHarness({ workers: false });
    try {
      const made = await idle.call<Body>('POST', '/api/v1/autonomy/run', { body: { steps: [{ tool: 'shell', args: { command: 'true' } }] } });
      expect(made.status, made.text).to.equal(202);
      const { run_id: id, session_id: sessionId } = made.body as { run_id: string; session_id: string };
      // what the dead process left: the run's end stored, its session not moved (its hook never ran), its job not completed
      const at = new Date().toISOString();
      expect(await idle.rt.store.runs.update('tenant-a', id, { status: 'running', started_at: at }, { status: ['queued'] })).not.to.equal(null);
      expect(await idle.rt.store.runs.update('tenant-a', id, { status: 'succeeded', finished_at: at }, { status: ['running'] })).not.to.equal(null);
      expect((await idle.call<Body>('GET', `/api/v1/sessions/${sessionId}`)).body).to.deep.include({ status: 'running', outcome: null });
      // the stalled job delivered again finds the run ended
      expect(await idle.rt.engine.executor.execute(id, 'tenant-a', 1)).to.equal(null);
      expect((await idle.call<Body>('GET', `/api/v1/sessions/${sessionId}`)).body).to.deep.include({ status: 'idle', outcome: 'succeeded' });
      // the run's end its process never told is told now
      const finishedEvents = async () => (await idle.rt.events.after(`session:${sessionId}`, '0-0', 100)).filter((e) => e.type === 'run.finished');
      expect((await finishedEvents()).map((e) => (e.data as Body).status)).to.deep.equal(['succeeded']);
      // again: nothing more changes, nor is the session's end or the run's told again
      const ended = (await idle.call<Body>('GET', `/api/v1/sessions/${sessionId}`)).body;
      await idle.rt.engine.executor.execute(id, 'tenant-a', 1);
      expect((await idle.call<Body>('GET', `/api/v1/sessions/${sessionId}`)).body).to.deep.equal(ended);
      expect(await finishedEvents()).to.have.length(1);
      // an archived one takes the outcome once
      const other = await idle.call<Body>('POST', '/api/v1/autonomy/run', { body: { steps: [{ tool: 'shell', args: { command: 'true' } }] } });
      const otherId = other.body.run_id as string;
      expect((await idle.call('DELETE', `/api/v1/sessions/${other.body.session_id}`)).status).to.be.oneOf([200, 202]);
      const archived = (await idle.call<Body>('GET', `/api/v1/sessions/${other.body.session_id}`)).body;
      expect(archived.status).to.equal('archived');
      if (archived.outcome === null) {
        await idle.rt.store.runs.update('tenant-a', otherId, { status: 'running', started_at: at }, { status: ['queued'] });
        await idle.rt.store.runs.update('tenant-a', otherId, { status: 'succeeded', finished_at: at }, { status: ['running'] });
      }
      const count = async () =>
        (await idle.rt.events.after(`session:${other.body.session_id}`, '0-0')).filter((e) => e.type === 'session.updated' && (e.data as Body).outcome).length;
      await idle.rt.engine.executor.execute(otherId, 'tenant-a', 1);
      const told = await count();
      await idle.rt.engine.executor.execute(otherId, 'tenant-a', 1);
      await idle.rt.engine.executor.execute(otherId, 'tenant-a', 1);
      expect(await count(), 'the archived session’s end told once').to.equal(told);
    } finally {
      await idle.close();
    }
  });

  it('tells a run’s run.queued before the reconciler puts it in line when its process died after storing it, once', async () => {
    const idle = await startHarness({ workers: false });
    try {
      // stored, and nothing more: the process died before the event and the run's place in line
      const run = runFixture('tenant-a', {
        kind: 'autonomy',
        plan: [{ tool: 'message', args: { text: 'hi' } }],
        tool_allowlist: ['message'],
        created_at: new Date(Date.now() - 60_000).toISOString(),
      });
      expect(await idle.rt.store.runs.insert(run)).to.equal(null);
      const told = async () => (await idle.rt.events.after(`session:${run.session_id}`, '0-0', 100)).filter((e) => e.run_id === run.id).map((e) => e.type);
      expect(await told()).to.deep.equal([]);
      expect(await idle.rt.engine.runs.reconcile({ olderThanMs: 0 })).to.deep.include({ requeued: 1 });
      expect(await told()).to.deep.equal(['run.queued']);
      expect(await (await idle.rt.queues.get('runs').getJob(jobIdOfRun(run, 1)))!.getState()).to.equal('waiting');
      // put in line again (its job lost once more): told once
      await (await idle.rt.queues.get('runs').getJob(jobIdOfRun(run, 1)))!.remove();
      expect(await idle.rt.engine.runs.reconcile({ olderThanMs: 0 })).to.deep.include({ requeued: 1 });
      expect(await told()).to.deep.equal(['run.queued']);
    } finally {
      await idle.close();
    }
  });

  it('gives no slot back to a run the reconciler listed as running that ended before it reached it', async () => {
    const idle = await startHarness({ workers: false });
    try {
      const at = new Date(Date.now() - 60_000).toISOString();
      const run = runFixture('tenant-a', { kind: 'autonomy', status: 'running', started_at: at, created_at: at });
      expect(await idle.rt.store.runs.insert(run)).to.equal(null);
      const slots = `${idle.config.queuePrefix}:tenant:tenant-a:running`;
      // the run ends (its end gives its slot back) just after the pass has listed it as running
      const runs = idle.rt.store.runs;
      const listStale = runs.listStale.bind(runs);
      runs.listStale = async (...args) => {
        const listed = await listStale(...args);
        for (const r of listed)
          if (r.id === run.id) await runs.update('tenant-a', r.id, { status: 'succeeded', finished_at: new Date().toISOString() }, { status: ['running'] });
        return listed;
      };
      try {
        // a process says it executes it: the pass would keep its slot
        await idle.rt.engine.runs.reconcile({ olderThanMs: 0, isExecuting: (id) => id === run.id });
      } finally {
        runs.listStale = listStale;
      }
      expect(await idle.rt.redis.smembers(slots)).to.deep.equal([]);
    } finally {
      await idle.close();
    }
  });

  it('keeps the slot of a run another process started when its job, delivered twice, loses the start here', async () => {
    const idle = await startHarness({ workers: false, env: { SERVICE_TENANT_MAX_RUNNING: '1' } });
    try {
      // a session task's run takes its slot again at its start (it may have been held by a pause)
      const session = (await idle.call<Body>('POST', '/api/v1/sessions', { body: { title: 'twice' } })).body.id as string;
      const added = await idle.call<Body>('POST', `/api/v1/sessions/${session}/tasks`, {
        body: { id: 'only', steps: [{ tool: 'shell', args: { command: 'true' } }] },
      });
      expect(added.status, added.text).to.equal(201);
      const task = await eventually(async () => (await idle.rt.store.tasks.get('tenant-a', session, 'only'))?.run_ids[0], 'the task’s run');
      const slots = `${idle.config.queuePrefix}:tenant:tenant-a:running`;
      expect(await idle.rt.redis.smembers(slots)).to.deep.equal([task]);
      // another process starts this attempt just before this one does (the same job, delivered again after a stall)
      const runs = idle.rt.store.runs;
      const update = runs.update.bind(runs);
      let raced = false;
      runs.update = async (tenantId, id, changes, guard, steps) => {
        if (!raced && id === task && changes.status === 'running') {
          raced = true;
          expect(await update(tenantId, id, { ...changes }, guard, steps)).not.to.equal(null);
        }
        return update(tenantId, id, changes, guard, steps);
      };
      try {
        expect(await idle.rt.engine.executor.execute(task, 'tenant-a', 1)).to.equal(null);
      } finally {
        runs.update = update;
      }
      expect(raced).to.equal(true);
      expect((await idle.rt.store.runs.get('tenant-a', task))!.status).to.equal('running');
      // the slot is the running run's still: the next run of the tenant waits in line
      expect(await idle.rt.redis.smembers(slots)).to.deep.equal([task]);
      const next = await idle.call<Body>('POST', '/api/v1/autonomy/run', { body: { steps: [{ tool: 'shell', args: { command: 'true' } }] } });
      expect(next.status, next.text).to.equal(202);
      expect(await idle.rt.redis.smembers(slots)).to.deep.equal([task]);
    } finally {
      await idle.close();
    }
  });

  it('puts a new run in line though Redis refused its run.queued event or its whole first round trip (an error, not silence)', async () => {
    // no reconciler pass during the test: what queues the run is the run's own retry
    const own = await startHarness({ env: { SERVICE_RECONCILE_INTERVAL_SECONDS: '3600' } });
    const events = own.rt.events;
    const append = events.append.bind(events);
    try {
      const create = async () => {
        const res = await own.call<Body>('POST', '/api/v1/autonomy/run', { body: { steps: [{ tool: 'shell', args: { command: 'true' } }] } });
        expect(res.status, res.text).to.equal(202);
        return res.body.run_id as string;
      };
      const typesOf = async (run: Body) => (await own.rt.events.after(`session:${run.session_id}`, '0-0')).map((e) => e.type);
      // run.queued refused once, as a failover's READONLY answers
      let refusals = 0;
      events.append = async (scope, event) => {
        if (event.type === 'run.queued' && !refusals++) throw new Error('READONLY You can’t write against a read only replica.');
        return append(scope, event);
      };
      const first = await finishedRun(own, await create());
      expect(first.status).to.equal('succeeded');
      expect(refusals).to.equal(2);
      expect((await typesOf(first)).slice(0, 5)).to.deep.equal(['run.queued', 'run.started', 'step.started', 'step.finished', 'run.finished']);
      events.append = append;
      // the engine's whole round trip of a turn (the event and the tenant's slot) refused once
      const redis = own.rt.redis as unknown as Record<string, (...args: unknown[]) => Promise<unknown>>;
      const name =
        Object.keys(redis).find((k) => /^engineBatch\d+$/.test(k)) ??
        Object.getOwnPropertyNames(Object.getPrototypeOf(redis)).find((k) => /^engineBatch\d+$/.test(k));
      expect(name, 'the engine batch command').to.be.a('string');
      const batch = redis[name!]!;
      let loading = 0;
      // the call that carries the new run's event and its admission (both asked in one turn), refused
      redis[name!] = async (...args: unknown[]) => {
        if (args.includes('slots.admit') && JSON.stringify(args).includes('run.queued') && !loading++)
          throw new Error('LOADING Redis is loading the dataset in memory');
        return batch.apply(own.rt.redis, args);
      };
      try {
        const second = await finishedRun(own, await create());
        expect(second.status).to.equal('succeeded');
        expect(loading, 'the round trip refused').to.equal(1);
        expect((await typesOf(second)).slice(0, 2)).to.deep.equal(['run.queued', 'run.started']);
      } finally {
        redis[name!] = batch;
      }
    } finally {
      events.append = append;
      await own.close();
    }
  });

  it('deletes an ended run SERVICE_RUNS_KEPT_DAYS after it was made, with its steps and its own session', async () => {
    let ahead = 0;
    const own = await startHarness({ env: { SERVICE_RUNS_KEPT_DAYS: '7' }, runtime: { clock: { now: () => new Date(Date.now() + ahead) } } });
    try {
      const made = await own.call<Body>('POST', '/api/v1/autonomy/run', { body: { steps: [{ tool: 'shell', args: { command: 'true' } }] } });
      const run = await finishedRun(own, made.body.run_id);
      expect(run.status).to.equal('succeeded');
      const reconcile = () => own.rt.engine.runs.reconcile({ isExecuting: () => false });
      // six days on: kept
      ahead = 6 * 86_400_000;
      await reconcile();
      expect((await own.call('GET', `/api/v1/runs/${run.id}`)).status).to.equal(200);
      // eight: gone, its steps and its session with it
      ahead = 8 * 86_400_000;
      await reconcile();
      expect((await own.call('GET', `/api/v1/runs/${run.id}`)).status).to.equal(404);
      expect((await own.call('GET', `/api/v1/sessions/${run.session_id}`)).status).to.equal(404);
      expect(await own.rt.store.runs.steps('tenant-a', run.id, 1)).to.deep.equal([]);
    } finally {
      await own.close();
    }
  });

  it('keeps a run its Idempotency-Key’s day and an hour more, however short SERVICE_RUNS_KEPT_DAYS is', async () => {
    let ahead = 0;
    const own = await startHarness({ env: { SERVICE_RUNS_KEPT_DAYS: '1' }, runtime: { clock: { now: () => new Date(Date.now() + ahead) } } });
    try {
      const made = await own.call<Body>('POST', '/api/v1/autonomy/run', {
        body: { steps: [{ tool: 'shell', args: { command: 'true' } }] },
        headers: { 'idempotency-key': 'kept-a-day' },
      });
      expect((await finishedRun(own, made.body.run_id)).status).to.equal('succeeded');
      const reconcile = () => own.rt.engine.runs.reconcile({ isExecuting: () => false });
      // a day and half an hour on: past its one day, not past its key's day and the hour
      ahead = 24.5 * 3_600_000;
      await reconcile();
      expect((await own.call('GET', `/api/v1/runs/${made.body.run_id}`)).status).to.equal(200);
      ahead = 25.5 * 3_600_000;
      await reconcile();
      expect((await own.call('GET', `/api/v1/runs/${made.body.run_id}`)).status).to.equal(404);
    } finally {
      await own.close();
    }
  });

  it('keeps every run at the longest SERVICE_RUNS_KEPT_DAYS, whose days reach back before 1970 (no run id is made there)', async () => {
    const own = await startHarness({ env: { SERVICE_RUNS_KEPT_DAYS: '36500' }, workers: false });
    try {
      // a cutoff before 1970 has no run id: each pass threw (ULID's time must be positive) and logged a failure
      expect(await own.rt.engine.runs.reconcile({ isExecuting: () => false })).to.deep.equal({ requeued: 0, lost: 0, freed: 0 });
    } finally {
      await own.close();
    }
  });

  it('deletes an archived session SERVICE_RUNS_KEPT_DAYS after its work ended, with its tasks, messages and runs; one not archived stays', async () => {
    let ahead = 0;
    const own = await startHarness({ env: { SERVICE_RUNS_KEPT_DAYS: '7' }, runtime: { clock: { now: () => new Date(Date.now() + ahead) } } });
    try {
      const ended = async (title: string) => {
        const s = (await own.call<Body>('POST', '/api/v1/sessions', { body: { title } })).body;
        const added = await own.call<Body>('POST', `/api/v1/sessions/${s.id}/tasks`, {
          body: { id: 'one', steps: [{ tool: 'shell', args: { command: 'true' } }] },
        });
        expect(added.status, added.text).to.equal(201);
        await own.call('POST', `/api/v1/sessions/${s.id}/messages`, { body: { role: 'user', parts: [{ type: 'text', text: 'hello' }] } });
        await eventually(async () => (await own.call<Body>('GET', `/api/v1/sessions/${s.id}`)).body.outcome === 'succeeded', 'the session to end');
        const runs = (await own.call<Body>('GET', `/api/v1/sessions/${s.id}/runs`)).body.data as Body[];
        expect(runs).to.have.length(1);
        return { id: s.id as string, run: runs[0]!.id as string };
      };
      const archived = await ended('archived');
      const open = await ended('open');
      expect((await own.call('DELETE', `/api/v1/sessions/${archived.id}`)).status).to.be.oneOf([200, 202]);
      await eventually(async () => (await own.call<Body>('GET', `/api/v1/sessions/${archived.id}`)).body.status === 'archived', 'the archive');
      const reconcile = () => own.rt.engine.sessions.reconcile();
      ahead = 6 * 86_400_000;
      await reconcile();
      expect((await own.call('GET', `/api/v1/sessions/${archived.id}`)).status).to.equal(200);
      ahead = 8 * 86_400_000;
      await reconcile();
      expect((await own.call('GET', `/api/v1/sessions/${archived.id}`)).status).to.equal(404);
      expect((await own.call('GET', `/api/v1/runs/${archived.run}`)).status).to.equal(404);
      expect(await own.rt.store.tasks.list('tenant-a', archived.id)).to.deep.equal([]);
      expect(await own.rt.store.messages.list('tenant-a', archived.id, { limit: 10 })).to.deep.equal([]);
      // a session not archived is the tenant's to keep: its tasks may be given more work
      expect((await own.call<Body>('GET', `/api/v1/sessions/${open.id}/tasks`)).body.data).to.have.length(1);
      expect((await own.call('GET', `/api/v1/runs/${open.run}`)).status).to.equal(200);
    } finally {
      await own.close();
    }
  });

  it('removes at a worker’s start the checkout a dead process left of a run that ended, never one of a run still running (the local tenant too)', async () => {
    for (const auth of ['none', 'keys']) {
      const own = await startHarness({ workers: false, env: auth === 'none' ? { SERVICE_AUTH: 'none' } : {} });
      try {
        const tenant = auth === 'none' ? 'local' : 'tenant-a';
        const root = auth === 'none' ? own.workspace : own.tenantDir();
        const ids: Record<string, string> = {};
        for (const status of ['running', 'failed'] as const) {
          const run = runFixture(tenant, { status, kind: 'autonomy' });
          await own.rt.store.runs.insert(run);
          ids[status] = run.id;
          await fs.mkdir(path.join(root, '.checkouts', run.id), { recursive: true });
          await fs.writeFile(path.join(root, '.checkouts', run.id, 'work.txt'), 'x');
        }
        // (and any checkout temp folder a killed process of this host left a day ago)
        expect(await own.rt.engine.runs.sweepLeftovers(), auth).to.be.at.least(1);
        expect(await fs.readdir(path.join(root, '.checkouts')), auth).to.deep.equal([ids.running]);
      } finally {
        await own.close();
      }
    }
  });

  it('carries an automation’s retry policy into its runs, with defaults filled in, and changes it by PATCH', async () => {
    const created = await h.call<Body>('POST', '/api/v1/automations', {
      body: { name: 'flaky', steps: [{ tool: 'shell', args: { command: 'exit 1' } }], retry: { attempts: 2, backoff: { delay_ms: 50 } } },
    });
    expect(created.status, created.text).to.equal(201);
    expect(created.body.retry).to.deep.equal({ attempts: 2, backoff: { type: 'exponential', delay_ms: 50 }, on: ['failed'] });
    const started = await h.call<Body>('POST', '/api/v1/automations/run', { body: { automation_id: created.body.id } });
    const run = await finishedRun(h, started.body.run_id);
    expect(run).to.deep.include({ status: 'failed', attempt: 2 });
    const patched = await h.call<Body>('PATCH', `/api/v1/automations/${created.body.id}`, { body: { retry: null } });
    expect(patched.body.retry).to.equal(null);
    const bad = await h.call<Body>('PATCH', `/api/v1/automations/${created.body.id}`, { body: { retry: { attempts: 0 } } });
    expect(bad.status).to.equal(400);
  });

  it('re-runs a finished run as a new run of the same request, linked to it; a run still going is a 409', async () => {
    const id = await start({ steps: [{ tool: 'shell', args: { command: 'echo again' } }], workspace: '.' });
    const first = await finishedRun(h, id);
    const res = await h.call<Body>('POST', `/api/v1/runs/${id}/rerun`);
    expect(res.status, res.text).to.equal(202);
    expect(res.body.run.rerun_of).to.equal(id);
    expect(res.body.session_id).not.to.equal(first.session_id);
    const second = await finishedRun(h, res.body.run_id);
    expect(second).to.deep.include({ status: 'succeeded', rerun_of: id, workspace: '.' });
    expect(second.trigger).to.deep.include({ type: 'rerun', run_id: id });
    expect(second.steps[0].output.stdout).to.equal('again\n');
    // the session takes the run's outcome in a write of its own, after the run's end
    const session = await eventually(async () => {
      const s = (await h.call<Body>('GET', `/api/v1/sessions/${second.session_id}`)).body;
      return s.outcome ? s : null;
    }, 'the rerun’s session to take its outcome');
    expect(session).to.deep.include({ kind: 'autonomy', status: 'idle', outcome: 'succeeded' });
    const slow = await start({ steps: [{ tool: 'shell', args: { command: 'sleep 3' } }] });
    expect((await h.call('POST', `/api/v1/runs/${slow}/rerun`)).status).to.equal(409);
    expect((await h.call('POST', `/api/v1/runs/${id}/rerun`, { key: KEYS.b })).status).to.equal(404);
    await h.call('POST', `/api/v1/runs/${slow}/cancel`);
    await finishedRun(h, slow);
    // a run whose workspace is gone since: a 409 that says so (the request has no body to name)
    await fs.mkdir(path.join(h.tenantDir(), 'gone-later'));
    const gone = await start({ steps: [{ tool: 'shell', args: { command: 'true' } }], workspace: 'gone-later' });
    await finishedRun(h, gone);
    await fs.rm(path.join(h.tenantDir(), 'gone-later'), { recursive: true });
    const refused = await h.call<Body>('POST', `/api/v1/runs/${gone}/rerun`);
    expect(refused.status, refused.text).to.equal(409);
    expect(refused.body.detail).to.equal(`run ${gone}'s workspace gone-later is no longer a folder inside the workspace root: it cannot run there again`);
    // a budget over a SERVICE_RUN_MAX_BUDGET_SECONDS lowered since: a 409 that names the run's budget, not a 400
    // about a body the request never had (the same deployment, restarted with the lower bound)
    const long = await start({ steps: [{ tool: 'message', args: { text: 'x' } }], budget_seconds: 2000 });
    await finishedRun(h, long);
    const lowered = await startHarness({
      workers: false,
      env: { ...sameDeployment(h), SERVICE_RUN_MAX_BUDGET_SECONDS: '300', SERVICE_RUN_DEFAULT_BUDGET_SECONDS: '120' },
    });
    try {
      const over = await lowered.call<Body>('POST', `/api/v1/runs/${long}/rerun`);
      expect(over.status, over.text).to.equal(409);
      expect(over.body.code).to.equal('conflict');
      expect(over.body.detail).to.equal(`run ${long} cannot run again as it ran: its budget_seconds must be at most 300 (SERVICE_RUN_MAX_BUDGET_SECONDS)`);
    } finally {
      await lowered.close();
    }
  });

  it('re-runs an automation’s run only while the automation is enabled, and never a session task’s run on its own', async () => {
    const created = await h.call<Body>('POST', '/api/v1/automations', { body: { name: 'rerun-me', steps: [{ tool: 'shell', args: { command: 'true' } }] } });
    const started = await h.call<Body>('POST', '/api/v1/automations/run', { body: { automation_id: created.body.id } });
    const run = await finishedRun(h, started.body.run_id);
    expect((await h.call('POST', `/api/v1/automations/${created.body.id}/disable`)).status).to.equal(200);
    const disabled = await h.call<Body>('POST', `/api/v1/runs/${run.id}/rerun`);
    expect(disabled.status).to.equal(409);
    expect(disabled.body.detail).to.contain('disabled');
    expect((await h.call('POST', `/api/v1/automations/${created.body.id}/enable`)).status).to.equal(200);
    const again = await h.call<Body>('POST', `/api/v1/runs/${run.id}/rerun`);
    expect(again.status).to.equal(202);
    await finishedRun(h, again.body.run_id);
    expect((await h.call('DELETE', `/api/v1/automations/${created.body.id}`)).status).to.be.oneOf([200, 204]);
    const archived = await h.call<Body>('POST', `/api/v1/runs/${run.id}/rerun`);
    expect(archived.status).to.equal(409);
    expect(archived.body.detail).to.contain('archived');
    // a task's run belongs to its session's DAG
    const session = (await h.call<Body>('POST', '/api/v1/sessions', { body: { title: 'no rerun' } })).body;
    await h.call('POST', `/api/v1/sessions/${session.id}/tasks`, { body: { id: 'once', steps: [{ tool: 'shell', args: { command: 'true' } }] } });
    const taskRun = await eventually(async () => {
      const t = (await h.call<Body>('GET', `/api/v1/sessions/${session.id}`)).body.tasks[0];
      return t.status === 'succeeded' ? t.run_ids[0] : null;
    }, 'the task to succeed');
    const refused = await h.call<Body>('POST', `/api/v1/runs/${taskRun}/rerun`);
    expect(refused.status).to.equal(409);
    expect(refused.body.detail).to.contain('task');
    const runs = (await h.call<Body>('GET', `/api/v1/runs?kind=session_task&limit=100`)).body.data;
    expect(runs.filter((r: Body) => r.rerun_of === taskRun)).to.deep.equal([]);
  });

  it('lists a tenant’s runs across kinds with filters and pages, and never another tenant’s', async () => {
    const b = await start({ steps: [{ tool: 'message', args: { text: 'b' } }] }, KEYS.b);
    await finishedRun(h, b, KEYS.b);
    const all = await h.call<Body>('GET', '/api/v1/runs?limit=2');
    expect(all.status).to.equal(200);
    expect(all.body.data).to.have.length(2);
    expect(all.body.next_cursor).to.be.a('string');
    expect(all.body.data[0]).not.to.have.property('steps');
    const next = await h.call<Body>('GET', `/api/v1/runs?limit=2&cursor=${all.body.next_cursor}`);
    expect(next.body.data[0].id < all.body.data[1].id).to.equal(true);
    const failed = await h.call<Body>('GET', '/api/v1/runs?status=failed&kind=autonomy&limit=100');
    expect(failed.body.data.length).to.be.at.least(1);
    expect(failed.body.data.every((r: Body) => r.status === 'failed' && r.kind === 'autonomy')).to.equal(true);
    const mine = await h.call<Body>('GET', '/api/v1/runs?limit=100');
    expect(mine.body.data.map((r: Body) => r.id)).not.to.include(b);
    expect(mine.body.data.every((r: Body) => !path.isAbsolute(r.workspace))).to.equal(true);
    expect((await h.call<Body>('GET', '/api/v1/runs?limit=100', { key: KEYS.b })).body.data.map((r: Body) => r.id)).to.deep.equal([b]);
    expect((await h.call('GET', '/api/v1/runs?status=nope')).status).to.equal(400);
  });

  it('repairs a queued run whose job failed or vanished, a running run whose job is gone, and a slot held by an ended run', async () => {
    const noWorkers = await startHarness({ workers: false });
    try {
      const post = async (command: string) =>
        (await noWorkers.call<Body>('POST', '/api/v1/autonomy/run', { body: { steps: [{ tool: 'shell', args: { command } }] } })).body.run_id as string;
      const queue = noWorkers.rt.queues.get('runs');
      // a job that used up its attempts while the run stayed queued
      const failedJob = await post('echo one');
      const connection = noWorkers.rt.redis.duplicate();
      const failing = new Worker(
        'runs',
        async () => {
          throw new UnrecoverableError('injected');
        },
        { connection, prefix: noWorkers.config.queuePrefix },
      );
      await eventually(async () => (await (await queue.getJob(jobOf(failedJob, 1)))?.getState()) === 'failed', 'the injected job failure');
      await failing.close();
      connection.disconnect();
      // a job removed from Redis
      const removed = await post('echo two');
      await queue.remove(jobOf(removed, 1));
      // a run marked running whose job is gone (its worker and its job lost together)
      const lost = await post('echo three');
      await queue.remove(jobOf(lost, 1));
      await noWorkers.rt.store.runs.update('tenant-a', lost, { status: 'running', started_at: new Date().toISOString() }, { status: ['queued'] });
      // the lost attempt had asked the model twice: its turns are kept as it goes, its usage only at its end
      for (const index of [0, 1])
        await noWorkers.rt.store.runs.appendTurn('tenant-a', lost, 1, {
          index,
          at: new Date().toISOString(),
          content: 'thinking',
          tool_calls: [],
          usage: { prompt_tokens: 10, completion_tokens: 5 },
        });
      // a slot still held by a run that ended (a crash between its end and the release)
      const ended = await post('echo four');
      await queue.remove(jobOf(ended, 1));
      await noWorkers.rt.store.runs.update('tenant-a', ended, { status: 'succeeded', finished_at: new Date().toISOString() }, { status: ['queued'] });
      expect((await noWorkers.rt.engine.runs.reliabilityContext('tenant-a')).tenant.running).to.equal(4);
      // a worker process beats its claims (none here); the reconciler judges runs lost once the registry is complete
      const stopClaims = noWorkers.rt.engine.runs.claims.start(() => [], 50);
      // complete once it is as old as a claim's lapse (six beats) since the first beat landed: seen, not waited
      // for (400 ms had left 100 ms for that first beat, which a busy machine can take)
      await eventually(async () => (await noWorkers.rt.engine.runs.claims.elsewhere()) !== null, 'the registry of claims to be complete');
      const repaired = await noWorkers.rt.engine.runs.reconcile({ olderThanMs: 0 });
      await stopClaims();
      expect(repaired).to.deep.equal({ requeued: 2, lost: 1, freed: 1 });
      // cut off by a crash, it runs again as its next attempt (SERVICE_RUN_LOST_RERUNS)
      const lostRun = (await noWorkers.rt.store.runs.get('tenant-a', lost))!;
      expect(lostRun).to.deep.include({ status: 'queued', attempt: 2 });
      expect(lostRun.attempts[0]).to.deep.include({ outcome: 'lost', status: 'failed' });
      expect(lostRun.attempts[0]!.error!.code).to.equal('worker-lost');
      expect(await (await queue.getJob(jobOf(lost, 2)))!.getState()).to.equal('waiting');
      // the lost attempt's usage counts what it kept: its turns and their tokens
      expect(lostRun.attempts.at(-1)!.usage).to.deep.include({ model_turns: 2, prompt_tokens: 20, completion_tokens: 10 });
      expect(await (await queue.getJob(jobOf(failedJob, 1)))!.getState()).to.equal('waiting');
      expect(await (await queue.getJob(jobOf(removed, 1)))!.getState()).to.equal('waiting');
      expect((await noWorkers.rt.engine.runs.reliabilityContext('tenant-a')).tenant.running).to.equal(2);
      expect(await noWorkers.rt.engine.runs.reconcile({ olderThanMs: 0 })).to.deep.equal({ requeued: 0, lost: 0, freed: 0 });
      // a run that ended within the window is being released by its own end: the reconciler leaves its slot
      const justEnded = await post('echo five');
      await queue.remove(jobOf(justEnded, 1));
      await noWorkers.rt.store.runs.update('tenant-a', justEnded, { status: 'succeeded', finished_at: new Date().toISOString() }, { status: ['queued'] });
      expect(await noWorkers.rt.engine.runs.reconcile({ olderThanMs: 60_000 })).to.deep.equal({ requeued: 0, lost: 0, freed: 0 });
      expect((await noWorkers.rt.engine.runs.reliabilityContext('tenant-a')).tenant.running).to.equal(3);
      await new Promise((r) => setTimeout(r, 5));
      expect(await noWorkers.rt.engine.runs.reconcile({ olderThanMs: 0 })).to.deep.equal({ requeued: 0, lost: 0, freed: 1 });
      expect((await noWorkers.rt.engine.runs.reliabilityContext('tenant-a')).tenant.running).to.equal(2);
    } finally {
      await noWorkers.close();
    }
  });

  it('runs a run cut off by a crash again as its next attempt, SERVICE_RUN_LOST_RERUNS times, then ends it worker-lost; a session task’s run ends at once', async () => {
    const noWorkers = await startHarness({ workers: false, env: { SERVICE_RUN_LOST_RERUNS: '1' } });
    try {
      const queue = noWorkers.rt.queues.get('runs');
      const id = (await noWorkers.call<Body>('POST', '/api/v1/autonomy/run', { body: { steps: [{ tool: 'shell', args: { command: 'true' } }] } })).body
        .run_id as string;
      /** its attempt started, then its worker and its job lost together */
      const crash = async (attempt: number) => {
        await queue.remove(jobOf(id, attempt));
        const at = new Date().toISOString();
        expect(await noWorkers.rt.store.runs.update('tenant-a', id, { status: 'running', started_at: at }, { status: ['queued'], attempt })).to.not.equal(null);
      };
      const stopClaims = noWorkers.rt.engine.runs.claims.start(() => [], 50);
      await eventually(async () => (await noWorkers.rt.engine.runs.claims.elsewhere()) !== null, 'the registry of claims to be complete');
      await crash(1);
      expect(await noWorkers.rt.engine.runs.reconcile({ olderThanMs: 0 })).to.deep.include({ lost: 1 });
      const again = (await noWorkers.rt.store.runs.get('tenant-a', id))!;
      expect(again).to.deep.include({ status: 'queued', attempt: 2, finished_at: null });
      expect(await (await queue.getJob(jobOf(id, 2)))!.getState()).to.equal('waiting');
      const told = await noWorkers.rt.events.after(`session:${again.session_id}`, '0-0', 100);
      expect(told.find((e) => e.type === 'run.retrying')?.data).to.deep.include({ attempt: 1, next_attempt: 2, status: 'failed', delay_ms: 0 });
      // lost once more: it has run again as often as it may, and ends
      await crash(2);
      await noWorkers.rt.engine.runs.reconcile({ olderThanMs: 0 });
      const lost = (await noWorkers.rt.store.runs.get('tenant-a', id))!;
      expect(lost).to.deep.include({ status: 'failed', attempt: 2 });
      expect(lost.error!.code).to.equal('worker-lost');
      expect(lost.attempts.map((a) => a.outcome)).to.deep.equal(['lost', 'lost']);
      // a session task's run ends: its task, not its run, runs again (max_attempts)
      const session = (await noWorkers.call<Body>('POST', '/api/v1/sessions', { body: { title: 'lost' } })).body.id as string;
      const added = await noWorkers.call<Body>('POST', `/api/v1/sessions/${session}/tasks`, {
        body: { id: 't', max_attempts: 1, steps: [{ tool: 'shell', args: { command: 'true' } }] },
      });
      expect(added.status, added.text).to.equal(201);
      const taskRun = await eventually(async () => {
        const runs = (await noWorkers.call<Body>('GET', `/api/v1/sessions/${session}/runs`)).body.data as Body[];
        return runs[0]?.id as string | undefined;
      }, 'the task’s run');
      await queue.remove(`${session}__t__1`);
      await noWorkers.rt.store.runs.update('tenant-a', taskRun, { status: 'running', started_at: new Date().toISOString() }, { status: ['queued'] });
      await noWorkers.rt.engine.runs.reconcile({ olderThanMs: 0 });
      await stopClaims();
      const ofTask = (await noWorkers.rt.store.runs.get('tenant-a', taskRun))!;
      expect(ofTask).to.deep.include({ status: 'failed', attempt: 1 });
      expect(ofTask.error!.code).to.equal('worker-lost');
    } finally {
      await noWorkers.close();
    }
  });

  it('holds a lost run to its retry policy when the policy covers its end, and ends canceled one whose cancel was stored after it was read', async () => {
    const noWorkers = await startHarness({ workers: false });
    try {
      const queue = noWorkers.rt.queues.get('runs');
      const post = async (body: Body) => (await noWorkers.call<Body>('POST', '/api/v1/autonomy/run', { body })).body.run_id as string;
      const stopClaims = noWorkers.rt.engine.runs.claims.start(() => [], 50);
      await eventually(async () => (await noWorkers.rt.engine.runs.claims.elsewhere()) !== null, 'the registry of claims to be complete');
      const crash = async (id: string, attempt: number) => {
        await queue.remove(jobOf(id, attempt));
        await noWorkers.rt.store.runs.update('tenant-a', id, { status: 'running', started_at: new Date().toISOString() }, { status: ['queued'], attempt });
      };
      // a policy of two attempts: lost twice, it ends (SERVICE_RUN_LOST_RERUNS does not add attempts to a policy that covers the end)
      const retried = await post({ steps: [{ tool: 'shell', args: { command: 'true' } }], retry: { attempts: 2, backoff: { type: 'fixed', delay_ms: 100 } } });
      await crash(retried, 1);
      await noWorkers.rt.engine.runs.reconcile({ olderThanMs: 0 });
      expect(await noWorkers.rt.store.runs.get('tenant-a', retried)).to.deep.include({ status: 'queued', attempt: 2 });
      await crash(retried, 2);
      await noWorkers.rt.engine.runs.reconcile({ olderThanMs: 0 });
      const spent = (await noWorkers.rt.store.runs.get('tenant-a', retried))!;
      expect(spent).to.deep.include({ status: 'failed', attempt: 2 });
      expect(spent.attempts.map((a) => a.outcome)).to.deep.equal(['lost', 'lost']);
      // read running, then a cancel stored before its loss is written: it ends canceled, it does not run again
      const canceled = await post({ steps: [{ tool: 'shell', args: { command: 'true' } }] });
      await crash(canceled, 1);
      // the cancel lands as the loss reads the attempt's steps, after the run was read
      const runs = noWorkers.rt.store.runs;
      const steps = runs.steps.bind(runs);
      runs.steps = (async (...args: Parameters<typeof steps>) => {
        if (args[1] === canceled)
          await runs.update('tenant-a', canceled, { cancel_requested_at: new Date().toISOString() }, { status: ['running'], attempt: 1 });
        return steps(...args);
      }) as typeof steps;
      try {
        await noWorkers.rt.engine.runs.reconcile({ olderThanMs: 0 });
      } finally {
        runs.steps = steps;
      }
      await stopClaims();
      expect(await noWorkers.rt.store.runs.get('tenant-a', canceled)).to.deep.include({ status: 'canceled', attempt: 1 });
      expect(await queue.getJob(jobOf(canceled, 2))).to.equal(undefined);
    } finally {
      await noWorkers.close();
    }
  });

  it('stops an attempt the run went on without (its worker stalled past its claims), and keeps a run claimed while the store refuses its end', async () => {
    const h = await startHarness({ workers: false });
    try {
      const ws = h.tenantDir();
      const post = async (command: string) =>
        (await h.call<Body>('POST', '/api/v1/autonomy/run', { body: { steps: [{ tool: 'shell', args: { command } }] } })).body.run_id as string;
      const executor = h.rt.engine.executor;
      // taken for lost while it ran (its next attempt queued): the poll that looks for cancels stops it, and its end is not written
      const zombie = await post('echo one >> zombie.log; sleep 30; echo two >> zombie.log');
      const running = executor.execute(zombie, 'tenant-a', 1);
      await eventually(async () => (await fs.readFile(path.join(ws, 'zombie.log'), 'utf8').catch(() => '')) === 'one\n', 'the step to start');
      expect(await executor.abortCanceled(), 'nothing to stop while the run is its own').to.equal(0);
      await h.rt.store.runs.update('tenant-a', zombie, { status: 'queued', attempt: 2, started_at: null }, { status: ['running'], attempt: 1 });
      expect(await executor.abortCanceled()).to.equal(1);
      expect(await running).to.equal(null);
      expect(await h.rt.store.runs.get('tenant-a', zombie)).to.deep.include({ status: 'queued', attempt: 2 });
      expect(await fs.readFile(path.join(ws, 'zombie.log'), 'utf8')).to.equal('one\n');
      // its next attempt delivered to this same process while it still runs: the earlier one stops at once, and the
      // later one is the run's here (a cancel reaches it)
      const twice = await post('echo start >> twice.log; sleep 30; echo end >> twice.log');
      const first = executor.execute(twice, 'tenant-a', 1);
      const started = async (n: number) =>
        eventually(async () => ((await fs.readFile(path.join(ws, 'twice.log'), 'utf8').catch(() => '')) === 'start\n'.repeat(n) ? true : null), `start ${n}`);
      await started(1);
      await h.rt.store.runs.update('tenant-a', twice, { status: 'queued', attempt: 2, started_at: null }, { status: ['running'], attempt: 1 });
      const second = executor.execute(twice, 'tenant-a', 2);
      expect(await first, 'the earlier attempt, stopped').to.equal(null);
      await started(2);
      expect(executor.abort(twice), 'the later attempt is found by a cancel').to.equal(true);
      expect((await second)!.run.status).to.equal('canceled');
      expect(await fs.readFile(path.join(ws, 'twice.log'), 'utf8')).to.equal('start\nstart\n');
      // the same attempt delivered twice at once (a stall's re-delivery while it was still queued): one runs it, and a
      // cancel finds it (the other's end removed its entry)
      const doubled = await post('echo go >> doubled.log; sleep 30');
      const [one, other] = [executor.execute(doubled, 'tenant-a', 1), executor.execute(doubled, 'tenant-a', 1)];
      await eventually(async () => ((await fs.readFile(path.join(ws, 'doubled.log'), 'utf8').catch(() => '')) === 'go\n' ? true : null), 'it to start');
      expect(executor.abort(doubled)).to.equal(true);
      const settledBoth = await Promise.all([one, other]);
      // the copy that found the other running it puts its job off (held); the other ends canceled
      expect(settledBoth.map((x) => x!.next).sort()).to.deep.equal(['ended', 'held']);
      expect(settledBoth.find((x) => x!.next === 'ended')!.run.status).to.equal('canceled');
      expect(await fs.readFile(path.join(ws, 'doubled.log'), 'utf8')).to.equal('go\n');
      // its work done, its end refused four times: claimed here while it is tried again, so a job delivered again does not
      // take it for lost and run it a second time; then stored
      const refused = await post('echo did >> once.log');
      const update = h.rt.store.runs.update.bind(h.rt.store.runs);
      let refusals = 0;
      h.rt.store.runs.update = (async (...args: Parameters<typeof update>) => {
        if (args[2].status === 'succeeded' && refusals++ < 5) throw new Error('SQLITE_BUSY: database is locked');
        return update(...args);
      }) as typeof update;
      try {
        expect(await executor.execute(refused, 'tenant-a', 1)).to.equal(null);
        expect(executor.isExecuting(refused)).to.equal(true);
        expect(await executor.execute(refused, 'tenant-a', 1), 'the job delivered again').to.equal(null);
        const ended = await eventually(async () => {
          const r = await h.rt.store.runs.get('tenant-a', refused);
          return r?.status === 'succeeded' ? r : null;
        }, 'the end stored in the background');
        expect(ended.attempt).to.equal(1);
        // let go once its end is stored: the store's answer reaches the background try a turn after a read can see it
        await eventually(async () => (executor.isExecuting(refused) ? null : true), 'the run let go once its end is stored');
      } finally {
        h.rt.store.runs.update = update;
      }
      expect(await fs.readFile(path.join(ws, 'once.log'), 'utf8')).to.equal('did\n');
    } finally {
      await h.close();
    }
  });

  it('repairs a run whose job is in no list of its queue (Redis evicted the list, its hash kept): queued goes back in line, running is lost', async () => {
    const noWorkers = await startHarness({ workers: false });
    try {
      const post = async (command: string) =>
        (await noWorkers.call<Body>('POST', '/api/v1/autonomy/run', { body: { steps: [{ tool: 'shell', args: { command } }] } })).body.run_id as string;
      const queue = noWorkers.rt.queues.get('runs');
      const prefix = `${noWorkers.config.queuePrefix}:runs`;
      const queued = await post('echo queued');
      const running = await post('echo running');
      // both jobs' hashes stay, out of every list (BullMQ reads them as 'unknown')
      for (const id of [queued, running]) await noWorkers.rt.redis.lrem(`${prefix}:wait`, 0, jobOf(id, 1));
      await noWorkers.rt.store.runs.update('tenant-a', running, { status: 'running', started_at: new Date().toISOString() }, { status: ['queued'] });
      for (const id of [queued, running]) expect(await (await queue.getJob(jobOf(id, 1)))!.getState()).to.equal('unknown');
      const stopClaims = noWorkers.rt.engine.runs.claims.start(() => [], 50);
      await eventually(async () => (await noWorkers.rt.engine.runs.claims.elsewhere()) !== null, 'the registry of claims to be complete');
      expect(await noWorkers.rt.engine.runs.reconcile({ olderThanMs: 0 })).to.deep.include({ requeued: 1, lost: 1 });
      await stopClaims();
      expect(await (await queue.getJob(jobOf(queued, 1)))!.getState()).to.equal('waiting');
      // lost: it runs again, as its next attempt
      const lost = (await noWorkers.rt.store.runs.get('tenant-a', running))!;
      expect(lost).to.deep.include({ status: 'queued', attempt: 2 });
      expect(lost.attempts[0]!.error!.code).to.equal('worker-lost');
    } finally {
      await noWorkers.close();
    }
  });

  it('ends canceled, never retried, a running run whose cancel was asked before its worker was lost, even once Redis lost the cancel', async () => {
    const noWorkers = await startHarness({ workers: false });
    try {
      const id = (
        await noWorkers.call<Body>('POST', '/api/v1/autonomy/run', {
          body: { steps: [{ tool: 'shell', args: { command: 'sleep 5' } }], retry: { attempts: 3, backoff: { type: 'fixed', delay_ms: 100 } } },
        })
      ).body.run_id as string;
      // its worker took it and died with it: running, its job gone
      await noWorkers.rt.queues.get('runs').remove(jobOf(id, 1));
      await noWorkers.rt.store.runs.update('tenant-a', id, { status: 'running', started_at: new Date().toISOString() }, { status: ['queued'] });
      const asked = await noWorkers.call<Body>('POST', `/api/v1/runs/${id}/cancel`);
      expect(asked.status, asked.text).to.equal(202);
      expect(asked.body.cancel_requested_at).to.be.a('string');
      // Redis lost its data: the cancel's key is gone
      await noWorkers.rt.redis.del(`${noWorkers.config.queuePrefix}:run-cancel:${id}`);
      const stopClaims = noWorkers.rt.engine.runs.claims.start(() => [], 50);
      await eventually(async () => (await noWorkers.rt.engine.runs.claims.elsewhere()) !== null, 'the registry of claims to be complete');
      expect(await noWorkers.rt.engine.runs.reconcile({ olderThanMs: 0 })).to.deep.include({ lost: 1 });
      await stopClaims();
      const run = (await noWorkers.rt.store.runs.get('tenant-a', id))!;
      expect(run).to.deep.include({ status: 'canceled', attempt: 1 });
      expect(run.error!.code).to.equal('canceled');
    } finally {
      await noWorkers.close();
    }
  });

  it('stops a running run whose cancel only the store kept (Redis lost its key, or went back on it, and its message was missed)', async () => {
    const id = (await h.call<Body>('POST', '/api/v1/autonomy/run', { body: { steps: [{ tool: 'shell', args: { command: 'sleep 20' } }] } })).body
      .run_id as string;
    await eventually(async () => (await h.rt.store.runs.get('tenant-a', id))?.status === 'running', 'the run to start');
    await new Promise((r) => setTimeout(r, 300));
    // the ask in the store alone: no key in Redis, no message
    const asked = await h.rt.store.runs.update('tenant-a', id, { cancel_requested_at: new Date().toISOString() }, { status: ['running'] });
    expect(asked?.cancel_requested_at).to.be.a('string');
    // the worker's poll of cancel asks (every 2 s) finds it
    const run = await finishedRun(h, id);
    expect(run).to.deep.include({ status: 'canceled' });
    expect(Date.parse(run.finished_at) - Date.parse(asked!.cancel_requested_at!)).to.be.below(5000);
  });

  it('refuses to start a process of another queue prefix on a deployment’s store, naming SERVICE_QUEUE_PREFIX (its reconciler ended the other’s running runs)', async () => {
    const config = parseEnv({ ...sameDeployment(h), REDIS_URL: h.config.redisUrl, SERVICE_QUEUE_PREFIX: `${h.config.queuePrefix}-other` });
    const err = await refusalToOpen(config);
    expect(err).to.be.instanceOf(ConfigError);
    expect(String((err as Error).message))
      .to.contain('SERVICE_QUEUE_PREFIX')
      .and.contain(`"${h.config.queuePrefix}"`);
    // a deployment whose processes are stopped, with no run running, moves to a new prefix (a Redis Cluster's hash tag)
    const stopped = await startHarness({ workers: false });
    const moved = parseEnv({ ...sameDeployment(stopped), REDIS_URL: stopped.config.redisUrl, SERVICE_QUEUE_PREFIX: `${stopped.config.queuePrefix}-moved` });
    // not while a web process of it is still connected (it has no worker to count): it would serve queues no one
    // reads and stream event logs no one writes
    const live = await refusalToOpen(moved);
    expect(live).to.be.instanceOf(ConfigError);
    expect(String((live as Error).message)).to.contain('1 process of it is connected');
    // a process left running when its store moved anyway (CLIENT LIST refused, another Redis): not ready, saying why
    expect((await stopped.call('GET', '/readyz')).status).to.equal(200);
    await stopped.rt.store.deployment.moveQueuePrefix(moved.queuePrefix);
    const notReady = await stopped.call<Body>('GET', '/readyz');
    expect(notReady.status).to.equal(503);
    expect(notReady.body.checks.store).to.deep.include({ ok: false, error: 'STORE_MOVED' });
    await stopped.rt.store.deployment.moveQueuePrefix(stopped.config.queuePrefix);
    await stopped.web.close();
    await stopped.rt.close();
    const rt = await openRuntime(moved, createLogger('silent'));
    try {
      expect(await rt.store.deployment.claimQueuePrefix('anything')).to.equal(moved.queuePrefix);
    } finally {
      await rt.close();
      await deleteRedisPrefix(moved.queuePrefix);
      await deleteRedisPrefix(stopped.config.queuePrefix);
      await fs.rm(stopped.config.dataDir, { recursive: true, force: true });
    }
  });

  it('leaves a queued run that a worker took after the reconciler listed it', async () => {
    const noWorkers = await startHarness({ workers: false });
    try {
      const id = (await noWorkers.call<Body>('POST', '/api/v1/autonomy/run', { body: { steps: [{ tool: 'shell', args: { command: 'true' } }] } })).body
        .run_id as string;
      const queue = noWorkers.rt.queues.get('runs');
      // between the reconciler's list and its look at the job, a worker ran the run and its completed job
      // was trimmed away with the others
      const runs = noWorkers.rt.store.runs;
      const listStale = runs.listStale.bind(runs);
      runs.listStale = async (status, before, limit) => {
        const listed = await listStale(status, before, limit);
        if (status === 'queued') {
          await runs.update('tenant-a', id, { status: 'succeeded', finished_at: new Date().toISOString() }, { status: ['queued'] });
          await queue.remove(jobOf(id, 1));
        }
        return listed;
      };
      expect((await noWorkers.rt.engine.runs.reconcile({ olderThanMs: 0 })).requeued).to.equal(0);
      expect(await queue.getJob(jobOf(id, 1)), 'no job made again for a run that ended').to.equal(undefined);
    } finally {
      await noWorkers.close();
    }
  });

  it('does not take a run for lost while a live worker process still runs it (its job delivered again after its lock lapsed)', async () => {
    // a worker process with a short lock, and a second process of the same deployment that gets the job again
    const first = await startHarness({ env: { SERVICE_STALLED_INTERVAL_SECONDS: '1' } });
    const second = await startHarness({ workers: false, env: { ...sameDeployment(first), SERVICE_STALLED_INTERVAL_SECONDS: '1' } });
    // the second beats as the worker process it plays (one that never beats judges the registry by the default
    // 5 s beat: too young to tell for 30 s, when every run is held and none lost whatever the claims say)
    const stopSecondClaims = second.rt.engine.runs.claims.start(() => [], 333);
    try {
      const claims = () => second.rt.engine.runs.claims.elsewhere();
      // the claims registry is complete once every process has beaten for its lapse
      await eventually(async () => (await claims()) !== null, 'the registry of claims to be complete');
      // the run goes on until the test lets it end (a sleep of a few seconds had ended before the reconcile on a
      // loaded machine), at most a minute
      const go = path.join(first.tenantDir(), 'go');
      const command = 'for i in $(seq 600); do [ -f go ] && break; sleep 0.1; done; echo done';
      const res = await first.call<Body>('POST', '/api/v1/autonomy/run', { body: { steps: [{ tool: 'shell', args: { command } }] } });
      await eventually(async () => (await first.call<Body>('GET', `/api/v1/runs/${res.body.run_id}`)).body.status === 'running', 'the run to start');
      // the first process has claimed it in a beat
      await eventually(async () => (await claims())!.has(res.body.run_id) || null, 'the first process’s claim');
      // the second process is handed the run's job again, as after a Redis pause longer than the lock
      const again = await second.rt.engine.executor.execute(res.body.run_id, 'tenant-a', 1);
      expect(again?.next, 'the job waits; the run is not lost').to.equal('held');
      // Redis lost the tenant's slots: the reconciler of another process gives the running run its slot
      // back (so no queued run takes it) and does not take the run for lost
      const slotsKey = `${first.config.queuePrefix}:tenant:tenant-a:running`;
      await first.rt.redis.del(slotsKey);
      expect(await second.rt.engine.runs.reconcile({ olderThanMs: 0 })).to.include({ lost: 0 });
      // what the reconciler saw, should it not give the slot back
      const seen = async () => ({
        status: (await first.rt.store.runs.get('tenant-a', res.body.run_id))?.status,
        job: await (await first.rt.queues.get('runs').getJob(jobOf(res.body.run_id, 1)))?.getState(),
        claimed: (await claims())?.has(res.body.run_id),
      });
      expect(await first.rt.redis.smembers(slotsKey), JSON.stringify(await seen())).to.deep.equal([res.body.run_id]);
      await fs.writeFile(go, '');
      const run = await finishedRun(first, res.body.run_id);
      expect(run.status).to.equal('succeeded');
      expect(run.attempts).to.deep.equal([]);
      expect(run.steps[0].output.stdout).to.equal('done\n');
    } finally {
      await fs.writeFile(path.join(first.tenantDir(), 'go'), '').catch(() => undefined);
      await stopSecondClaims();
      await second.close();
      await first.close();
    }
  });

  it('loses no running run while the registry of claims is incomplete (Redis lost its data), and keeps its slot from queued runs', async () => {
    const young = await startHarness({ workers: false, env: { SERVICE_TENANT_MAX_RUNNING: '1' } });
    try {
      const post = async () =>
        (await young.call<Body>('POST', '/api/v1/autonomy/run', { body: { steps: [{ tool: 'message', args: { text: 'x' } }] } })).body.run_id as string;
      const queue = young.rt.queues.get('runs');
      // a run some worker is running, as Redis found it after losing its data: no job, no slot, no claims
      const running = await post();
      await queue.remove(jobOf(running, 1));
      await young.rt.store.runs.update('tenant-a', running, { status: 'running', started_at: new Date().toISOString() }, { status: ['queued'] });
      const slotsKey = `${young.config.queuePrefix}:tenant:tenant-a:running`;
      await young.rt.redis.del(slotsKey, `${young.config.queuePrefix}:tenant:tenant-a:pending`);
      // and a queued run whose place in line was lost with it
      const queued = { id: await post() };
      await young.rt.redis.del(slotsKey, `${young.config.queuePrefix}:tenant:tenant-a:pending`);
      await queue.remove(jobOf(queued.id, 1));
      expect(await young.rt.engine.runs.reconcile({ olderThanMs: 0 })).to.include({ lost: 0 });
      expect((await young.rt.store.runs.get('tenant-a', running))!.status).to.equal('running');
      // the running run has its slot back, so the queued one waits in line (limit 1) instead of running beside it
      expect(await young.rt.redis.smembers(slotsKey)).to.deep.equal([running]);
      expect(await createTenantSlots(young.rt.redis, young.config.queuePrefix, 1).line('tenant-a')).to.deep.equal([queued.id]);
    } finally {
      await young.close();
    }
  });

  it('keeps run records free of server paths in answers', async () => {
    await fs.mkdir(path.join(h.tenantDir(), 'sub'), { recursive: true });
    const id = await start({ steps: [{ tool: 'shell', args: { command: 'true' } }], workspace: 'sub' });
    const run = await finishedRun(h, id);
    expect(run.workspace).to.equal('sub');
    expect(JSON.stringify(run)).not.to.contain(h.workspace);
  });

  it('names workspaces relative to the tenant root when SERVICE_WORKSPACE_ROOT is reached through a link', async () => {
    const real = await fs.mkdtemp(path.join(os.tmpdir(), 'svc-real-root-'));
    const link = `${real}-link`;
    await fs.symlink(real, link);
    const linked = await startHarness({ env: { SERVICE_WORKSPACE_ROOT: link } });
    try {
      const sub = path.join(link, 'tenant-a', 'sub');
      await fs.mkdir(sub, { recursive: true });
      await fs.writeFile(path.join(sub, 'gates.yaml'), 'gates:\n  - id: ok\n    run: [/bin/true]\n');
      const run = await linked.call<Body>('POST', '/api/v1/autonomy/run', {
        body: { steps: [{ tool: 'shell', args: { command: 'true' } }], workspace: 'sub' },
      });
      expect(run.status, run.text).to.equal(202);
      const finished = await finishedRun(linked, run.body.run_id);
      expect(finished.workspace).to.equal('sub');
      const gateRun = await linked.rt.engine.gates.start('tenant-a', { workspace: 'sub', trigger: { type: 'api' } });
      expect(gateRun.workspace).to.equal('sub');
      const audit = await linked.call<Body>('POST', '/api/v1/autonomy/workspace-audit/run', { body: { workspace: 'sub', phases: ['sanity'] } });
      expect(audit.status, audit.text).to.equal(200);
      expect(audit.body.workspace).to.equal('sub');
      await linked.rt.engine.gates.wait('tenant-a', gateRun.id);
    } finally {
      await linked.close();
      await fs.rm(link);
      await fs.rm(real, { recursive: true, force: true });
    }
  });
});
