// Sessions: the record of every autonomy run, multi-agent sessions with agents and a durable message
// log, pause and archive, the live trace through a real SSE client, and tenant isolation on every route.
import { expect } from 'chai';
import { EventSource } from 'eventsource';
import { FAKE_TOKEN, SMTP_USER, startFakeProviders, type FakeProviders } from '../support/fake-providers.js';
import { eventually, finishedRun, heldTogether, KEYS, releasable, startHarness, type Harness } from '../support/harness.js';

type Body = Record<string, any>;

describe('sessions', function () {
  this.timeout(30_000);
  let h: Harness;
  before(async () => {
    h = await startHarness();
  });
  after(async () => {
    await h.close();
  });

  const create = async (body: object = { title: 'Release', goal: 'ship it' }, key = KEYS.a) => {
    const res = await h.call<Body>('POST', '/api/v1/sessions', { body, key });
    expect(res.status, res.text).to.equal(201);
    return res.body;
  };

  it('records a session for every autonomy run: running while it runs, idle with the run’s outcome after', async () => {
    // the run goes on until the test lets it end: a slow machine's GET still finds it running
    const hold = releasable(h, 'release-session-record');
    const res = await h.call<Body>('POST', '/api/v1/autonomy/run', { body: { steps: [{ tool: 'shell', args: { command: hold.command } }] } });
    const sessionId = res.body.session_id;
    try {
      const during = await h.call<Body>('GET', `/api/v1/sessions/${sessionId}`);
      expect(during.body).to.deep.include({ kind: 'autonomy', status: 'running', outcome: null, title: '1 step' });
      await hold.release();
      await finishedRun(h, res.body.run_id);
    } finally {
      await hold.clear();
    }
    const done = await eventually(async () => {
      const s = (await h.call<Body>('GET', `/api/v1/sessions/${sessionId}`)).body;
      return s.status === 'idle' ? s : null;
    }, 'the session to go idle');
    expect(done.outcome).to.equal('succeeded');
    expect(done.runs.map((r: Body) => r.id)).to.deep.equal([res.body.run_id]);
    const listed = await h.call<Body>('GET', '/api/v1/sessions?kind=autonomy&limit=100');
    expect(listed.body.data.map((s: Body) => s.id)).to.include(sessionId);
    const runs = await h.call<Body>('GET', `/api/v1/sessions/${sessionId}/runs`);
    expect(runs.body.data.map((r: Body) => r.id)).to.deep.equal([res.body.run_id]);
    // a replayed request does not make a second session
    const key = { 'idempotency-key': `sess-${Date.now()}` };
    const first = await h.call<Body>('POST', '/api/v1/autonomy/run', { body: { steps: [{ tool: 'message', args: { text: 'x' } }] }, headers: key });
    const again = await h.call<Body>('POST', '/api/v1/autonomy/run', { body: { steps: [{ tool: 'message', args: { text: 'x' } }] }, headers: key });
    expect(again.body.session_id).to.equal(first.body.session_id);
  });

  it('creates, lists, updates, pauses and resumes a multi-agent session; an archived one is read-only', async () => {
    const s = await create();
    expect(s).to.deep.include({ kind: 'multi_agent', status: 'idle', outcome: null, title: 'Release', goal: 'ship it' });
    const zero = { pending: 0, queued: 0, running: 0, input_required: 0, succeeded: 0, failed: 0, upstream_failed: 0, canceled: 0 };
    expect(s.task_counts).to.deep.equal(zero);
    const renamed = await h.call<Body>('PATCH', `/api/v1/sessions/${s.id}`, { body: { title: 'Release 2.4' } });
    expect(renamed.body.title).to.equal('Release 2.4');
    expect((await h.call<Body>('PATCH', `/api/v1/sessions/${s.id}`, { body: { status: 'paused' } })).body.status).to.equal('paused');
    // every Session carries its tasks' counts: a held task is queued
    await h.call('POST', `/api/v1/sessions/${s.id}/tasks`, { body: { id: 'held', steps: [{ tool: 'message', args: { text: 'x' } }] } });
    const paused = await h.call<Body>('GET', '/api/v1/sessions?status=paused&kind=multi_agent');
    expect(paused.body.data.map((x: Body) => x.id)).to.include(s.id);
    expect(paused.body.data.find((x: Body) => x.id === s.id).task_counts).to.deep.equal({ ...zero, queued: 1 });
    const resumed = (await h.call<Body>('PATCH', `/api/v1/sessions/${s.id}`, { body: { status: 'running' } })).body;
    expect(resumed.status).to.be.oneOf(['running', 'idle']);
    await eventually(async () => (await h.call<Body>('GET', `/api/v1/sessions/${s.id}`)).body.status === 'idle' || null, 'the held task to end');
    const archived = await h.call<Body>('DELETE', `/api/v1/sessions/${s.id}`);
    expect(archived.status).to.equal(200);
    expect(archived.body.status).to.equal('archived');
    expect(archived.body.task_counts).to.deep.equal({ ...zero, succeeded: 1 });
    expect((await h.call<Body>('DELETE', `/api/v1/sessions/${s.id}`)).body.status).to.equal('archived');
    expect((await h.call('PATCH', `/api/v1/sessions/${s.id}`, { body: { title: 'x' } })).status).to.equal(409);
    expect((await h.call('POST', `/api/v1/sessions/${s.id}/messages`, { body: { role: 'user', parts: [{ type: 'text', text: 'hi' }] } })).status).to.equal(409);
    expect((await h.call('POST', `/api/v1/sessions/${s.id}/agents`, { body: { name: 'late' } })).status).to.equal(409);
    const live = await h.call<Body>('GET', '/api/v1/sessions?limit=100');
    expect(live.body.data.map((x: Body) => x.id)).not.to.include(s.id);
    expect((await h.call<Body>('GET', '/api/v1/sessions?status=archived&limit=100')).body.data.map((x: Body) => x.id)).to.include(s.id);
    // a run session follows its run: it is not paused by hand
    const run = await h.call<Body>('POST', '/api/v1/autonomy/run', { body: { steps: [{ tool: 'message', args: { text: 'x' } }] } });
    expect((await h.call('PATCH', `/api/v1/sessions/${run.body.session_id}`, { body: { status: 'paused' } })).status).to.equal(409);
  });

  it('archiving cancels what runs in the session', async () => {
    const res = await h.call<Body>('POST', '/api/v1/autonomy/run', { body: { steps: [{ tool: 'shell', args: { command: 'sleep 30' } }] } });
    await eventually(async () => (await h.call<Body>('GET', `/api/v1/runs/${res.body.run_id}`)).body.status === 'running', 'the run to start');
    const archived = await h.call<Body>('DELETE', `/api/v1/sessions/${res.body.session_id}`);
    expect(archived.body.status).to.equal('archived');
    expect((await finishedRun(h, res.body.run_id)).status).to.equal('canceled');
    // the archived session takes its run's outcome
    await eventually(async () => (await h.call<Body>('GET', `/api/v1/sessions/${res.body.session_id}`)).body.outcome === 'canceled', 'the outcome');
    expect((await h.call<Body>('GET', `/api/v1/sessions/${res.body.session_id}`)).body.status).to.equal('archived');
  });

  it('adds agents and keeps a durable message log in seq order; only user and system messages are injected', async () => {
    const s = await create({ title: 'log' });
    const agent = await h.call<Body>('POST', `/api/v1/sessions/${s.id}/agents`, {
      body: { name: 'writer', role: 'docs', instructions: 'Write clearly.', tool_allowlist: ['read_file', 'message'], budget: { seconds: 60 } },
    });
    expect(agent.status, agent.text).to.equal(201);
    expect(agent.body).to.deep.include({ name: 'writer', session_id: s.id, model: null });
    expect((await h.call<Body>('GET', `/api/v1/sessions/${s.id}/agents`)).body.data.map((a: Body) => a.id)).to.deep.equal([agent.body.id]);
    expect((await h.call<Body>('GET', `/api/v1/sessions/${s.id}`)).body.agents.map((a: Body) => a.name)).to.deep.equal(['writer']);
    const posted = [];
    for (const [role, text] of [
      ['user', 'first'],
      ['system', 'second'],
      ['user', 'third'],
    ]) {
      const r = await h.call<Body>('POST', `/api/v1/sessions/${s.id}/messages`, { body: { role, parts: [{ type: 'text', text }], to: agent.body.id } });
      expect(r.status, r.text).to.equal(201);
      posted.push(r.body);
    }
    expect(posted.map((m) => m.seq)).to.deep.equal([1, 2, 3]);
    const page = await h.call<Body>('GET', `/api/v1/sessions/${s.id}/messages?limit=2`);
    expect(page.body.data.map((m: Body) => m.parts[0].text)).to.deep.equal(['first', 'second']);
    const rest = await h.call<Body>('GET', `/api/v1/sessions/${s.id}/messages?cursor=${page.body.next_cursor}`);
    expect(rest.body.data.map((m: Body) => m.parts[0].text)).to.deep.equal(['third']);
    expect(rest.body.next_cursor).to.equal(null);
    expect((await h.call('POST', `/api/v1/sessions/${s.id}/messages`, { body: { role: 'agent', parts: [{ type: 'text', text: 'no' }] } })).status).to.equal(
      400,
    );
    // a reply names a message of this session
    const reply = await h.call<Body>('POST', `/api/v1/sessions/${s.id}/messages`, {
      body: { role: 'user', in_reply_to: posted[0]!.id, parts: [{ type: 'text', text: 'a reply' }] },
    });
    expect(reply.status, reply.text).to.equal(201);
    expect(reply.body.in_reply_to).to.equal(posted[0]!.id);
    const other = await create({ title: 'elsewhere' });
    for (const id of [posted[0]!.id, 'msg_01m00000000000000000000000']) {
      const dangling = await h.call<Body>('POST', `/api/v1/sessions/${other.id}/messages`, {
        body: { role: 'user', in_reply_to: id, parts: [{ type: 'text', text: 'x' }] },
      });
      expect(dangling.status, id).to.equal(404);
    }
    expect((await h.call<Body>('GET', `/api/v1/sessions/${other.id}/messages`)).body.data).to.deep.equal([]);
    const unknownAgent = await h.call('POST', `/api/v1/sessions/${s.id}/messages`, {
      body: { role: 'user', to: 'agt_01m00000000000000000000000', parts: [{ type: 'text', text: 'x' }] },
    });
    expect(unknownAgent.status).to.equal(404);
    // a long message is whole in the log; its trace event carries its first 4,000 characters and says so
    const long = 'x'.repeat(60_000);
    const big = await h.call<Body>('POST', `/api/v1/sessions/${s.id}/messages`, { body: { role: 'user', parts: [{ type: 'text', text: long }] } });
    expect(big.status).to.equal(201);
    const event = (await h.rt.events.after(`session:${s.id}`, '0-0')).find((e) => e.type === 'message.created' && (e.data as Body).message_id === big.body.id)!;
    expect((event.data as Body).text).to.have.length(4000);
    expect((event.data as Body).text_truncated).to.equal(true);
    const kept = (await h.call<Body>('GET', `/api/v1/sessions/${s.id}/messages?limit=100`)).body.data.find((m: Body) => m.id === big.body.id);
    expect(kept.parts[0].text).to.equal(long);
  });

  it('streams the trace through a real SSE client: messages and session changes, until the session is archived', async () => {
    const s = await create({ title: 'trace' });
    const received: { type: string; data: Body }[] = [];
    const es = new EventSource(`${h.url}/api/v1/sessions/${s.id}/trace`, {
      fetch: (input, init) => fetch(input, { ...init, headers: { ...(init?.headers as Record<string, string>), authorization: `Bearer ${KEYS.a}` } }),
    });
    let closed = false;
    for (const t of ['session.updated', 'message.created']) es.addEventListener(t, (e) => received.push({ type: t, data: JSON.parse(e.data).data }));
    es.onerror = () => {
      closed = true;
    };
    try {
      await eventually(() => received.length >= 1, 'the creation event');
      await h.call('POST', `/api/v1/sessions/${s.id}/messages`, { body: { role: 'user', parts: [{ type: 'text', text: 'hello trace' }] } });
      await eventually(() => received.some((e) => e.type === 'message.created'), 'the message event');
      expect(received.find((e) => e.type === 'message.created')!.data).to.deep.include({ role: 'user', text: 'hello trace', seq: 1 });
      await h.call('DELETE', `/api/v1/sessions/${s.id}`);
      await eventually(() => received.some((e) => e.type === 'session.updated' && e.data.status === 'archived'), 'the archive event');
      await eventually(() => closed || es.readyState !== EventSource.OPEN, 'the trace to end');
    } finally {
      es.close();
    }
  });

  it('ends the trace with the archived session’s outcome, after what the archive stopped; a client that saw the end gets 204', async () => {
    const s = await create({ title: 'stopped' });
    const sh = (command: string) => [{ tool: 'shell', args: { command } }];
    const tasks = [
      { id: 'long', steps: sh('sleep 30') },
      { id: 'after', depends_on: ['long'], steps: sh('true') },
      { id: 'anyway', depends_on: ['long'], trigger_rule: 'all_done', steps: sh('true') },
    ];
    expect((await h.call('POST', `/api/v1/sessions/${s.id}/tasks`, { body: { tasks } })).status).to.equal(201);
    await eventually(async () => (await h.call<Body>('GET', `/api/v1/sessions/${s.id}`)).body.tasks[0].status === 'running' || null, 'the long task to run');
    await h.call('DELETE', `/api/v1/sessions/${s.id}`);
    // read from the start: the stream ends by itself
    const read = async (lastEventId?: string) => {
      const res = await fetch(`${h.url}/api/v1/sessions/${s.id}/trace`, {
        headers: { authorization: `Bearer ${KEYS.a}`, ...(lastEventId ? { 'last-event-id': lastEventId } : {}) },
        signal: AbortSignal.timeout(15_000),
      });
      const events = (await res.text())
        .split('\n\n')
        .filter((block) => block.includes('data: '))
        .map((block) => {
          const field = (name: string) =>
            block
              .split('\n')
              .find((l) => l.startsWith(`${name}: `))!
              .slice(name.length + 2);
          return { id: field('id'), type: field('event'), data: JSON.parse(field('data')).data as Body };
        });
      return { status: res.status, events };
    };
    const { status, events } = await eventually(async () => {
      const r = await read();
      return r.events.at(-1)?.data.outcome ? r : null;
    }, 'the archive to end its tasks');
    expect(status).to.equal(200);
    const end = events.at(-1)!;
    expect(end).to.deep.include({ type: 'session.updated' });
    expect(end.data).to.include({ status: 'archived', outcome: 'canceled' });
    // the cancellations and the long task's run end are in it, before the end
    const canceled = events.filter((e) => e.type === 'task.updated' && e.data.status === 'canceled').map((e) => e.data.task_id);
    expect(canceled.sort()).to.deep.equal(['after', 'anyway', 'long']);
    expect(events.some((e) => e.type === 'run.finished' && e.data.status === 'canceled')).to.equal(true);
    expect(events.filter((e) => e.type === 'session.updated' && e.data.status === 'archived').length).to.be.at.least(2);
    // its end once: two recounts at once that read the same write it once (the second, conditional on the outcome read, none)
    await new Promise((r) => setTimeout(r, 300));
    const ends = (await h.rt.events.after(`session:${s.id}`, '0-0')).filter((e) => e.type === 'session.updated' && (e.data as Body).outcome);
    expect(ends.map((e) => e.id)).to.deep.equal([end.id]);
    // a reconnect after the end: 204, so EventSource stops; one before it gets the rest and the end
    expect((await read(end.id)).status).to.equal(204);
    const rest = await read(events.at(-3)!.id);
    expect(rest.events.map((e) => e.id)).to.deep.equal(events.slice(-2).map((e) => e.id));
    // the end event can be read before the session's record is committed: a client that names it gets 204 then too
    const sessions = h.rt.store.sessions;
    const get = sessions.get;
    sessions.get = async (tenantId, id) => {
      const stored = await get.call(sessions, tenantId, id);
      return stored && { ...stored, status: 'running', outcome: null };
    };
    try {
      expect((await read(end.id)).status, 'the end named by the client').to.equal(204);
    } finally {
      sessions.get = get;
    }
  });

  it('ends an open trace when Redis refused its session’s last event: the event is tried again, and one never taken ends the trace once its tries are over', async () => {
    const events = h.rt.events;
    const append = events.append;
    /** sessions whose archive's last event Redis refuses: once, or (Infinity) every time */
    const refusing = new Map<string, number>();
    events.append = async function (this: typeof events, stream, event) {
      const left = refusing.get(event.session_id ?? '') ?? 0;
      if (left > 0 && event.type === 'session.updated' && (event.data as Body).status === 'archived' && (event.data as Body).outcome) {
        refusing.set(event.session_id!, left - 1);
        throw new Error('OOM command not allowed when used memory > maxmemory');
      }
      return append.call(this, stream, event);
    } as typeof append;
    /** the trace read from the start until the server ends it: its events' types and outcomes */
    const readToEnd = async (id: string) => {
      const res = await fetch(`${h.url}/api/v1/sessions/${id}/trace`, { headers: { authorization: `Bearer ${KEYS.a}` }, signal: AbortSignal.timeout(15_000) });
      return (await res.text())
        .split('\n')
        .filter((l) => l.startsWith('data: '))
        .map((l) => JSON.parse(l.slice(6)) as Body);
    };
    const endedSession = async () => {
      const s = await create({ title: 'refused end' });
      await h.call('POST', `/api/v1/sessions/${s.id}/tasks`, { body: { id: 'one', steps: [{ tool: 'message', args: { text: 'done' } }] } });
      await eventually(async () => (await h.call<Body>('GET', `/api/v1/sessions/${s.id}`)).body.outcome === 'succeeded', 'the session to end');
      return s.id as string;
    };
    try {
      // refused once: the trace still ends with it
      const once = await endedSession();
      refusing.set(once, 1);
      const reading = readToEnd(once);
      await h.call('DELETE', `/api/v1/sessions/${once}`);
      const got = await reading;
      expect(got.at(-1)).to.deep.include({ type: 'session.updated' });
      expect(got.at(-1)!.data).to.include({ status: 'archived', outcome: 'succeeded' });
      expect(refusing.get(once)).to.equal(0);
      // refused every time: once the tries are over (the session's last change older than them), the trace ends
      const never = await endedSession();
      refusing.set(never, Infinity);
      const waiting = readToEnd(never);
      await h.call('DELETE', `/api/v1/sessions/${never}`);
      await eventually(async () => (await h.call<Body>('GET', `/api/v1/sessions/${never}`)).body.status === 'archived', 'the archive');
      await new Promise((r) => setTimeout(r, 1500));
      const longAgo = new Date(Date.now() - 7 * 60_000).toISOString();
      expect(await h.rt.store.sessions.update('tenant-a', never, { updated_at: longAgo }, ['archived'])).to.not.equal(null);
      const ended = await waiting;
      expect(ended.some((e) => e.type === 'session.updated' && e.data.status === 'archived' && e.data.outcome)).to.equal(false);
    } finally {
      events.append = append;
    }
  });

  it('takes tasks and agents only in multi-agent sessions, and a resume asked of a running session changes nothing', async () => {
    const run = await h.call<Body>('POST', '/api/v1/autonomy/run', { body: { steps: [{ tool: 'message', args: { text: 'x' } }] } });
    const refused = await h.call<Body>('POST', `/api/v1/sessions/${run.body.session_id}/tasks`, {
      body: { steps: [{ tool: 'message', args: { text: 'y' } }] },
    });
    expect(refused.status).to.equal(409);
    expect(refused.body.detail).to.contain('multi-agent');
    // nor agents, which only tasks give work to
    const agent = await h.call<Body>('POST', `/api/v1/sessions/${run.body.session_id}/agents`, { body: { name: 'idle hands' } });
    expect(agent.status).to.equal(409);
    expect(agent.body.detail).to.contain('multi-agent');
    expect((await h.call<Body>('GET', `/api/v1/sessions/${run.body.session_id}/agents`)).body.data).to.deep.equal([]);
    const s = await create({ title: 'busy' });
    // the task runs until the test lets it end (in the workspace, its step's folder): a task that slept 2 s
    // could end, and its session go idle, before the two requests on a busy machine
    const busy = releasable(h, 'release-busy-session');
    await h.call('POST', `/api/v1/sessions/${s.id}/tasks`, {
      body: { steps: [{ tool: 'shell', args: { command: busy.command } }] },
    });
    await eventually(async () => (await h.call<Body>('GET', `/api/v1/sessions/${s.id}`)).body.status === 'running' || null, 'the session to run');
    try {
      for (const status of ['idle', 'running']) {
        const patched = await h.call<Body>('PATCH', `/api/v1/sessions/${s.id}`, { body: { status } });
        expect(patched.body.status, status).to.equal('running');
      }
      const updates = (await h.rt.events.after(`session:${s.id}`, '0-0')).filter((e) => e.type === 'session.updated').map((e) => (e.data as Body).status);
      expect(updates).to.deep.equal(['idle', 'running']);
    } finally {
      await busy.release();
    }
    await eventually(async () => (await h.call<Body>('GET', `/api/v1/sessions/${s.id}`)).body.status === 'idle' || null, 'the task to end');
    await busy.clear();
  });

  it('refuses a message to the session of an autonomy or vibe run with 409, as it refuses its tasks and agents, over HTTP and from the session tool', async () => {
    const step = [{ tool: 'message', args: { text: 'x' } }];
    for (const [kind, path] of [
      ['autonomy', '/api/v1/autonomy/run'],
      ['vibe', '/api/v1/autonomy/vibe/run'],
    ] as const) {
      const run = await h.call<Body>('POST', path, { body: { steps: step } });
      expect(run.status, run.text).to.equal(202);
      const id = run.body.session_id;
      const message = await h.call<Body>('POST', `/api/v1/sessions/${id}/messages`, { body: { role: 'user', parts: [{ type: 'text', text: 'anyone?' }] } });
      expect(message.status, message.text).to.equal(409);
      // the same refusal as a task's, in the same words: only what is refused differs
      const task = await h.call<Body>('POST', `/api/v1/sessions/${id}/tasks`, { body: { steps: step } });
      const article = kind === 'autonomy' ? 'an' : 'a';
      expect(task.body).to.deep.include({
        code: 'conflict',
        status: 409,
        detail: `session ${id} is the session of ${article} ${kind} run; tasks go in multi-agent sessions`,
      });
      expect(message.body).to.deep.include({
        code: 'conflict',
        status: 409,
        detail: `session ${id} is the session of ${article} ${kind} run; messages go in multi-agent sessions`,
      });
      // nothing reads an inbox there: the session tool's message is refused too, as the step's own answer
      const post = { tool: 'session', args: { action: 'post_message', session_id: id, message: { text: 'anyone?' } } };
      const poster = await finishedRun(h, (await h.call<Body>('POST', '/api/v1/autonomy/run', { body: { steps: [post] } })).body.run_id);
      expect(poster.steps[0].status, kind).to.equal('failed');
      expect(poster.steps[0].error).to.deep.include({ code: 'conflict' });
      expect((await h.call<Body>('GET', `/api/v1/sessions/${id}/messages`)).body.data, kind).to.deep.equal([]);
    }
  });

  it('clears an ended session’s outcome in the write that stores the tasks giving it work again: no reader finds it finished with a task pending', async () => {
    const s = await create({ title: 'again' });
    const step = [{ tool: 'message', args: { text: 'x' } }];
    expect((await h.call('POST', `/api/v1/sessions/${s.id}/tasks`, { body: { id: 'first', steps: step } })).status).to.equal(201);
    await eventually(
      async () => (await h.call<Body>('GET', `/api/v1/sessions/${s.id}`)).body.outcome === 'succeeded' || null,
      'the first task to end the session',
    );
    // the add held just after its store write: Redis has not the task yet, and the session has not been recounted
    const tasks = h.rt.store.tasks;
    const insert = tasks.insertMany;
    let seen: { one: Body; listed: Body | undefined } | undefined;
    tasks.insertMany = async (...args) => {
      const inserted = await insert.apply(tasks, args);
      const one = (await h.call<Body>('GET', `/api/v1/sessions/${s.id}`)).body;
      const idle = (await h.call<Body>('GET', '/api/v1/sessions?status=idle&kind=multi_agent&limit=100')).body.data;
      seen = { one, listed: idle.find((x: Body) => x.id === s.id) };
      return inserted;
    };
    try {
      expect((await h.call('POST', `/api/v1/sessions/${s.id}/tasks`, { body: { id: 'second', steps: step } })).status).to.equal(201);
    } finally {
      tasks.insertMany = insert;
    }
    expect(seen?.one).to.deep.include({ status: 'idle', outcome: null });
    expect(seen?.one.task_counts).to.deep.include({ pending: 1, succeeded: 1 });
    expect(seen?.listed, 'listed idle, not finished').to.deep.include({ status: 'idle', outcome: null });
    // the trace hears of it before it hears of the new task
    const trace = await h.rt.events.after(`session:${s.id}`, '0-0');
    const ended = trace.findIndex((e) => e.type === 'session.updated' && (e.data as Body).outcome === 'succeeded');
    const added = trace.findIndex((e) => e.type === 'task.updated' && (e.data as Body).task_id === 'second');
    const between = trace.slice(ended + 1, added).filter((e) => e.type === 'session.updated');
    expect(
      between.map((e) => e.data),
      'the session reopened between its end and the new task',
    ).to.deep.equal([{ status: 'idle', outcome: null, title: 'again' }]);
    const done = await eventually(async () => {
      const now = (await h.call<Body>('GET', `/api/v1/sessions/${s.id}`)).body;
      return now.outcome ? now : null;
    }, 'the second task to end the session');
    expect(done).to.deep.include({ status: 'idle', outcome: 'succeeded' });
    expect(done.task_counts).to.deep.include({ succeeded: 2 });
  });

  it('holds a session to SERVICE_SESSION_MAX_TASKS tasks: a batch past it is one 422 and adds nothing', async () => {
    const small = await startHarness({ workers: false, env: { SERVICE_SESSION_MAX_TASKS: '5' } });
    try {
      const s = (await small.call<Body>('POST', '/api/v1/sessions', { body: { title: 'bounded' } })).body;
      const tasks = (ids: string[]) => ({ tasks: ids.map((id) => ({ id, steps: [{ tool: 'message', args: { text: id } }] })) });
      const add = (ids: string[]) => small.call<Body>('POST', `/api/v1/sessions/${s.id}/tasks`, { body: tasks(ids) });
      expect((await add(['a', 'b', 'c'])).status).to.equal(201);
      const over = await add(['d', 'e', 'f']);
      expect(over.status, over.text).to.equal(422);
      expect(over.body).to.deep.include({ code: 'task-graph-invalid' });
      expect(over.body.errors).to.deep.include({ path: '/body/tasks', message: 'a session holds at most 5 tasks (SERVICE_SESSION_MAX_TASKS); this one has 3' });
      expect((await small.call<Body>('GET', `/api/v1/sessions/${s.id}/tasks`)).body.data.map((t: Body) => t.id)).to.deep.equal(['a', 'b', 'c']);
      expect((await add(['d', 'e'])).status, 'up to the limit').to.equal(201);
      // one task sent as itself: the error names its body, as every other error of that form does
      const one = await small.call<Body>('POST', `/api/v1/sessions/${s.id}/tasks`, { body: { steps: [{ tool: 'message', args: { text: 'f' } }] } });
      expect(one.status, one.text).to.equal(422);
      expect(one.body.errors).to.deep.equal([{ path: '/body', message: 'a session holds at most 5 tasks (SERVICE_SESSION_MAX_TASKS); this one has 5' }]);
    } finally {
      await small.close();
    }
  });

  it("refuses a task whose steps use a tool its agent's allowlist does not hold, with the batch's other errors, and adds nothing", async () => {
    const s = (await h.call<Body>('POST', '/api/v1/sessions', { body: { title: 'allowlist' } })).body;
    const agent = (await h.call<Body>('POST', `/api/v1/sessions/${s.id}/agents`, { body: { name: 'talker', tool_allowlist: ['message'] } })).body;
    const res = await h.call<Body>('POST', `/api/v1/sessions/${s.id}/tasks`, {
      body: {
        tasks: [
          { id: 'ok', agent_id: agent.id, steps: [{ tool: 'message', args: { text: 'x' } }] },
          {
            id: 'shell',
            agent_id: agent.id,
            steps: [
              { tool: 'message', args: { text: 'x' } },
              { tool: 'shell', args: { command: 'echo hi' } },
            ],
          },
          { id: 'after', depends_on: ['nothing'], steps: [{ tool: 'shell', args: { command: 'true' } }] },
        ],
      },
    });
    expect(res.status, res.text).to.equal(422);
    expect(res.body.errors).to.deep.include({ path: '/body/tasks/1/steps/1/tool', message: `"shell" is not in the tool_allowlist of agent ${agent.id}` });
    expect(res.body.errors).to.have.length(2); // and the unknown dependency; a task of no agent has no agent's allowlist
    expect((await h.call<Body>('GET', `/api/v1/sessions/${s.id}/tasks`)).body.data).to.deep.equal([]);
    // sent as one task, its path is the body's
    const one = await h.call<Body>('POST', `/api/v1/sessions/${s.id}/tasks`, {
      body: { agent_id: agent.id, steps: [{ tool: 'shell', args: { command: 'true' } }] },
    });
    expect(one.body.errors).to.deep.equal([{ path: '/body/steps/0/tool', message: `"shell" is not in the tool_allowlist of agent ${agent.id}` }]);
    await h.call('DELETE', `/api/v1/sessions/${s.id}`);
  });

  it('holds a session to SERVICE_SESSION_MAX_TASKS when batches race: of two that fit alone but not together, one is added', async () => {
    const small = await startHarness({ workers: false, env: { SERVICE_SESSION_MAX_TASKS: '5' } });
    try {
      const s = (await small.call<Body>('POST', '/api/v1/sessions', { body: { title: 'bounded' } })).body;
      const tasks = (ids: string[]) => ({ tasks: ids.map((id) => ({ id, steps: [{ tool: 'message', args: { text: id } }] })) });
      const add = (ids: string[]) => small.call<Body>('POST', `/api/v1/sessions/${s.id}/tasks`, { body: tasks(ids) });
      // both read how many tasks the session holds before either stores its own
      const release = heldTogether(small.rt.store.tasks, 'counts', 2);
      const raced = await Promise.all([add(['a', 'b', 'c']), add(['d', 'e', 'f'])]).finally(release);
      expect(raced.map((r) => r.status).sort(), raced.map((r) => r.text).join('\n')).to.deep.equal([201, 422]);
      const [added, refused] = raced[0]!.status === 201 ? raced : [raced[1]!, raced[0]!];
      expect(refused!.body).to.deep.include({ code: 'task-graph-invalid' });
      expect(refused!.body.errors).to.deep.equal([
        { path: '/body/tasks', message: 'a session holds at most 5 tasks (SERVICE_SESSION_MAX_TASKS); this one has 3' },
      ]);
      const stored = (await small.call<Body>('GET', `/api/v1/sessions/${s.id}/tasks`)).body.data.map((t: Body) => t.id);
      expect(stored).to.deep.equal(added!.body.data.map((t: Body) => t.id));
      expect(stored).to.have.length(3);
      // nothing else of the refused batch either: no event on the trace, no state in the DAG
      const refusedIds = ['a', 'b', 'c', 'd', 'e', 'f'].filter((id) => !stored.includes(id));
      const traced = (await small.rt.events.after(`session:${s.id}`, '0-0')).filter((e) => e.type === 'task.updated').map((e) => (e.data as Body).task_id);
      expect(traced.filter((id) => refusedIds.includes(id))).to.deep.equal([]);
      expect(
        traced.filter((id) => stored.includes(id)),
        'the added batch is traced',
      ).to.not.deep.equal([]);
      const dag = await small.rt.redis.hgetall(`${small.config.queuePrefix}:dag:{${s.id}}:state`);
      expect(Object.keys(dag).sort()).to.deep.equal([...stored].sort());
    } finally {
      await small.close();
    }
  });

  it('gives a session with no task, once archived, the outcome canceled; archiving it again changes nothing', async () => {
    const s = await create({ title: 'empty' });
    const archived = (await h.call<Body>('DELETE', `/api/v1/sessions/${s.id}`)).body;
    expect(archived).to.include({ status: 'archived', outcome: 'canceled' });
    const again = (await h.call<Body>('DELETE', `/api/v1/sessions/${s.id}`)).body;
    expect(again.updated_at).to.equal(archived.updated_at);
  });

  it('answers 404 for another tenant’s session on every route', async () => {
    const s = await create({ title: 'mine' });
    const other = { key: KEYS.b };
    for (const [method, path, body] of [
      ['GET', `/api/v1/sessions/${s.id}`],
      ['PATCH', `/api/v1/sessions/${s.id}`, { title: 'x' }],
      ['DELETE', `/api/v1/sessions/${s.id}`],
      ['GET', `/api/v1/sessions/${s.id}/agents`],
      ['POST', `/api/v1/sessions/${s.id}/agents`, { name: 'x' }],
      ['GET', `/api/v1/sessions/${s.id}/messages`],
      ['POST', `/api/v1/sessions/${s.id}/messages`, { role: 'user', parts: [{ type: 'text', text: 'x' }] }],
      ['GET', `/api/v1/sessions/${s.id}/runs`],
      ['GET', `/api/v1/sessions/${s.id}/trace`],
    ] as [string, string, object?][]) {
      expect((await h.call(method, path, { ...other, body })).status, `${method} ${path}`).to.equal(404);
    }
    expect((await h.call<Body>('GET', '/api/v1/sessions?limit=100', other)).body.data.map((x: Body) => x.id)).not.to.include(s.id);
    expect((await h.call<Body>('GET', `/api/v1/sessions/${s.id}`)).body.status).to.equal('idle');
  });
});

