// What the work of a multi-agent session with many tasks or messages costs: a message that may answer a waiting task
// reads the waiting tasks alone, through an index; a session's messages are read once for all its waiting tasks; a
// resume and an archive read its tasks without their outputs.
import { expect } from 'chai';
import type { MessageRecord, TaskRecord } from '../../engine/platform/index.js';
import { startHarness, type Harness } from '../support/harness.js';
import { taskFixture } from '../integration/store-contract.js';

type Body = Record<string, any>;

describe('the costs of a large session', function () {
  this.timeout(120_000);
  let h: Harness;
  before(async () => {
    h = await startHarness();
  });
  after(async () => {
    await h.close();
  });

  const past = new Date(Date.now() - 60_000).toISOString();
  const session = async () => (await h.call<Body>('POST', '/api/v1/sessions', { body: { title: 'answers' } })).body as Body;
  const stored = (s: Body, id: string, over: Partial<TaskRecord>): TaskRecord =>
    taskFixture({ id, tenant_id: s.tenant_id, session_id: s.id, attempts: 1, position: 0, created_at: past, updated_at: past, ...over });
  /** A task that asked a question after message `seq`, and waits for its answer. */
  const waiting = (s: Body, id: string, seq: number) =>
    stored(s, id, { status: 'input_required', output: { status: 'input_required', input_required: { message_id: `msg_q${seq}`, seq } } });
  /** An agent's message to all: it answers no task. */
  const chatter = (s: Body, n: number): Omit<MessageRecord, 'seq'> => ({
    id: `msg_c${n}`,
    tenant_id: s.tenant_id,
    session_id: s.id,
    role: 'agent',
    from: 'agt_chatty',
    to: null,
    kind: 'text',
    parts: [{ type: 'text', text: `note ${n}` }],
    task_id: null,
    run_id: null,
    in_reply_to: null,
    created_at: past,
  });

  it('reads only the waiting tasks for a message that may answer one, not the 10,000 ended beside it', async () => {
    const s = await session();
    const agent = (await h.call<Body>('POST', `/api/v1/sessions/${s.id}/agents`, { body: { name: 'other' } })).body;
    const output = { status: 'succeeded', summary: 'y'.repeat(1000), steps: [] };
    const ended = Array.from({ length: 10_000 }, (_, i) => stored(s, `done-${i}`, { status: 'succeeded', output }));
    for (let i = 0; i < ended.length; i += 1000) await h.rt.store.tasks.insertMany(ended.slice(i, i + 1000));
    await h.rt.store.tasks.insertMany([waiting(s, 'asks', 0)]);
    // messages to another agent: each may answer a waiting task, and answers none
    const post = () =>
      h.call<Body>('POST', `/api/v1/sessions/${s.id}/messages`, { body: { role: 'user', to: agent.id, parts: [{ type: 'text', text: 'hi' }] } });
    expect((await post()).status).to.equal(201);
    const started = performance.now();
    for (let i = 0; i < 10; i++) expect((await post()).status).to.equal(201);
    const ms = performance.now() - started;
    // reading every task of the session to find the waiting one, 10 messages took 1.3 s here; now 70-100 ms
    expect(ms, `10 messages took ${Math.round(ms)} ms`).to.be.below(500);
    expect((await h.rt.store.tasks.get(s.tenant_id, s.id, 'asks'))!.status).to.equal('input_required');
  });

  it('reads a session’s messages once for all its waiting tasks, in the reconciler’s pass and at a resume', async () => {
    const s = await session();
    await h.rt.store.tasks.insertMany(Array.from({ length: 20 }, (_, i) => waiting(s, `w${i}`, i)));
    for (let i = 0; i < 20_000; i += 500) await Promise.all(Array.from({ length: 500 }, (_, j) => h.rt.store.messages.append(chatter(s, i + j))));
    let started = performance.now();
    expect((await h.rt.engine.sessions.reconcile(0)).started).to.equal(0);
    const reconciled = performance.now() - started;
    expect((await h.call<Body>('PATCH', `/api/v1/sessions/${s.id}`, { body: { status: 'paused' } })).status).to.equal(200);
    started = performance.now();
    expect((await h.call<Body>('PATCH', `/api/v1/sessions/${s.id}`, { body: { status: 'running' } })).status).to.equal(200);
    const resumed = performance.now() - started;
    // read once a task, the 100 pages of messages took the pass 1.4 s here and the resume 1.7 s; now 80-160 ms each
    const took = `the reconciler's pass took ${Math.round(reconciled)} ms, the resume ${Math.round(resumed)} ms`;
    expect(reconciled, took).to.be.below(500);
    expect(resumed, took).to.be.below(500);
    expect(await h.rt.store.tasks.counts(s.tenant_id, s.id)).to.deep.equal({ input_required: 20 });
  });

  it('resumes a session of 300 tasks of 256 KB outputs without reading the outputs, and archives it', async () => {
    const s = await session();
    const output = {
      status: 'succeeded',
      summary: 'done',
      steps: Array.from({ length: 64 }, (_, i) => ({ tool: 'shell', output: { stdout: `${i}`.repeat(4000) } })),
    };
    const ended = Array.from({ length: 300 }, (_, i) => stored(s, `big-${i}`, { status: 'succeeded', output }));
    for (let i = 0; i < ended.length; i += 50) await h.rt.store.tasks.insertMany(ended.slice(i, i + 50));
    expect((await h.call<Body>('PATCH', `/api/v1/sessions/${s.id}`, { body: { status: 'paused' } })).status).to.equal(200);
    const started = performance.now();
    expect((await h.call<Body>('PATCH', `/api/v1/sessions/${s.id}`, { body: { status: 'running' } })).status).to.equal(200);
    const resumed = performance.now() - started;
    // reading 77 MB of outputs, the resume took 600 ms here; now 45-100 ms
    expect(resumed, `the resume took ${Math.round(resumed)} ms`).to.be.below(300);
    // the archive reads them without their outputs too (760 ms before, 250-290 ms now, most of it not the tasks' read)
    expect((await h.call<Body>('DELETE', `/api/v1/sessions/${s.id}`)).body).to.deep.include({ status: 'archived', outcome: 'succeeded' });
    expect((await h.rt.store.tasks.get(s.tenant_id, s.id, 'big-7'))!.output).to.deep.equal(output);
  });

  it('answers a session of 300 tasks of 256 KB outputs with their summaries, and pages through the tasks with their outputs', async () => {
    const s = await session();
    const output = (i: number) => ({
      status: 'succeeded',
      summary: `done ${i}`,
      usage: { steps: 1, model_turns: 0, seconds: 0, prompt_tokens: 2, completion_tokens: 1 },
      result: { final_answer: 'x'.repeat(1000) },
      steps: Array.from({ length: 64 }, (_, k) => ({ tool: 'shell', output: { stdout: `${k}`.repeat(4000) } })),
    });
    // a chain through every tenth task, the rest on their own: DAG order is not creation order
    const tasks = Array.from({ length: 300 }, (_, i) =>
      stored(s, `t${String(i).padStart(3, '0')}`, {
        status: 'succeeded',
        output: output(i),
        position: i + 1,
        depends_on: i % 10 === 0 && i ? [`t${String(i - 10).padStart(3, '0')}`] : [],
      }),
    );
    for (let i = 0; i < tasks.length; i += 50) await h.rt.store.tasks.insertMany(tasks.slice(i, i + 50));
    const detail = await h.call<Body>('GET', `/api/v1/sessions/${s.id}`);
    expect(detail.status, detail.text).to.equal(200);
    // 77 MB of outputs made an answer of 78 MB; the summaries are a few KB
    expect(detail.text.length, 'the detail’s size').to.be.below(500_000);
    expect(detail.body.tasks[5].output).to.deep.equal({ status: 'succeeded', summary: 'done 5', usage: output(5).usage });
    expect(detail.body.usage).to.deep.equal({ prompt_tokens: 600, completion_tokens: 300 });
    // the pages, 100 tasks each by default, are the detail's DAG order, each task once, with its whole output
    const order = detail.body.tasks.map((t: Body) => t.id);
    const read: Body[] = [];
    let cursor: string | null = null;
    do {
      const page: { status: number; text: string; body: Body } = await h.call<Body>(
        'GET',
        `/api/v1/sessions/${s.id}/tasks${cursor ? `?cursor=${cursor}` : ''}`,
      );
      expect(page.status, page.text).to.equal(200);
      expect(page.body.data.length).to.be.at.most(100);
      read.push(...page.body.data);
      cursor = page.body.next_cursor;
    } while (cursor);
    expect(read.map((t) => t.id)).to.deep.equal(order);
    expect(read[42]!.output).to.deep.equal(output(Number(read[42]!.id.slice(1))));
    const small = await h.call<Body>('GET', `/api/v1/sessions/${s.id}/tasks?limit=7`);
    expect(small.body.data.map((t: Body) => t.id)).to.deep.equal(order.slice(0, 7));
    // a cursor of another session's tasks, or a limit past 500: refused
    const other = await session();
    const foreign = await h.call<Body>('GET', `/api/v1/sessions/${other.id}/tasks?cursor=${small.body.next_cursor}`);
    expect(foreign.status, foreign.text).to.equal(400);
    expect((await h.call<Body>('GET', `/api/v1/sessions/${s.id}/tasks?limit=501`)).status).to.equal(400);
  });
});
