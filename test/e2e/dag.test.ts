// Multi-agent sessions' task DAG, executed for real: a diamond, a failing branch with an independent
// one and an all_done task, pause and resume, validation in one 422, and DAG order.
import fs from 'node:fs/promises';
import path from 'node:path';
import { expect } from 'chai';
import { ConflictError, jobIdOfRun } from '../../engine/platform/index.js';
import { eventually, heldTogether, KEYS, releasable, scanKeys, startHarness, type Harness, type Reply } from '../support/harness.js';

type Body = Record<string, any>;
const TERMINAL = ['succeeded', 'failed', 'upstream_failed', 'canceled'];

describe('task DAG', function () {
  this.timeout(60_000);
  let h: Harness;
  before(async () => {
    h = await startHarness();
  });
  after(async () => {
    await h.close();
  });

  const session = async () => (await h.call<Body>('POST', '/api/v1/sessions', { body: { title: 'dag' } })).body.id as string;
  const sh = (command: string) => [{ tool: 'shell' as const, args: { command } }];
  const settled = (id: string, count: number) =>
    eventually(
      async () => {
        const s = (await h.call<Body>('GET', `/api/v1/sessions/${id}`)).body;
        return s.tasks.length === count && s.tasks.every((t: Body) => TERMINAL.includes(t.status)) && s.outcome ? s : null;
      },
      'every task to end',
      40_000,
    );

  /** The session once it has an outcome, the reconciler run before each look. */
  const reconciledToEnd = (id: string) =>
    eventually(async () => {
      await h.rt.engine.sessions.reconcile(0);
      const s = (await h.call<Body>('GET', `/api/v1/sessions/${id}`)).body;
      return s.outcome ? s : null;
    }, 'the session to end');

  it('runs a diamond: B and C after A, D after both; each starts only after its dependencies, and the session ends succeeded', async () => {
    const id = await session();
    const log = (name: string) => `echo ${name} $(date +%s%N) >> order.log`;
    const res = await h.call<Body>('POST', `/api/v1/sessions/${id}/tasks`, {
      body: {
        tasks: [
          { id: 'd', depends_on: ['b', 'c'], steps: sh(log('d')) },
          { id: 'a', steps: sh(`${log('a')}; echo from-a`) },
          { id: 'b', depends_on: ['a'], steps: sh(`sleep 0.3; ${log('b')}`) },
          { id: 'c', depends_on: ['a'], steps: sh(log('c')) },
        ],
      },
    });
    expect(res.status, res.text).to.equal(201);
    const s = await settled(id, 4);
    expect(s.outcome).to.equal('succeeded');
    expect(s.status).to.equal('idle');
    expect(s.tasks.map((t: Body) => t.id)).to.deep.equal(['a', 'b', 'c', 'd']);
    expect(s.tasks.every((t: Body) => t.status === 'succeeded' && t.run_ids.length === 1)).to.equal(true);
    expect(s.task_counts.succeeded).to.equal(4);
    // the upstream outputs reach a task as inputs.upstream
    const b = (await h.call<Body>('GET', `/api/v1/runs/${s.tasks[1].run_ids[0]}`)).body;
    expect(b.kind).to.equal('session_task');
    expect(b.inputs.upstream.a.steps[0].output.stdout).to.contain('from-a');
    // every task ran once, and after all its dependencies
    const order = (await h.call<Body>('POST', '/api/v1/autonomy/run', { body: { steps: sh('cat order.log'), workspace: '.' } })).body.run_id;
    const out = await eventually(async () => {
      const r = (await h.call<Body>('GET', `/api/v1/runs/${order}`)).body;
      return r.status === 'succeeded' ? (r.steps[0].output.stdout as string) : null;
    }, 'the log');
    const at = Object.fromEntries(
      out
        .trim()
        .split('\n')
        .map((l) => l.split(' ') as [string, string]),
    );
    expect(Object.keys(at).sort()).to.deep.equal(['a', 'b', 'c', 'd']);
    expect(out.trim().split('\n')).to.have.length(4);
    expect(BigInt(at.a!) < BigInt(at.b!) && BigInt(at.a!) < BigInt(at.c!)).to.equal(true);
    expect(BigInt(at.b!) < BigInt(at.d!) && BigInt(at.c!) < BigInt(at.d!)).to.equal(true);
    // one job per task attempt, named by the task
    await eventually(async () => (await (await h.rt.queues.get('runs').getJob(`${id}__d__1`))?.getState()) === 'completed', 'the task’s job to complete');

    // the fence: another run of a task that has ended (a duplicate, a replay) is canceled before it starts
    const again = await h.rt.engine.runs.create('tenant-a', {
      kind: 'session_task',
      session_id: id,
      steps: sh(log('a-again')),
      trigger: { type: 'task', task_id: 'a', prior_attempts: 1 },
    });
    const fenced = await eventually(async () => {
      const r = (await h.call<Body>('GET', `/api/v1/runs/${again.id}`)).body;
      return TERMINAL.includes(r.status) ? r : null;
    }, 'the duplicate run to end');
    expect(fenced.status).to.equal('canceled');
    expect(fenced.error.message).to.equal('task a has already ended');
    expect(fenced.started_at).to.equal(null);
    const a = (await h.call<Body>('GET', `/api/v1/sessions/${id}/tasks`)).body.data[0];
    expect([a.id, a.status, a.run_ids.length]).to.deep.equal(['a', 'succeeded', 1]);
  });

  it('fails a branch: its all_success dependents end upstream_failed, an independent branch succeeds, an all_done task runs', async () => {
    const id = await session();
    const res = await h.call<Body>('POST', `/api/v1/sessions/${id}/tasks`, {
      body: {
        tasks: [
          { id: 'bad', steps: sh('exit 3'), max_attempts: 1 },
          { id: 'after-bad', depends_on: ['bad'], steps: sh('echo never') },
          { id: 'later', depends_on: ['after-bad'], steps: sh('echo never') },
          { id: 'free', steps: sh('echo free') },
          { id: 'cleanup', depends_on: ['bad', 'free'], trigger_rule: 'all_done', steps: sh('echo cleanup') },
        ],
      },
    });
    expect(res.status, res.text).to.equal(201);
    const s = await settled(id, 5);
    const status = Object.fromEntries(s.tasks.map((t: Body) => [t.id, t.status]));
    expect(status).to.deep.equal({ bad: 'failed', 'after-bad': 'upstream_failed', later: 'upstream_failed', free: 'succeeded', cleanup: 'succeeded' });
    expect(s.outcome).to.equal('failed');
    expect(s.tasks.find((t: Body) => t.id === 'later').run_ids).to.deep.equal([]);
  });

  it('ends canceled, not failed, when a task is canceled and nothing failed on its own', async () => {
    const id = await session();
    const tasks = [
      { id: 'long', steps: sh('sleep 30') },
      { id: 'strict', depends_on: ['long'], steps: sh('true') },
      { id: 'anyway', depends_on: ['long'], trigger_rule: 'all_done', steps: sh('true') },
    ];
    expect((await h.call('POST', `/api/v1/sessions/${id}/tasks`, { body: { tasks } })).status).to.equal(201);
    const running = await eventually(async () => {
      const t = (await h.call<Body>('GET', `/api/v1/sessions/${id}`)).body.tasks[0];
      return t.status === 'running' ? t : null;
    }, 'the long task to run');
    expect((await h.call('POST', `/api/v1/runs/${running.run_ids[0]}/cancel`)).status).to.be.oneOf([200, 202]);
    const s = await settled(id, 3);
    expect(s.tasks.map((t: Body) => [t.id, t.status])).to.deep.equal([
      ['long', 'canceled'],
      ['strict', 'upstream_failed'],
      ['anyway', 'succeeded'],
    ]);
    expect(s.outcome).to.equal('canceled');
  });

  it('holds new tasks while paused, releases them on resume, and takes tasks added to a running session', async () => {
    const id = await session();
    await h.call('PATCH', `/api/v1/sessions/${id}`, { body: { status: 'paused' } });
    await h.call<Body>('POST', `/api/v1/sessions/${id}/tasks`, { body: { id: 'held', steps: sh('echo held') } });
    await new Promise((r) => setTimeout(r, 500));
    const paused = (await h.call<Body>('GET', `/api/v1/sessions/${id}`)).body;
    expect(paused.status).to.equal('paused');
    expect(paused.tasks[0]).to.deep.include({ status: 'queued', run_ids: [] });
    await h.call('PATCH', `/api/v1/sessions/${id}`, { body: { status: 'idle' } });
    await settled(id, 1);
    // a task added later may depend on one that has already ended
    const more = await h.call<Body>('POST', `/api/v1/sessions/${id}/tasks`, { body: { id: 'next', depends_on: ['held'], steps: sh('echo next') } });
    expect(more.status, more.text).to.equal(201);
    const s = await settled(id, 2);
    expect(s.tasks.map((t: Body) => [t.id, t.status])).to.deep.equal([
      ['held', 'succeeded'],
      ['next', 'succeeded'],
    ]);
    // held by a pause, two at once; a resumed task gets its dependency's output
    await h.call('PATCH', `/api/v1/sessions/${id}`, { body: { status: 'paused' } });
    const held = await h.call<Body>('POST', `/api/v1/sessions/${id}/tasks`, {
      body: {
        tasks: [
          { id: 'last', depends_on: ['next'], steps: sh('echo last') },
          { id: 'alone', steps: sh('echo alone') },
        ],
      },
    });
    expect(held.status, held.text).to.equal(201);
    expect(held.body.data.map((t: Body) => t.status)).to.deep.equal(['queued', 'queued']);
    await h.call('PATCH', `/api/v1/sessions/${id}`, { body: { status: 'running' } });
    const resumed = await settled(id, 4);
    expect(resumed.tasks.map((t: Body) => t.status)).to.deep.equal(['succeeded', 'succeeded', 'succeeded', 'succeeded']);
    const last = (await h.call<Body>('GET', `/api/v1/runs/${resumed.tasks.find((t: Body) => t.id === 'last').run_ids[0]}`)).body;
    expect(last.inputs.upstream.next.steps[0].output.stdout).to.contain('next');
  });

  it('holds, at their start, the runs a pause finds already queued (none starts), and a resume offers them at once', async () => {
    const id = await session();
    // twenty tasks for ten tenant slots: ten run, ten wait in line with a run each. A task ends once the
    // test makes its release file (in the workspace, its steps' folder), so none can end, and free its
    // slot for an eleventh, before the pause (a task that slept 0.6 s did on a busy machine)
    const held = releasable(h, 'release-held-tasks');
    const tasks = Array.from({ length: 20 }, (_, i) => ({ id: `t${i}`, steps: sh(held.command) }));
    expect((await h.call('POST', `/api/v1/sessions/${id}/tasks`, { body: { tasks } })).status).to.equal(201);
    await eventually(async () => ((await h.call<Body>('GET', `/api/v1/sessions/${id}`)).body.task_counts.running ?? 0) >= 10 || null, 'ten tasks running');
    expect((await h.call('PATCH', `/api/v1/sessions/${id}`, { body: { status: 'paused' } })).status).to.equal(200);
    const pausedAt = new Date().toISOString();
    await held.release();
    // the ten first end; the ten others' runs, taken by the workers as slots free, are held at their start:
    // each job waits, delayed (the held jobs' own retry comes 5 s later)
    const queue = h.rt.queues.get('runs');
    const jobsOf = async (s: Body) =>
      Promise.all(
        s.tasks
          .filter((t: Body) => t.status === 'queued')
          .map(async (t: Body) => {
            const run = (await h.call<Body>('GET', `/api/v1/runs/${t.run_ids[0]}`)).body;
            return queue.getJob(jobIdOfRun(run as Parameters<typeof jobIdOfRun>[0], run.attempt));
          }),
      );
    await eventually(
      async () => {
        const s = (await h.call<Body>('GET', `/api/v1/sessions/${id}`)).body;
        if (s.tasks.filter((t: Body) => t.status === 'succeeded').length !== 10) return null;
        const states = await Promise.all((await jobsOf(s)).map((job) => job?.getState()));
        return (states.length === 10 && states.every((state) => state === 'delayed')) || null;
      },
      'the ten tasks in line to be held',
      20_000,
    );
    const paused = (await h.call<Body>('GET', `/api/v1/sessions/${id}`)).body;
    const byStatus = (s: Body) => s.tasks.reduce((n: Body, t: Body) => ({ ...n, [t.status]: (n[t.status] ?? 0) + 1 }), {});
    expect(byStatus(paused)).to.deep.equal({ succeeded: 10, queued: 10 });
    for (const t of paused.tasks.filter((t: Body) => t.status === 'queued')) {
      expect(t.run_ids, t.id).to.have.length(1);
      const run = (await h.call<Body>('GET', `/api/v1/runs/${t.run_ids[0]}`)).body;
      expect(run).to.include({ status: 'queued', started_at: null });
    }
    const runs = (await h.call<Body>('GET', `/api/v1/sessions/${id}/runs?limit=100`)).body.data;
    for (const r of runs.filter((r: Body) => r.started_at)) expect(r.started_at <= pausedAt, `${r.id} started after the pause`).to.equal(true);
    expect((await h.call('PATCH', `/api/v1/sessions/${id}`, { body: { status: 'idle' } })).status).to.equal(200);
    // promoted by the resume before it answered, not left for the held jobs' own retry 5 s later
    const states = await Promise.all((await jobsOf(paused)).map((job) => job?.getState()));
    expect(states, 'no held job still delayed once the resume has answered').not.to.include('delayed');
    const done = await settled(id, 20);
    expect(done.outcome).to.equal('succeeded');
    await held.clear();
  });

  it('archiving cancels every run of the session, past the first page, and a cut-short archive is finished by the next DELETE', async () => {
    const id = await session();
    const tasks = Array.from({ length: 120 }, (_, i) => ({ id: `t${i}`, steps: sh('sleep 30') }));
    expect((await h.call<Body>('POST', `/api/v1/sessions/${id}/tasks`, { body: { tasks } })).status).to.equal(201);
    const runsOf = async (status: string) => {
      const all: Body[] = [];
      for (let cursor = ''; ;) {
        const page = (await h.call<Body>('GET', `/api/v1/runs?session_id=${id}&status=${status}&limit=100${cursor}`)).body;
        all.push(...page.data);
        if (!page.next_cursor) return all;
        cursor = `&cursor=${page.next_cursor}`;
      }
    };
    await eventually(async () => (await runsOf('running')).length > 0, 'a task to start');
    expect((await runsOf('queued')).length).to.be.greaterThan(100);
    expect((await h.call<Body>('DELETE', `/api/v1/sessions/${id}`)).body.status).to.equal('archived');
    // every queued run was canceled by the DELETE itself, not only the first page of them
    expect(await runsOf('queued')).to.deep.equal([]);
    await eventually(async () => (await runsOf('running')).length === 0, 'the running runs to stop');
    expect((await settled(id, 120)).outcome).to.equal('canceled');

    // held tasks (a paused session: no runs) canceled by the archive itself; one move fails
    const held = await session();
    await h.call('PATCH', `/api/v1/sessions/${held}`, { body: { status: 'paused' } });
    const three = ['a', 'b', 'c'].map((t) => ({ id: t, steps: sh('true') }));
    expect((await h.call<Body>('POST', `/api/v1/sessions/${held}/tasks`, { body: { tasks: three } })).status).to.equal(201);
    const update = h.rt.store.tasks.update.bind(h.rt.store.tasks);
    let failed = 0;
    h.rt.store.tasks.update = async (...args: Parameters<typeof update>) => {
      if (args[2] === 'b' && args[3].status === 'canceled' && !failed++) throw new Error('injected');
      return update(...args);
    };
    try {
      // the DELETE fails, having tried every other task
      expect((await h.call<Body>('DELETE', `/api/v1/sessions/${held}`)).status).to.equal(500);
    } finally {
      h.rt.store.tasks.update = update;
    }
    expect(failed).to.equal(1);
    const cut = (await h.call<Body>('GET', `/api/v1/sessions/${held}`)).body;
    expect(cut).to.deep.include({ status: 'archived', outcome: null });
    expect(cut.tasks.map((t: Body) => [t.id, t.status])).to.deep.equal([
      ['a', 'canceled'],
      ['b', 'queued'],
      ['c', 'canceled'],
    ]);
    // the next DELETE finishes it
    const again = await h.call<Body>('DELETE', `/api/v1/sessions/${held}`);
    expect(again.status, again.text).to.equal(200);
    expect(again.body).to.deep.include({ status: 'archived', outcome: 'canceled' });
    expect((await h.call<Body>('GET', `/api/v1/sessions/${held}`)).body.tasks.every((t: Body) => t.status === 'canceled')).to.equal(true);
  });

  it('archiving cancels the tasks waiting on one whose run it cancels, transitively: canceled, not upstream_failed, whether the run was queued or running', async () => {
    const tasks = [
      { id: 'a', steps: sh('sleep 30') },
      { id: 'b', depends_on: ['a'], steps: sh('true') },
      { id: 'c', depends_on: ['b'], steps: sh('true') },
      { id: 'd', depends_on: ['a'], trigger_rule: 'all_done', steps: sh('true') },
      { id: 'e', depends_on: ['d'], steps: sh('true') },
    ];
    // a queued run ends as the archive cancels it, before the archive reaches its tasks; a running one after
    const queued = await startHarness({ workers: false });
    try {
      for (const [hh, first] of [
        [queued, 'queued'],
        [h, 'running'],
      ] as const) {
        const id = (await hh.call<Body>('POST', '/api/v1/sessions', { body: { title: first } })).body.id as string;
        expect((await hh.call<Body>('POST', `/api/v1/sessions/${id}/tasks`, { body: { tasks } })).status).to.equal(201);
        await eventually(async () => (await hh.call<Body>('GET', `/api/v1/sessions/${id}/tasks`)).body.data[0].status === first, `a ${first}`);
        expect((await hh.call<Body>('DELETE', `/api/v1/sessions/${id}`)).status).to.equal(200);
        const s = await eventually(async () => {
          const got = (await hh.call<Body>('GET', `/api/v1/sessions/${id}`)).body;
          return got.outcome ? got : null;
        }, 'the session to end');
        expect(
          s.tasks.map((t: Body) => [t.id, t.status]),
          first,
        ).to.deep.equal(['a', 'b', 'c', 'd', 'e'].map((t) => [t, 'canceled']));
        expect(s).to.deep.include({ status: 'archived', outcome: 'canceled' });
        expect(
          s.tasks.map((t: Body) => t.run_ids.length),
          'nothing after a ran',
        ).to.deep.equal([1, 0, 0, 0, 0]);
      }
    } finally {
      await queued.close();
    }
  });

  it('cancels, never fails, a task whose run the archive cut: its steps found the session read-only before the cancel reached it', async () => {
    const id = await session();
    // the archive's cancels come late (a busy Redis): the run meets the archived session first. Its first
    // step ends only when a cancel is asked for (the session is archived by then), and the cancel goes on
    // only once the run has ended: a step that slept 1 s could end before the archive on a busy machine
    const cut = releasable(h, 'release-archive-cut');
    const cancel = h.rt.engine.runs.cancel.bind(h.rt.engine.runs);
    h.rt.engine.runs.cancel = async (...args: Parameters<typeof cancel>) => {
      await cut.release();
      await eventually(async () => !['queued', 'running'].includes((await h.rt.store.runs.get(args[0], args[1]))?.status ?? ''), 'the cut run to end');
      return cancel(...args);
    };
    try {
      const steps = [...sh(cut.command), { tool: 'message' as const, args: { text: 'after the wait' } }];
      expect((await h.call<Body>('POST', `/api/v1/sessions/${id}/tasks`, { body: { id: 'a', steps, max_attempts: 1 } })).status).to.equal(201);
      await eventually(async () => (await h.call<Body>('GET', `/api/v1/sessions/${id}`)).body.tasks[0].status === 'running', 'the task to start');
      expect((await h.call<Body>('DELETE', `/api/v1/sessions/${id}`)).status).to.equal(200);
    } finally {
      h.rt.engine.runs.cancel = cancel;
    }
    const s = await settled(id, 1);
    await cut.clear();
    const run = (await h.call<Body>('GET', `/api/v1/runs/${s.tasks[0].run_ids[0]}`)).body;
    // the run itself failed (its message step was refused), yet its task and the session end canceled
    expect(run.status).to.equal('failed');
    expect(run.error.message).to.contain('archived');
    expect(s.tasks[0].status).to.equal('canceled');
    expect(s).to.deep.include({ status: 'archived', outcome: 'canceled' });
  });

  it('never starts a run of an archived session’s task (a retry, one in line before the archive): it is canceled at its start', async () => {
    const id = await session();
    expect((await h.call<Body>('POST', `/api/v1/sessions/${id}/tasks`, { body: { id: 'a', steps: sh('true') } })).status).to.equal(201);
    await settled(id, 1);
    expect((await h.call<Body>('DELETE', `/api/v1/sessions/${id}`)).status).to.equal(200);
    const late = await h.rt.engine.runs.create('tenant-a', {
      kind: 'session_task',
      session_id: id,
      steps: sh('echo ran-after-archive'),
      trigger: { type: 'task', task_id: 'a', prior_attempts: 1 },
    });
    const ended = await eventually(async () => {
      const r = (await h.call<Body>('GET', `/api/v1/runs/${late.id}`)).body;
      return r.status === 'queued' || r.status === 'running' ? null : r;
    }, 'the late run to end');
    expect(ended.status).to.equal('canceled');
    expect(ended.error.message).to.contain('archived');
    expect(ended.steps.map((step: Body) => step.status)).to.deep.equal(['pending']); // planned, never started
  });

  it('fails a ready task whose run the operator’s policy now refuses, and what waits on it follows, instead of leaving it pending', async () => {
    const id = await session();
    const allowed = h.config.toolsAllowed as string[];
    // a's step ends once the test has taken shell off the list (a step that slept 1 s could end first on a busy machine)
    const first = releasable(h, 'release-policy-refuses');
    const body = {
      tasks: [
        { id: 'a', steps: sh(first.command) },
        { id: 'b', depends_on: ['a'], steps: sh('true') },
        { id: 'c', depends_on: ['b'], steps: [{ tool: 'message', args: { text: 'c' } }] },
        { id: 'd', depends_on: ['b'], trigger_rule: 'all_done', steps: [{ tool: 'message', args: { text: 'd' } }] },
      ],
    };
    expect((await h.call<Body>('POST', `/api/v1/sessions/${id}/tasks`, { body })).status).to.equal(201);
    // shell taken off the list while a's step runs: b, ready once a ends, cannot be started
    await eventually(async () => {
      const a = (await h.call<Body>('GET', `/api/v1/sessions/${id}/tasks`)).body.data[0];
      return a.run_ids.length && (await h.call<Body>('GET', `/api/v1/runs/${a.run_ids[0]}`)).body.steps[0]?.status === 'running';
    }, 'a to be running its step');
    const at = allowed.indexOf('shell');
    allowed.splice(at, 1);
    try {
      await first.release();
      const s = await settled(id, 4);
      expect(s.tasks.map((t: Body) => [t.id, t.status])).to.deep.equal([
        ['a', 'succeeded'],
        ['b', 'failed'],
        ['c', 'upstream_failed'],
        ['d', 'succeeded'],
      ]);
      expect(s.tasks[1].run_ids).to.deep.equal([]);
      expect(s.tasks[1].output.error.code).to.equal('tool-not-permitted');
      expect(s.outcome).to.equal('failed');
    } finally {
      allowed.splice(at, 0, 'shell');
      await first.clear();
    }
  });

  it('leaves a ready task whose run is refused for a while (its key held by another dispatch) to the reconciler, not failed', async () => {
    const id = await session();
    const create = h.rt.engine.runs.createIdempotent.bind(h.rt.engine.runs);
    let refused = 0;
    h.rt.engine.runs.createIdempotent = async (...args: Parameters<typeof create>) => {
      if (!refused++) throw new ConflictError('a request with this Idempotency-Key is still being handled; retry');
      return create(...args);
    };
    try {
      expect((await h.call<Body>('POST', `/api/v1/sessions/${id}/tasks`, { body: { id: 'a', steps: sh('true') } })).status).to.equal(201);
    } finally {
      h.rt.engine.runs.createIdempotent = create;
    }
    expect(refused).to.equal(1);
    expect((await h.call<Body>('GET', `/api/v1/sessions/${id}/tasks`)).body.data[0]).to.deep.include({ status: 'pending' });
    await h.rt.engine.sessions.reconcile(0);
    expect((await settled(id, 1)).tasks[0].status).to.equal('succeeded');
  });

  it('refuses at once a task with an agent step when no agent endpoint is configured (it could never start)', async () => {
    const id = await session();
    const res = await h.call<Body>('POST', `/api/v1/sessions/${id}/tasks`, {
      body: { tasks: [{ id: 'plan', steps: [{ tool: 'agent', args: { goal: 'write notes' } }] }] },
    });
    expect(res.status, res.text).to.equal(422);
    expect(res.body.code).to.equal('agent-not-configured');
    expect((await h.call<Body>('GET', `/api/v1/sessions/${id}/tasks`)).body.data).to.deep.equal([]);
  });

  it('answers one 422 listing every error of a batch, and adds nothing', async () => {
    const id = await session();
    const res = await h.call<Body>('POST', `/api/v1/sessions/${id}/tasks`, {
      body: {
        tasks: [
          { id: 'x', depends_on: ['y'], steps: sh('true') },
          { id: 'y', depends_on: ['x', 'ghost'], steps: sh('true') },
          { id: 'z', depends_on: ['z'], agent_id: 'agt_01m00000000000000000000000', steps: sh('true') },
        ],
      },
    });
    expect(res.status).to.equal(422);
    expect(res.body.code).to.equal('task-graph-invalid');
    const messages = res.body.errors.map((e: Body) => e.message);
    expect(messages).to.include('no task ghost in this session or this request');
    expect(messages).to.include('a task cannot depend on itself');
    expect(messages).to.include('no agent agt_01m00000000000000000000000 in this session');
    expect(messages.some((m: string) => m.startsWith('the dependencies form a cycle'))).to.equal(true);
    // a goal of blanks is no goal, as a run's is: refused here, not stored to fail when its agent is asked
    const blank = await h.call<Body>('POST', `/api/v1/sessions/${id}/tasks`, { body: { tasks: [{ id: 'blank', goal: ' \n\t ' }] } });
    expect(blank.status, blank.text).to.equal(422);
    expect(blank.body.errors).to.deep.equal([{ path: '/body/tasks/0', message: 'give the work to do: steps, or a goal for its agent' }]);
    expect((await h.call<Body>('GET', `/api/v1/sessions/${id}/tasks`)).body.data).to.deep.equal([]);
    expect((await h.call('GET', `/api/v1/sessions/${id}/tasks`, { key: KEYS.b })).status).to.equal(404);
    expect((await h.call('POST', `/api/v1/sessions/${id}/tasks`, { key: KEYS.b, body: { steps: sh('true') } })).status).to.equal(404);
    // a schema error names what is wrong in the form given (one task, or a batch), not the other form's complaints
    const one = await h.call<Body>('POST', `/api/v1/sessions/${id}/tasks`, { body: { steps: sh('true'), max_attempts: 0 } });
    expect(one.status).to.equal(400);
    expect(one.body.errors).to.deep.equal([{ path: '/body/max_attempts', message: 'must be >= 1' }]);
    const batch = await h.call<Body>('POST', `/api/v1/sessions/${id}/tasks`, { body: { tasks: [{ steps: sh('true'), max_attempts: 0 }] } });
    expect(batch.status).to.equal(400);
    expect(batch.body.errors).to.deep.equal([{ path: '/body/tasks/0/max_attempts', message: 'must be >= 1' }]);
    // and so do the DAG's own checks (422)
    const self = await h.call<Body>('POST', `/api/v1/sessions/${id}/tasks`, { body: { id: 's', depends_on: ['s'], steps: sh('true') } });
    expect(self.status).to.equal(422);
    expect(self.body.errors).to.deep.equal([{ path: '/body/depends_on/0', message: 'a task cannot depend on itself' }]);
    expect(self.body.detail).to.equal('/body/depends_on/0: a task cannot depend on itself');
    const blankOne = await h.call<Body>('POST', `/api/v1/sessions/${id}/tasks`, { body: { goal: '  ' } });
    expect(blankOne.body.errors).to.deep.equal([{ path: '/body', message: 'give the work to do: steps, or a goal for its agent' }]);
    const selfInBatch = await h.call<Body>('POST', `/api/v1/sessions/${id}/tasks`, { body: { tasks: [{ id: 's', depends_on: ['s'], steps: sh('true') }] } });
    expect(selfInBatch.body.errors).to.deep.equal([{ path: '/body/tasks/0/depends_on/0', message: 'a task cannot depend on itself' }]);
  });

  it('lists tasks added later after those added before, however large the earlier batch, with true creation times', async () => {
    const id = await session();
    await h.call('PATCH', `/api/v1/sessions/${id}`, { body: { status: 'paused' } });
    const before = new Date().toISOString();
    const big = Array.from({ length: 300 }, (_, i) => ({ id: `b${i}`, steps: sh('true') }));
    expect((await h.call('POST', `/api/v1/sessions/${id}/tasks`, { body: { tasks: big } })).status).to.equal(201);
    expect((await h.call('POST', `/api/v1/sessions/${id}/tasks`, { body: { id: 'late', steps: sh('true') } })).status).to.equal(201);
    const listed = (await h.call<Body>('GET', `/api/v1/sessions/${id}/tasks?limit=500`)).body.data as Body[];
    expect(listed.map((t) => t.id)).to.deep.equal([...big.map((t) => t.id), 'late']);
    expect(listed.map((t) => t.position)).to.deep.equal(Array.from({ length: 301 }, (_, i) => i + 1));
    const now = new Date().toISOString();
    for (const t of listed) expect(t.created_at >= before && t.created_at <= now, `${t.id} ${t.created_at}`).to.equal(true);
    await h.call('DELETE', `/api/v1/sessions/${id}`);
  });

  it('refuses the tasks a request adds while the session is archived under it (paused or not): the outcome the archive gave stands', async () => {
    for (const paused of [true, false]) {
      const id = await session();
      // a task ended before: the archive answers its outcome (succeeded), and no add that lost the race changes it
      expect((await h.call<Body>('POST', `/api/v1/sessions/${id}/tasks`, { body: { id: 'done', steps: sh('true') } })).status).to.equal(201);
      await settled(id, 1);
      if (paused) await h.call('PATCH', `/api/v1/sessions/${id}`, { body: { status: 'paused' } });
      // the DELETE lands between the request's read of the session and its insert
      let archive: Reply<Body> | undefined;
      const insert = h.rt.store.tasks.insertMany.bind(h.rt.store.tasks);
      h.rt.store.tasks.insertMany = async (...args: Parameters<typeof insert>) => {
        archive = await h.call<Body>('DELETE', `/api/v1/sessions/${id}`);
        return insert(...args);
      };
      try {
        const tasks = [
          { id: 'a', steps: sh('true') },
          { id: 'b', depends_on: ['a'], steps: sh('true') },
        ];
        const late = await h.call<Body>('POST', `/api/v1/sessions/${id}/tasks`, { body: { tasks } });
        expect(late.status, late.text).to.equal(409);
        expect(late.body).to.deep.include({ code: 'conflict', status: 409 });
        expect(late.body.detail).to.contain('archived');
      } finally {
        h.rt.store.tasks.insertMany = insert;
      }
      expect(archive?.status).to.equal(200);
      expect(archive?.body, `paused: ${paused}`).to.deep.include({ status: 'archived', outcome: 'succeeded' });
      const s = (await h.call<Body>('GET', `/api/v1/sessions/${id}`)).body;
      expect(s, `paused: ${paused}`).to.deep.include({ status: 'archived', outcome: 'succeeded' });
      expect(s.tasks.map((t: Body) => [t.id, t.status])).to.deep.equal([['done', 'succeeded']]);
    }
    // the process that added them died before it ended them: the reconciler does (one held by the pause, one never registered)
    const archived = await session();
    const done = (await h.call<Body>('GET', `/api/v1/sessions/${archived}`)).body;
    expect((await h.call<Body>('DELETE', `/api/v1/sessions/${archived}`)).status).to.equal(200);
    const stored = (id: string, status: 'queued' | 'pending') => ({
      id,
      tenant_id: 'tenant-a',
      session_id: archived,
      title: null,
      goal: null,
      steps: sh('true'),
      agent_id: null,
      depends_on: [],
      trigger_rule: 'all_success' as const,
      status,
      attempts: 0,
      max_attempts: 1,
      run_ids: [],
      output: null,
      inbox_after: 0,
      position: id === 'held' ? 1 : 2,
      created_at: done.created_at,
      updated_at: done.created_at,
    });
    expect(await h.rt.store.tasks.insertMany([stored('held', 'queued'), stored('lost', 'pending')])).to.equal('inserted');
    const repaired = await h.rt.engine.sessions.reconcile(0);
    expect(repaired.finished).to.be.at.least(2);
    expect((await h.call<Body>('GET', `/api/v1/sessions/${archived}/tasks`)).body.data.map((t: Body) => [t.id, t.status])).to.deep.equal([
      ['held', 'canceled'],
      ['lost', 'canceled'],
    ]);
  });

  it('keeps at most 256 KB of a task’s step outputs, the latest first: its dependents’ inputs.upstream do not multiply what its steps made', async () => {
    const id = await session();
    await fs.writeFile(path.join(h.tenantDir(), 'big.txt'), 'x'.repeat(150 * 1024));
    const read = { tool: 'read_file' as const, args: { path: 'big.txt' } };
    // 40 reads of 150 KB: 6 MB of step outputs, which every one of its dependents would otherwise carry
    const tasks = [
      { id: 'big', steps: [...Array.from({ length: 40 }, () => read), ...sh('echo last')] },
      { id: 'after', depends_on: ['big'], steps: sh('true') },
    ];
    expect((await h.call<Body>('POST', `/api/v1/sessions/${id}/tasks`, { body: { tasks } })).status).to.equal(201);
    const s = await settled(id, 2);
    expect(s.tasks.map((t: Body) => t.status)).to.deep.equal(['succeeded', 'succeeded']);
    // the session's detail has the outputs' summaries; the tasks' list, the outputs
    const output = (await h.call<Body>('GET', `/api/v1/sessions/${id}/tasks`)).body.data[0].output;
    expect(s.tasks[0].output).to.deep.equal({ status: output.status, summary: output.summary, usage: output.usage });
    expect(JSON.stringify(output.steps).length).to.be.below(300 * 1024);
    expect(output.steps).to.have.length(41);
    expect(output.steps[40].output.stdout).to.equal('last\n');
    expect(output.steps[39].output.content).to.have.length(150 * 1024);
    expect(output.steps[0]).to.deep.equal({ tool: 'read_file', output: null, output_truncated: true });
    const after = (await h.call<Body>('GET', `/api/v1/runs/${s.tasks[1].run_ids[0]}`)).body;
    expect(after.inputs.upstream.big).to.deep.equal(output);
    // the task's run keeps every step's output whole
    expect((await h.call<Body>('GET', `/api/v1/runs/${s.tasks[0].run_ids[0]}`)).body.steps[0].output.content).to.have.length(150 * 1024);
  });

  it('keeps at most 1 MB of its dependencies’ outputs in a run’s inputs.upstream, each dependency’s status, summary and latest step kept', async () => {
    const id = await session();
    await fs.writeFile(path.join(h.tenantDir(), 'part.txt'), 'y'.repeat(200 * 1024));
    const read = { tool: 'read_file' as const, args: { path: 'part.txt' } };
    // 8 producers of 200 KB each: 1.6 MB, which each of the consumers' runs would carry whole
    const producers = Array.from({ length: 8 }, (_, i) => ({ id: `p${i}`, steps: [read, ...sh(`echo last-${i}`)] }));
    const consumers = Array.from({ length: 3 }, (_, i) => ({ id: `c${i}`, depends_on: producers.map((p) => p.id), steps: sh('true') }));
    expect((await h.call<Body>('POST', `/api/v1/sessions/${id}/tasks`, { body: { tasks: [...producers, ...consumers] } })).status).to.equal(201);
    const s = await settled(id, 11);
    expect(s.outcome).to.equal('succeeded');
    for (const c of s.tasks.filter((t: Body) => t.id.startsWith('c'))) {
      const upstream = (await h.call<Body>('GET', `/api/v1/runs/${c.run_ids[0]}`)).body.inputs.upstream as Body;
      expect(Buffer.byteLength(JSON.stringify(upstream))).to.be.below(1024 * 1024);
      expect(Object.keys(upstream).sort()).to.deep.equal(producers.map((p) => p.id));
      producers.forEach((p, i) => {
        expect(upstream[p.id]).to.include({ status: 'succeeded' }).and.to.have.property('summary');
        expect(upstream[p.id].steps).to.have.length(2);
        expect(upstream[p.id].steps[1].output.stdout).to.equal(`last-${i}\n`);
      });
      // what the even shares leave goes to the steps left out, in the order of depends_on: 5 reads of 200 KB fit
      const whole = producers.filter((p) => upstream[p.id].steps[0].output?.content?.length === 200 * 1024).map((p) => p.id);
      expect(whole).to.deep.equal(['p0', 'p1', 'p2', 'p3', 'p4']);
      expect(upstream.p7.steps[0]).to.deep.equal({ tool: 'read_file', output: null, output_truncated: true });
    }
    // the producers' own outputs are whole
    const p7 = (await h.call<Body>('GET', `/api/v1/sessions/${id}/tasks`)).body.data.find((t: Body) => t.id === 'p7');
    expect(p7.output.steps[0].output.content).to.have.length(200 * 1024);
  });

  it('starts the tasks one end makes ready at most 8 at a time, each holding its dependencies’ outputs, and starts them all', async () => {
    const id = await session();
    const consumers = Array.from({ length: 30 }, (_, i) => ({ id: `c${i}`, depends_on: ['a'], steps: sh('true') }));
    const update = h.rt.store.tasks.update.bind(h.rt.store.tasks);
    let starting = 0;
    let most = 0;
    // each start's move to queued is slowed, so the starts that overlap show: 30 at once, before
    h.rt.store.tasks.update = async (...args: Parameters<typeof update>) => {
      if (args[1] !== id || args[3].status !== 'queued' || args[2] === 'a') return update(...args);
      most = Math.max(most, ++starting);
      try {
        await new Promise((r) => setTimeout(r, 100));
        return await update(...args);
      } finally {
        starting--;
      }
    };
    try {
      const res = await h.call<Body>('POST', `/api/v1/sessions/${id}/tasks`, { body: { tasks: [{ id: 'a', steps: sh('true') }, ...consumers] } });
      expect(res.status, res.text).to.equal(201);
      expect((await settled(id, 31)).outcome).to.equal('succeeded');
    } finally {
      h.rt.store.tasks.update = update;
    }
    expect(most).to.be.within(2, 8);
  });

  it('starts a task whose run key a client took first as an Idempotency-Key (task:<session>:<task>)', async () => {
    const id = await session();
    const taken = await h.call<Body>('POST', '/api/v1/autonomy/run', {
      body: { steps: sh('true'), workspace: '.' },
      headers: { 'idempotency-key': `task:${id}:a` },
    });
    expect(taken.status, taken.text).to.equal(202);
    expect((await h.call<Body>('POST', `/api/v1/sessions/${id}/tasks`, { body: { id: 'a', steps: sh('true') } })).status).to.equal(201);
    const s = await settled(id, 1);
    expect(s.tasks[0].status).to.equal('succeeded');
    expect(s.tasks[0].run_ids).to.not.include(taken.body.run_id);
  });

  it('starts a task released while paused whose hold lands after a resume that listed the tasks before it', async () => {
    const id = await session();
    // a ends once the test lets it, after the pause (a step that slept 0.5 s could end before it on a busy machine)
    const a = releasable(h, 'release-held-b');
    const tasks = [
      { id: 'a', steps: sh(a.command) },
      { id: 'b', depends_on: ['a'], steps: sh('true') },
    ];
    expect((await h.call<Body>('POST', `/api/v1/sessions/${id}/tasks`, { body: { tasks } })).status).to.equal(201);
    await eventually(async () => (await h.call<Body>('GET', `/api/v1/sessions/${id}`)).body.tasks[0].status === 'running', 'a to run');
    expect((await h.call<Body>('PATCH', `/api/v1/sessions/${id}`, { body: { status: 'paused' } })).status).to.equal(200);
    // a ends while paused: b, released, is held; the resume comes between the read of the pause and the hold
    const update = h.rt.store.tasks.update.bind(h.rt.store.tasks);
    let resumed = 0;
    h.rt.store.tasks.update = async (...args: Parameters<typeof update>) => {
      if (args[1] === id && args[2] === 'b' && args[3].status === 'queued' && !args[3].run_ids && !resumed++)
        expect((await h.call<Body>('PATCH', `/api/v1/sessions/${id}`, { body: { status: 'idle' } })).status).to.equal(200);
      return update(...args);
    };
    // started at once, not left queued for the reconciler: none runs meanwhile (rather than a bound of a few
    // seconds, which a busy machine can take to start and end b)
    const reconcile = h.rt.engine.sessions.reconcile;
    h.rt.engine.sessions.reconcile = async () => ({ finished: 0, started: 0 });
    try {
      try {
        await a.release();
        await eventually(async () => resumed > 0, 'b to be held');
      } finally {
        h.rt.store.tasks.update = update;
      }
      const s = await eventually(async () => {
        const s = (await h.call<Body>('GET', `/api/v1/sessions/${id}`)).body;
        return s.outcome ? s : null;
      }, 'the session to end');
      expect(s.tasks.map((t: Body) => [t.id, t.status])).to.deep.equal([
        ['a', 'succeeded'],
        ['b', 'succeeded'],
      ]);
    } finally {
      h.rt.engine.sessions.reconcile = reconcile;
      await a.clear();
    }
  });

  it('keeps the session running while a task runs when the recount of a task that ended read its counts before the next task was added', async () => {
    const id = await session();
    const first = releasable(h, 'release-recount-first');
    const second = releasable(h, 'release-recount-second');
    const status = async () => (await h.call<Body>('GET', `/api/v1/sessions/${id}`)).body;
    const counts = h.rt.store.tasks.counts;
    try {
      expect((await h.call('POST', `/api/v1/sessions/${id}/tasks`, { body: { id: 't1', steps: sh(first.command) } })).status).to.equal(201);
      await eventually(async () => (await status()).tasks[0].status === 'running', 't1 to run');
      // the recount of t1's end reads its counts (t1 ended, nothing else) and is held there; t2 is added and
      // runs meanwhile, and its own recount finds the session running: nothing to write
      let hold!: () => void;
      const held = new Promise<void>((resolve) => (hold = resolve));
      let armed = true;
      h.rt.store.tasks.counts = async (...args: Parameters<typeof counts>) => {
        const read = await counts.apply(h.rt.store.tasks, args);
        if (armed && read.succeeded === 1 && !read.queued && !read.running && !read.pending) {
          armed = false;
          await held;
        }
        return read;
      };
      await first.release();
      await eventually(() => !armed, 't1’s recount to read its counts');
      expect((await h.call('POST', `/api/v1/sessions/${id}/tasks`, { body: { id: 't2', steps: sh(second.command) } })).status).to.equal(201);
      await eventually(async () => (await status()).tasks.find((t: Body) => t.id === 't2').status === 'running', 't2 to run');
      hold();
      // the held recount writes what it read (idle, succeeded), then reads again: t2 runs, so running again
      const s = await eventually(async () => {
        const now = await status();
        return now.status === 'running' && now.outcome === null ? now : null;
      }, 'the session to say it runs while t2 runs');
      expect(s.task_counts).to.deep.include({ running: 1, succeeded: 1 });
      await second.release();
      expect((await settled(id, 2)).outcome).to.equal('succeeded');
    } finally {
      h.rt.store.tasks.counts = counts;
      await first.clear();
      await second.clear();
    }
  });

  it('goes on after Redis loses the DAG’s state: a task that ends releases its dependents, and a task added later sees what ended before', async () => {
    const id = await session();
    const forget = async () => {
      const keys = await scanKeys(h.rt.redis, `${h.config.queuePrefix}:dag:{${id}}*`);
      expect(keys.length).to.be.greaterThan(0);
      await h.rt.redis.del(...keys);
    };
    const tasks = [
      { id: 'a', steps: sh('sleep 0.5') },
      { id: 'b', depends_on: ['a'], steps: sh('true') },
    ];
    expect((await h.call<Body>('POST', `/api/v1/sessions/${id}/tasks`, { body: { tasks } })).status).to.equal(201);
    // lost while a runs: b, registered again by the reconciler, is released by a's end, or finds it ended
    await forget();
    await h.rt.engine.sessions.reconcile(0);
    const ended = await reconciledToEnd(id);
    expect(ended.tasks.map((t: Body) => [t.id, t.status])).to.deep.equal([
      ['a', 'succeeded'],
      ['b', 'succeeded'],
    ]);
    // lost again, after both ended: a task added on one of them starts (no reconciler needed)
    await forget();
    const added = await h.call<Body>('POST', `/api/v1/sessions/${id}/tasks`, { body: { id: 'c', depends_on: ['b'], steps: sh('true') } });
    expect(added.status, added.text).to.equal(201);
    // released at once: its run is made as it is stored (a fast worker can have started or even ended it before
    // the answer reads the task back)
    expect(added.body.data[0].run_ids).to.have.length(1);
    expect(['queued', 'running', 'succeeded']).to.include(added.body.data[0].status);
    expect((await settled(id, 3)).tasks.map((t: Body) => t.status)).to.deep.equal(['succeeded', 'succeeded', 'succeeded']);
  });

  /**
   * A session of a (held until released) and b after it, and a save of its DAG's keys taken while a runs (a
   * running, b waiting on it); `restore` brings Redis back to that save, as a restart from it, or a failover to a
   * replica that far behind, would.
   */
  const savedWhileARuns = async () => {
    const id = await session();
    const keys = ['state', 'need', 'rule', 'sat', 'kids'].map((k) => `${h.config.queuePrefix}:dag:{${id}}:${k}`);
    const a = releasable(h, `release-${id}`);
    const tasks = [
      { id: 'a', steps: sh(a.command) },
      { id: 'b', depends_on: ['a'], steps: sh('true') },
    ];
    expect((await h.call<Body>('POST', `/api/v1/sessions/${id}/tasks`, { body: { tasks } })).status).to.equal(201);
    await eventually(async () => (await h.rt.store.tasks.get('tenant-a', id, 'a'))?.status === 'running', 'a to run');
    const saved = await Promise.all(keys.map(async (k) => [k, await h.rt.redis.dumpBuffer(k), await h.rt.redis.pttl(k)] as const));
    return {
      id,
      a,
      state: (task: string) => h.rt.redis.hget(keys[0]!, task),
      restore: async () => {
        for (const [k, dump, ttl] of saved) if (dump) await h.rt.redis.restore(k, ttl > 0 ? ttl : 0, dump, 'REPLACE');
      },
    };
  };

  it('goes on after Redis comes back with older data (a restart from an older save, a failover to a replica behind): what the store has ended, Redis learns', async () => {
    const { id, a, state, restore } = await savedWhileARuns();
    await a.release();
    expect((await settled(id, 2)).outcome).to.equal('succeeded');
    // Redis restarts from that save: it has a running and b pending again, though both ended in the store
    await restore();
    expect(await state('a')).to.equal('running');
    // a task added on a (and one on b) starts: it does not wait for an end of a that will never come again
    const added = await h.call<Body>('POST', `/api/v1/sessions/${id}/tasks`, {
      body: {
        tasks: [
          { id: 'c', depends_on: ['a'], steps: sh('true') },
          { id: 'd', depends_on: ['b'], steps: sh('true') },
        ],
      },
    });
    expect(added.status, added.text).to.equal(201);
    const ended = await settled(id, 4);
    expect(ended.tasks.map((t: Body) => [t.id, t.status, t.run_ids.length])).to.deep.equal([
      ['a', 'succeeded', 1],
      ['b', 'succeeded', 1],
      ['c', 'succeeded', 1],
      ['d', 'succeeded', 1],
    ]);
    expect(ended.outcome).to.equal('succeeded');
  });

  it('starts, by the reconciler, a task registered before Redis went back to older data in which its dependency had not ended', async () => {
    const { id, a, state, restore } = await savedWhileARuns();
    // a ends, and its release of b is lost with Redis's later data and the process that would have started b:
    // b's start is refused once, and Redis goes back to the save
    const dispatchOf = h.rt.engine.runs.createIdempotent;
    let refused = 0;
    let restored = false;
    h.rt.engine.runs.createIdempotent = (async (...args: Parameters<typeof dispatchOf>) => {
      const request = args[3];
      if (typeof request !== 'function' && request.trigger.type === 'task' && request.trigger.task_id === 'b' && !refused++) {
        await restore();
        restored = true;
        throw new Error('the process died');
      }
      return dispatchOf(...args);
    }) as typeof dispatchOf;
    try {
      await a.release();
      // (every key back before the reconciler looks: a save is restored whole, not a key at a time)
      await eventually(async () => (await h.rt.store.tasks.get('tenant-a', id, 'a'))?.status === 'succeeded' && restored, 'a to end');
    } finally {
      h.rt.engine.runs.createIdempotent = dispatchOf;
    }
    expect(await state('b')).to.equal('pending');
    const ended = await reconciledToEnd(id);
    expect(ended.tasks.map((t: Body) => [t.id, t.status])).to.deep.equal([
      ['a', 'succeeded'],
      ['b', 'succeeded'],
    ]);
  });

  it('moves a dependent Redis failed upstream whose move was lost (the failed task’s store write refused once): the reconciler applies it', async () => {
    const id = await session();
    const tasks = h.rt.store.tasks;
    const update = tasks.update.bind(tasks);
    let refused = 0;
    tasks.update = async (tenantId, sessionId, taskId, changes, ifStatusIn) => {
      if (sessionId === id && taskId === 'bad' && changes.status === 'failed' && !refused++) throw new Error('SQLITE_IOERR: disk I/O error');
      return update(tenantId, sessionId, taskId, changes, ifStatusIn);
    };
    try {
      const body = {
        tasks: [
          { id: 'bad', steps: sh('exit 3'), max_attempts: 1 },
          { id: 'child', depends_on: ['bad'], steps: sh('true') },
          { id: 'grandchild', depends_on: ['child'], steps: sh('true') },
        ],
      };
      expect((await h.call('POST', `/api/v1/sessions/${id}/tasks`, { body })).status).to.equal(201);
      await eventually(() => refused > 0 || null, 'the failed task’s move to be refused');
    } finally {
      tasks.update = update;
    }
    const ended = await reconciledToEnd(id);
    expect(ended.tasks.map((t: Body) => [t.id, t.status])).to.deep.equal([
      ['bad', 'failed'],
      ['child', 'upstream_failed'],
      ['grandchild', 'upstream_failed'],
    ]);
    expect(ended).to.deep.include({ status: 'idle', outcome: 'failed' });
  });

  it('ends a task Redis ended whose own end the store refused (a ready task whose run could not start): the reconciler applies it and the session ends', async () => {
    const id = await session();
    const allowed = h.config.toolsAllowed as string[];
    const tasks = h.rt.store.tasks;
    const update = tasks.update.bind(tasks);
    let refused = 0;
    tasks.update = async (tenantId, sessionId, taskId, changes, ifStatusIn) => {
      if (sessionId === id && taskId === 'b' && changes.status === 'failed' && !refused++) throw new Error('SQLITE_IOERR: disk I/O error');
      return update(tenantId, sessionId, taskId, changes, ifStatusIn);
    };
    const first = releasable(h, 'release-end-not-stored');
    const at = allowed.indexOf('shell');
    try {
      const body = {
        tasks: [
          { id: 'a', steps: sh(first.command) },
          { id: 'b', depends_on: ['a'], steps: sh('true') },
          { id: 'c', depends_on: ['b'], steps: [{ tool: 'message', args: { text: 'c' } }] },
        ],
      };
      expect((await h.call('POST', `/api/v1/sessions/${id}/tasks`, { body })).status).to.equal(201);
      await eventually(async () => {
        const a = (await h.call<Body>('GET', `/api/v1/sessions/${id}/tasks`)).body.data[0];
        return a.run_ids.length && (await h.call<Body>('GET', `/api/v1/runs/${a.run_ids[0]}`)).body.steps[0]?.status === 'running';
      }, 'a to be running its step');
      // b, ready once a ends, cannot be started (shell is taken off the list), and its failure's store write is refused
      allowed.splice(at, 1);
      await first.release();
      await eventually(() => refused > 0 || null, 'b’s end to be refused by the store');
    } finally {
      if (!allowed.includes('shell')) allowed.splice(at, 0, 'shell');
      tasks.update = update;
      await first.clear();
    }
    const ended = await reconciledToEnd(id);
    expect(ended.tasks.map((t: Body) => [t.id, t.status])).to.deep.equal([
      ['a', 'succeeded'],
      ['b', 'failed'],
      ['c', 'upstream_failed'],
    ]);
    expect(ended.tasks[1].output.error.code).to.equal('task-end-not-stored');
    expect(ended).to.deep.include({ status: 'idle', outcome: 'failed' });
  });

  it('keeps in Redis only what the DAG still needs, for a bounded time: no dependency sets once their tasks ended, every key with a TTL', async () => {
    const id = await session();
    const tasks = [
      { id: 'a', steps: sh('true') },
      { id: 'b', depends_on: ['a'], steps: sh('true') },
      { id: 'c', depends_on: ['a'], steps: sh('true') },
      { id: 'd', depends_on: ['b', 'c'], steps: sh('true') },
    ];
    expect((await h.call('POST', `/api/v1/sessions/${id}/tasks`, { body: { tasks } })).status).to.equal(201);
    await settled(id, 4);
    const keys = (await scanKeys(h.rt.redis, `${h.config.queuePrefix}:dag:{${id}}*`)).map((k) => k.slice(`${h.config.queuePrefix}:dag:{${id}}`.length)).sort();
    expect(keys).to.deep.equal([':need', ':rule', ':state']);
    for (const k of keys) {
      const ttl = await h.rt.redis.pttl(`${h.config.queuePrefix}:dag:{${id}}${k}`);
      expect(ttl, k)
        .to.be.greaterThan(6 * 86_400_000)
        .and.at.most(7 * 86_400_000);
    }
    // a task added later on an ended one reads its state: it starts, and leaves nothing behind either
    expect((await h.call('POST', `/api/v1/sessions/${id}/tasks`, { body: { id: 'e', depends_on: ['d'], steps: sh('true') } })).status).to.equal(201);
    await settled(id, 5);
    expect((await scanKeys(h.rt.redis, `${h.config.queuePrefix}:dag:{${id}}*`)).length).to.equal(3);
  });

  it('keeps every DAG key of a session as long as its DAG changes: a dependent registered long ago is still released', async () => {
    const id = await session();
    const held = releasable(h, 'release-kids-ttl');
    const base = `${h.config.queuePrefix}:dag:{${id}}`;
    const body = {
      tasks: [
        { id: 'a', steps: sh(held.command) },
        { id: 'b', depends_on: ['a', 'z'], steps: sh('true') },
        { id: 'z', steps: sh('true') },
      ],
    };
    expect((await h.call('POST', `/api/v1/sessions/${id}/tasks`, { body })).status).to.equal(201);
    // z has ended (b half satisfied), a runs: b's dependency set and a's dependents are kept
    await eventually(
      async () => (await h.call<Body>('GET', `/api/v1/sessions/${id}`)).body.tasks.find((t: Body) => t.id === 'z').status === 'succeeded' || null,
      'z to end',
    );
    // days pass: shortened here to a second left on every key, then a change of the DAG (another task)
    for (const k of [':state', ':need', ':rule', ':sat', ':kids']) expect(await h.rt.redis.pexpire(`${base}${k}`, 1000), k).to.equal(1);
    expect((await h.call('POST', `/api/v1/sessions/${id}/tasks`, { body: { id: 'x', steps: sh('true') } })).status).to.equal(201);
    for (const k of [':sat', ':kids']) expect(await h.rt.redis.pttl(`${base}${k}`), k).to.be.greaterThan(6 * 86_400_000);
    await new Promise((r) => setTimeout(r, 1100));
    await held.release();
    const s = await settled(id, 4);
    await held.clear();
    expect(Object.fromEntries(s.tasks.map((t: Body) => [t.id, t.status]))).to.deep.equal({ a: 'succeeded', b: 'succeeded', z: 'succeeded', x: 'succeeded' });
  });

  it('retries a task whose run ran out of its budget’s time, as any failed try, up to max_attempts', async () => {
    const id = await session();
    const agent = await h.call<Body>('POST', `/api/v1/sessions/${id}/agents`, { body: { name: 'slow', tool_allowlist: ['shell'], budget: { seconds: 1 } } });
    expect(agent.status, agent.text).to.equal(201);
    const body = { id: 'slow', agent_id: agent.body.id, steps: sh('sleep 5'), max_attempts: 2 };
    expect((await h.call('POST', `/api/v1/sessions/${id}/tasks`, { body })).status).to.equal(201);
    const s = await settled(id, 1);
    expect(s.tasks[0]).to.deep.include({ status: 'failed', attempts: 2 });
    const run = (await h.call<Body>('GET', `/api/v1/runs/${s.tasks[0].run_ids[0]}`)).body;
    expect(run.status).to.equal('timed_out');
    expect(run.attempt).to.equal(2);
  });

  it('offers at once, on resume, a task’s next try that the pause held (its try before failed while paused)', async () => {
    const id = await session();
    const held = releasable(h, 'release-retry');
    // the first try waits for the release, then fails; the second succeeds
    const steps = sh(`${held.command}; if [ -e tried-${id} ]; then true; else touch tried-${id}; exit 1; fi`);
    expect((await h.call('POST', `/api/v1/sessions/${id}/tasks`, { body: { id: 'r', steps, max_attempts: 2 } })).status).to.equal(201);
    await eventually(async () => (await h.call<Body>('GET', `/api/v1/sessions/${id}`)).body.tasks[0].status === 'running' || null, 'the first try to run');
    expect((await h.call('PATCH', `/api/v1/sessions/${id}`, { body: { status: 'paused' } })).status).to.equal(200);
    await held.release();
    const queue = h.rt.queues.get('runs');
    const runId = (await h.call<Body>('GET', `/api/v1/sessions/${id}`)).body.tasks[0].run_ids[0];
    // the second try's job, held at its start: delayed
    await eventually(async () => {
      const run = (await h.call<Body>('GET', `/api/v1/runs/${runId}`)).body;
      if (run.attempt !== 2 || run.status !== 'queued') return null;
      const job = await queue.getJob(jobIdOfRun(run as Parameters<typeof jobIdOfRun>[0], 2));
      return (job && (await job.getState()) === 'delayed' && (await h.rt.redis.exists(`${h.config.queuePrefix}:runs:${job.id}:lock`)) === 0) || null;
    }, 'the second try to be held');
    await new Promise((r) => setTimeout(r, 300));
    const resumed = Date.now();
    expect((await h.call('PATCH', `/api/v1/sessions/${id}`, { body: { status: 'idle' } })).status).to.equal(200);
    const s = await settled(id, 1);
    await held.clear();
    expect(s.tasks[0].status).to.equal('succeeded');
    expect(Date.now() - resumed, 'started by the resume, not by the held job’s own retry 5 s later').to.be.below(3500);
  });

  it('gives back the tenant slot of a run its paused session holds: the tenant’s other runs go on, and the held ones start after the resume', async () => {
    const one = await startHarness({ env: { SERVICE_TENANT_MAX_RUNNING: '1' } });
    try {
      const held = releasable(one, 'release-slot-blocker');
      const blocker = await one.call<Body>('POST', '/api/v1/autonomy/run', { body: { steps: sh(held.command) } });
      expect(blocker.status, blocker.text).to.equal(202);
      await eventually(
        async () => (await one.call<Body>('GET', `/api/v1/runs/${blocker.body.run_id}`)).body.status === 'running' || null,
        'the blocker to run',
      );
      const id = (await one.call<Body>('POST', '/api/v1/sessions', { body: { title: 'held' } })).body.id as string;
      const tasks = [
        { id: 't1', steps: sh('true') },
        { id: 't2', steps: sh('true') },
      ];
      expect((await one.call('POST', `/api/v1/sessions/${id}/tasks`, { body: { tasks } })).status).to.equal(201);
      expect((await one.call('PATCH', `/api/v1/sessions/${id}`, { body: { status: 'paused' } })).status).to.equal(200);
      await held.release();
      // the paused session's runs are held at their start, and hold no slot: another run of the tenant runs
      const other = await one.call<Body>('POST', '/api/v1/autonomy/run', { body: { steps: sh('echo other') } });
      const done = await eventually(
        async () => {
          const r = (await one.call<Body>('GET', `/api/v1/runs/${other.body.run_id}`)).body;
          return r.status === 'succeeded' ? r : null;
        },
        'the other run to end while the session is paused',
        15_000,
      );
      expect(done.status).to.equal('succeeded');
      const paused = (await one.call<Body>('GET', `/api/v1/sessions/${id}`)).body;
      expect(paused.tasks.map((t: Body) => t.status)).to.deep.equal(['queued', 'queued']);
      // resumed: the held runs take the slot in turn and run
      expect((await one.call('PATCH', `/api/v1/sessions/${id}`, { body: { status: 'idle' } })).status).to.equal(200);
      const ended = await eventually(async () => {
        const s = (await one.call<Body>('GET', `/api/v1/sessions/${id}`)).body;
        return s.outcome ? s : null;
      }, 'the session to end');
      expect(ended.outcome).to.equal('succeeded');
      // the slot of a run that ended is given back in its end's round trip, a moment after its status is stored
      await eventually(async () => {
        const { running, waiting } = (await one.rt.engine.runs.reliabilityContext('tenant-a')).tenant;
        return (running === 0 && waiting === 0) || null;
      }, 'every slot to be free');
      await held.clear();
    } finally {
      await one.close();
    }
  });

  it('counts as repaired only what the reconciler did: a task the normal path started after the pass read it is not counted', async () => {
    const id = await session();
    expect((await h.call('POST', `/api/v1/sessions/${id}/tasks`, { body: { id: 'a', steps: sh('true') } })).status).to.equal(201);
    const s = await settled(id, 1);
    // the pass read it pending, and Redis said it was ready, before the normal path started (and here ended) it
    const before = { ...s.tasks[0], status: 'pending', run_ids: [] };
    await h.rt.redis.hset(`${h.config.queuePrefix}:dag:{${id}}:state`, 'a', 'queued');
    const tasks = h.rt.store.tasks;
    const listStale = tasks.listStale.bind(tasks);
    tasks.listStale = async (status, ...rest) => (status === 'pending' ? [before as never] : listStale(status, ...rest));
    try {
      expect(await h.rt.engine.sessions.reconcile(0)).to.deep.equal({ finished: 0, started: 0 });
    } finally {
      tasks.listStale = listStale;
      await h.rt.redis.hset(`${h.config.queuePrefix}:dag:{${id}}:state`, 'a', 'succeeded');
    }
    expect((await h.call<Body>('GET', `/api/v1/sessions/${id}`)).body.tasks[0].run_ids).to.have.length(1);
  });

  it('gives back the slot a task run took again at its start when it was canceled meanwhile', async () => {
    const one = await startHarness({ env: { SERVICE_TENANT_MAX_RUNNING: '1' } });
    try {
      let canceled = 0;
      // a cancel that lands while the run's start is checked (after the session's guard, before its write)
      one.rt.engine.runs.guardStart(async (run) => {
        if (run.trigger.type !== 'task' || canceled++) return null;
        await one.call('POST', `/api/v1/runs/${run.id}/cancel`);
        // the cancel's end has given the slot back before the start goes on
        await eventually(async () => (await one.rt.engine.runs.reliabilityContext('tenant-a')).tenant.running === 0 || null, 'the cancel to free the slot');
        return null;
      });
      const id = (await one.call<Body>('POST', '/api/v1/sessions', { body: { title: 'cut' } })).body.id as string;
      expect((await one.call('POST', `/api/v1/sessions/${id}/tasks`, { body: { id: 'a', steps: sh('true') } })).status).to.equal(201);
      await eventually(
        async () => (await one.call<Body>('GET', `/api/v1/sessions/${id}`)).body.tasks[0].status === 'canceled' || null,
        'the task to be canceled',
      );
      const other = await one.call<Body>('POST', '/api/v1/autonomy/run', { body: { steps: sh('echo other') } });
      await eventually(
        async () => (await one.call<Body>('GET', `/api/v1/runs/${other.body.run_id}`)).body.status === 'succeeded' || null,
        'the tenant’s next run to run',
        10_000,
      );
      // the slot of a run that ended is given back in its end's round trip, a moment after its status is stored
      await eventually(async () => {
        const { running, waiting } = (await one.rt.engine.runs.reliabilityContext('tenant-a')).tenant;
        return (running === 0 && waiting === 0) || null;
      }, 'every slot to be free');
    } finally {
      await one.close();
    }
  });

  it('numbers the tasks of two adds at once apart: each batch in one run of positions, and listed so', async () => {
    const id = await session();
    await h.call('PATCH', `/api/v1/sessions/${id}`, { body: { status: 'paused' } });
    // both read the session's count before either stores its batch
    const restore = heldTogether(h.rt.store.tasks, 'counts', 2);
    try {
      const add = (prefix: string) =>
        h.call<Body>('POST', `/api/v1/sessions/${id}/tasks`, {
          body: { tasks: [1, 2].map((n) => ({ id: `${prefix}${n}`, steps: sh('true') })) },
        });
      const answers = await Promise.all([add('p'), add('q')]);
      expect(answers.map((a) => a.status)).to.deep.equal([201, 201]);
      const positions = answers.map((a) => a.body.data.map((t: Body) => t.position));
      expect(positions.flat().sort()).to.deep.equal([1, 2, 3, 4]);
      for (const p of positions) expect(p[1] - p[0]).to.equal(1);
    } finally {
      restore();
    }
    const listed = (await h.call<Body>('GET', `/api/v1/sessions/${id}/tasks`)).body.data.map((t: Body) => t.id);
    expect([['p1', 'p2', 'q1', 'q2'].join(), ['q1', 'q2', 'p1', 'p2'].join()]).to.include(listed.join());
  });

  it('answers the same 422 when two requests at once choose the same task id: one is stored, the other names the clash', async () => {
    for (let round = 0; round < 5; round++) {
      const id = await session();
      const post = () =>
        h.call<Body>('POST', `/api/v1/sessions/${id}/tasks`, {
          body: {
            tasks: [
              { id: 'mine', steps: sh('true') },
              { id: `other${round}`, steps: sh('true') },
            ],
          },
        });
      const answers = await Promise.all([post(), post()]);
      expect(answers.map((a) => a.status).sort(), JSON.stringify(answers.map((a) => a.body))).to.deep.equal([201, 422]);
      const refused = answers.find((a) => a.status === 422)!.body;
      expect(refused.code).to.equal('task-graph-invalid');
      expect(refused.errors.map((e: Body) => e.message)).to.include('task id mine is used twice');
      expect((await h.call<Body>('GET', `/api/v1/sessions/${id}/tasks`)).body.data.map((t: Body) => t.id).sort()).to.deep.equal(['mine', `other${round}`]);
    }
  });

  it('repairs a task whose run ended while no hook saw it (a process died between the two writes), and starts what it releases', async () => {
    const quiet = await startHarness({ workers: false });
    try {
      const id = (await quiet.call<Body>('POST', '/api/v1/sessions', { body: { title: 'lost hook' } })).body.id;
      const added = await quiet.call<Body>('POST', `/api/v1/sessions/${id}/tasks`, {
        body: {
          tasks: [
            { id: 'first', steps: sh('true') },
            { id: 'second', depends_on: ['first'], steps: sh('true') },
          ],
        },
      });
      expect(added.status, added.text).to.equal(201);
      const runId = added.body.data.find((t: Body) => t.id === 'first').run_ids[0];
      // the run ends without its hooks (as if its worker died right after the store write)
      const now = new Date().toISOString();
      await quiet.rt.store.runs.update('tenant-a', runId, { status: 'running', started_at: now }, { status: ['queued'] });
      await quiet.rt.store.runs.update('tenant-a', runId, { status: 'succeeded', finished_at: now, duration_ms: 1, summary: 'ok' }, { status: ['running'] });
      const repaired = await quiet.rt.engine.sessions.reconcile(0);
      expect(repaired.finished).to.equal(1);
      const tasks = (await quiet.call<Body>('GET', `/api/v1/sessions/${id}/tasks`)).body.data;
      expect(tasks.map((t: Body) => [t.id, t.status])).to.deep.equal([
        ['first', 'succeeded'],
        ['second', 'queued'],
      ]);
      expect(tasks[1].run_ids).to.have.length(1);
      expect(await quiet.rt.engine.sessions.reconcile(0)).to.deep.equal({ finished: 0, started: 0 });

      // a resume whose write landed but whose starts were lost: the held task starts, and its session runs
      const held = (await quiet.call<Body>('POST', '/api/v1/sessions', { body: { title: 'lost resume' } })).body.id;
      await quiet.call('PATCH', `/api/v1/sessions/${held}`, { body: { status: 'paused' } });
      expect((await quiet.call<Body>('POST', `/api/v1/sessions/${held}/tasks`, { body: { id: 'h', steps: sh('true') } })).status).to.equal(201);
      expect(await quiet.rt.store.sessions.update('tenant-a', held, { status: 'idle' }, ['paused'])).to.not.equal(null);
      expect(await quiet.rt.engine.sessions.reconcile(0)).to.deep.equal({ finished: 0, started: 1 });
      const resumed = (await quiet.call<Body>('GET', `/api/v1/sessions/${held}`)).body;
      expect(resumed.status).to.equal('running');
      expect(resumed.tasks[0]).to.deep.include({ status: 'queued' });
      expect(resumed.tasks[0].run_ids).to.have.length(1);

      // one task that cannot be repaired (a read of it fails) holds back no other of the pass
      const two = await Promise.all(
        ['broken', 'fine'].map(async (title) => {
          const sid = (await quiet.call<Body>('POST', '/api/v1/sessions', { body: { title } })).body.id as string;
          await quiet.call('PATCH', `/api/v1/sessions/${sid}`, { body: { status: 'paused' } });
          expect((await quiet.call<Body>('POST', `/api/v1/sessions/${sid}/tasks`, { body: { id: 't', steps: sh('true') } })).status).to.equal(201);
          await quiet.rt.store.sessions.update('tenant-a', sid, { status: 'idle' }, ['paused']);
          return sid;
        }),
      );
      const read = quiet.rt.store.tasks.get.bind(quiet.rt.store.tasks);
      quiet.rt.store.tasks.get = async (...args: Parameters<typeof read>) => {
        if (args[1] === two[0]) throw new Error('injected');
        return read(...args);
      };
      const logged = quiet.logs.length;
      try {
        expect(await quiet.rt.engine.sessions.reconcile(0)).to.deep.equal({ finished: 0, started: 1 });
      } finally {
        quiet.rt.store.tasks.get = read;
      }
      expect((await quiet.call<Body>('GET', `/api/v1/sessions/${two[1]}`)).body.tasks[0].run_ids).to.have.length(1);
      expect(quiet.logs.slice(logged).some((l) => l.includes('a task could not be repaired'))).to.equal(true);
      // the next pass, the read answering again, repairs it
      expect(await quiet.rt.engine.sessions.reconcile(0)).to.deep.equal({ finished: 0, started: 1 });

      // tasks stored whose registration in Redis never happened (their request's Redis work cut off): registered, and started
      const unregistered = (await quiet.call<Body>('POST', '/api/v1/sessions', { body: { title: 'never registered' } })).body.id as string;
      const [model] = await quiet.rt.store.tasks.list('tenant-a', two[1]!);
      const stored = (id: string, depends_on: string[]) => ({
        ...model!,
        id,
        session_id: unregistered,
        depends_on,
        status: 'pending' as const,
        run_ids: [],
        output: null,
      });
      expect(await quiet.rt.store.tasks.insertMany([stored('u1', []), stored('u2', ['u1'])])).to.equal('inserted');
      expect(await quiet.rt.engine.sessions.reconcile(0)).to.deep.equal({ finished: 0, started: 1 });
      const registered = (await quiet.call<Body>('GET', `/api/v1/sessions/${unregistered}/tasks`)).body.data as Body[];
      expect(registered.map((t) => [t.id, t.status, t.run_ids.length])).to.deep.equal([
        ['u1', 'queued', 1],
        ['u2', 'pending', 0],
      ]);
      expect(await quiet.rt.engine.sessions.reconcile(0), 'registered once: nothing more to repair').to.deep.equal({ finished: 0, started: 0 });
    } finally {
      await quiet.close();
    }
  });
});