describe('email to task (the session tool)', function () {
  this.timeout(30_000);
  let h: Harness;
  let fake: FakeProviders;
  before(async () => {
    fake = await startFakeProviders();
    // an agent endpoint is configured so goal tasks are accepted; the session stays paused, so none is called
    h = await startHarness({ env: { SERVICE_AGENT_BASE_URL: 'http://127.0.0.1:9/v1', SERVICE_AGENT_MODEL: 'none', SERVICE_HTTP_ALLOW_PRIVATE: '1' } });
    const smtp = { provider: 'email', name: 'smtp', base_url: fake.smtp, credential: FAKE_TOKEN, settings: { username: SMTP_USER, from: 'tasks@acme.test' } };
    expect((await h.call('POST', '/api/v1/connections', { body: smtp })).status).to.equal(201);
  });
  after(async () => {
    await h.close();
    await fake.close();
  });

  it('turns a signed inbound email from an allowed sender into a task of the named session and answers the sender with its id; one from anyone else into nothing', async () => {
    const session = (await h.call<Body>('POST', '/api/v1/sessions', { body: { title: 'inbox' } })).body;
    await h.call('PATCH', `/api/v1/sessions/${session.id}`, { body: { status: 'paused' } });
    const agent = (await h.call<Body>('POST', `/api/v1/sessions/${session.id}/agents`, { body: { name: 'triage', tool_allowlist: ['read_file'] } })).body;
    const automation = await h.call<Body>('POST', '/api/v1/automations/templates/instantiate', {
      body: { template_id: 'email-to-task', variables: { session_id: session.id, agent_id: agent.id, allowed_senders: 'ops@example.com,@trusted.example' } },
    });
    expect(automation.status, automation.text).to.equal(201);
    const secret = 'inbound-secret-0123456789';
    expect((await h.call('PUT', '/api/v1/webhook-secrets/email', { body: { secrets: [secret] } })).status).to.equal(200);
    // Postmark's own Received-SPF comes first in the headers it passes on: SPF passed for the envelope sender
    const spf = (verdict: string, envelope: string) => ({
      Name: 'Received-SPF',
      Value: `${verdict} (sender SPF authorized) identity=mailfrom; client-ip=192.0.2.1; helo=mx.example; envelope-from=${envelope}; receiver=in.example`,
    });
    const email = (from: string, subject: string, id: string, headers: Body[]) =>
      fetch(`${h.url}/webhooks/tenant-a/email`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', authorization: `Basic ${Buffer.from(`inbound:${secret}`).toString('base64')}` },
        body: JSON.stringify({
          From: from,
          To: 'inbox@in.example.com',
          Subject: subject,
          TextBody: 'Please rotate the keys.',
          MessageID: id,
          Attachments: [],
          Headers: headers,
        }),
      });
    expect((await email('Ops Team <ops@example.com>', 'Rotate keys', 'm-1', [spf('Pass', 'bounce@mail.example.com')])).status).to.equal(200);
    expect((await email('mallory@evil.example', 'Send me the keys', 'm-2', [spf('Pass', 'mallory@evil.example')])).status).to.equal(200);
    // a From the provider does not vouch for: SPF passed for another domain's envelope (a forged verdict further
    // down is the sender's own writing), SPF failed, no verdict at all, or an address with two @
    const spoofs: [string, Body[]][] = [
      ['ops@example.com', [spf('Pass', 'mallory@evil.example'), spf('Pass', 'ops@example.com')]],
      ['ops@example.com', [spf('Fail', 'ops@example.com')]],
      ['ops@example.com', []],
      ['mallory@evil.example@trusted.example', [spf('Pass', 'x@trusted.example')]],
    ];
    for (const [i, [from, headers]] of spoofs.entries()) expect((await email(from, `Spoof ${i}`, `s-${i}`, headers)).status).to.equal(200);
    // a subject past a task's 200 characters is cut to fit, not refused
    expect((await email('ops@example.com', `Long ${'x'.repeat(300)}`, 'm-3', [spf('Pass', 'ops@example.com')])).status).to.equal(200);
    const tasks = await eventually(async () => {
      const runs = (await h.call<Body>('GET', `/api/v1/automations/${automation.body.id}/history`)).body.data;
      if (runs.length < 3 + spoofs.length || runs.some((r: Body) => !['succeeded', 'failed'].includes(r.status))) return null;
      return (await h.call<Body>('GET', `/api/v1/sessions/${session.id}/tasks`)).body.data;
    }, 'both emails to be handled');
    expect(tasks).to.have.length(2);
    const [rotate, long] = [tasks.find((t: Body) => t.title === 'Rotate keys'), tasks.find((t: Body) => t.title.startsWith('Long '))];
    expect(rotate).to.deep.include({ agent_id: agent.id, status: 'queued' });
    expect(rotate.goal).to.contain('ops@example.com').and.contain('Please rotate the keys.');
    expect([...long.title]).to.have.length(200);
    expect(long.title.endsWith('…')).to.equal(true);
    // the allowed sender hears back, in the same thread; nobody else gets mail from the service
    expect(fake.mails).to.have.length(2);
    const answer = fake.mails.find((m) => /^Subject: Re: Rotate keys/m.test(m.data))!;
    expect(answer).to.deep.include({ from: 'tasks@acme.test', to: ['ops@example.com'] });
    expect(answer.data)
      .to.match(/^In-Reply-To: <?m-1>?/m)
      .and.contain(rotate.id);
    expect(fake.mails.every((m) => m.to.length === 1 && m.to[0] === 'ops@example.com')).to.equal(true);
    // another tenant's session cannot be named: the tool acts for its run's tenant only
    const foreign = await h.call<Body>('POST', '/api/v1/autonomy/run', {
      key: KEYS.b,
      body: {
        steps: [
          { tool: 'session', args: { action: 'add_task', session_id: session.id, task: { title: 'x', steps: [{ tool: 'message', args: { text: 'x' } }] } } },
        ],
      },
    });
    const run = await finishedRun(h, foreign.body.run_id, KEYS.b);
    expect(run.status).to.equal('failed');
    // the step fails with the service's own answer, as for any tool: not the run as an internal error
    expect(run.steps[0].error).to.deep.include({ code: 'not-found' });
    expect(run.error.code).to.not.equal('internal');
    expect((await h.call<Body>('GET', `/api/v1/sessions/${session.id}/tasks`)).body.data).to.have.length(2);
  });

  it('holds a task or message the session tool adds to the limits of one added over HTTP: 100 dependencies, a 200-character title, a 20,000-character goal, 100,000 characters of text', async () => {
    const session = (await h.call<Body>('POST', '/api/v1/sessions', { body: { title: 'limits' } })).body;
    await h.call('PATCH', `/api/v1/sessions/${session.id}`, { body: { status: 'paused' } });
    const agent = (await h.call<Body>('POST', `/api/v1/sessions/${session.id}/agents`, { body: { name: 'worker' } })).body;
    const parents = Array.from({ length: 150 }, (_, i) => ({ id: `p${i}`, goal: 'x', agent_id: agent.id }));
    expect((await h.call('POST', `/api/v1/sessions/${session.id}/tasks`, { body: { tasks: parents } })).status).to.equal(201);
    const viaTool = async (task: Body) => {
      const step = { tool: 'session', args: { action: 'add_task', session_id: session.id, task: { goal: 'join', agent_id: agent.id, ...task } } };
      const run = await finishedRun(h, (await h.call<Body>('POST', '/api/v1/autonomy/run', { body: { steps: [step] } })).body.run_id);
      return run.steps[0];
    };
    for (const task of [{ depends_on: parents.map((p) => p.id) }, { title: 't'.repeat(201) }, { goal: 'g'.repeat(20_001) }]) {
      const step = await viaTool(task);
      expect(step.status, JSON.stringify(task).slice(0, 80)).to.equal('failed');
      expect(step.error.code).to.equal('task-graph-invalid');
    }
    expect((await h.call<Body>('GET', `/api/v1/sessions/${session.id}/tasks?limit=500`)).body.data).to.have.length(150);
    // within them, it is added
    expect((await viaTool({ depends_on: parents.slice(0, 100).map((p) => p.id) })).status).to.equal('succeeded');
    expect((await h.call<Body>('GET', `/api/v1/sessions/${session.id}/tasks?limit=500`)).body.data).to.have.length(151);
    // and a message it posts, to the API's 100,000 characters a text
    const post = async (text: string) => {
      const step = { tool: 'session', args: { action: 'post_message', session_id: session.id, message: { text } } };
      return (await finishedRun(h, (await h.call<Body>('POST', '/api/v1/autonomy/run', { body: { steps: [step] } })).body.run_id)).steps[0];
    };
    const long = await post('m'.repeat(100_001));
    expect(long.status).to.equal('failed');
    expect(long.error).to.deep.include({ code: 'invalid-args' });
    expect((await post('😀'.repeat(100_000))).status, 'counted in characters, as the schema counts').to.equal('succeeded');
    const texts = (await h.call<Body>('GET', `/api/v1/sessions/${session.id}/messages`)).body.data.map((m: Body) => m.parts[0].text.length);
    expect(texts).to.deep.equal([200_000]);
  });
});
