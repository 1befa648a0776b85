// The run session stream through a real SSE client (the eventsource package), including a reconnect
// in the middle of a run, and the POST that answers with the stream itself.
import net from 'node:net';
import { expect } from 'chai';
import { EventSource } from 'eventsource';
import { compareIds } from '../../engine/platform/events.js';
import type { ServiceEvent } from '../../engine/platform/index.js';
import { eventually, KEYS, releasable, startHarness, type Harness } from '../support/harness.js';

type Received = { id: string; type: string; data: Record<string, any> };

function open(h: Harness, sessionId: string, lastEventId?: string) {
  const received: Received[] = [];
  const es = new EventSource(`${h.url}/api/v1/autonomy/streaming/${sessionId}/events`, {
    fetch: (input, init) =>
      fetch(input, {
        ...init,
        headers: { ...(init?.headers as Record<string, string>), authorization: `Bearer ${KEYS.a}`, ...(lastEventId ? { 'last-event-id': lastEventId } : {}) },
      }),
  });
  const types = ['run.queued', 'run.started', 'step.started', 'step.output', 'step.finished', 'message.created', 'run.finished'];
  let ended = false;
  for (const t of types) {
    es.addEventListener(t, (e) => {
      received.push({ id: e.lastEventId, type: t, data: JSON.parse(e.data) });
      if (t === 'run.finished') {
        ended = true;
        es.close();
      }
    });
  }
  return { es, received, isEnded: () => ended };
}

/** POST /api/v1/autonomy/run with stream: true: the response is the run's event stream (or its refusal). */
function postStream(h: Harness, body: object, signal: AbortSignal): Promise<Response> {
  return fetch(`${h.url}/api/v1/autonomy/run`, {
    method: 'POST',
    headers: { authorization: `Bearer ${KEYS.a}`, 'content-type': 'application/json' },
    body: JSON.stringify({ stream: true, ...body }),
    signal,
  });
}

describe('run session streams', function () {
  this.timeout(30_000);
  let h: Harness;
  before(async () => {
    h = await startHarness();
  });
  after(async () => {
    await h.close();
  });

  it('streams a run to its end, then closes; a reconnect with Last-Event-ID gets only what was missed', async () => {
    const steps = [1, 2, 3, 4, 5, 6].map((i) => ({ tool: 'shell', args: { command: `echo line-${i}; sleep 0.15` } }));
    const { body } = await h.call('POST', '/api/v1/autonomy/run', { body: { steps } });
    const first = open(h, body.session_id);
    await eventually(() => first.received.filter((e) => e.type === 'step.finished').length >= 2, 'two steps');
    first.es.close();
    const seen = [...first.received];
    const last = seen[seen.length - 1]!.id;
    const second = open(h, body.session_id, last);
    await eventually(() => second.isEnded(), 'the terminal event', 15_000);
    const all = [...seen, ...second.received];
    const ids = all.map((e) => e.id);
    expect(new Set(ids).size, 'no duplicates').to.equal(ids.length);
    expect(second.received.every((e) => compareIds(e.id, last) > 0)).to.equal(true);
    expect(all[0]!.type).to.equal('run.queued');
    expect(all[all.length - 1]!.type).to.equal('run.finished');
    expect(all[all.length - 1]!.data.data.status).to.equal('succeeded');
    expect(all.filter((e) => e.type === 'step.finished')).to.have.length(6);
    const output = all
      .filter((e) => e.type === 'step.output')
      .map((e) => e.data.data.text)
      .join('');
    expect(output).to.equal([1, 2, 3, 4, 5, 6].map((i) => `line-${i}\n`).join(''));
    // a fresh subscriber after the end replays everything and closes
    const late = open(h, body.session_id);
    await eventually(() => late.isEnded(), 'the replayed terminal event');
    expect(late.received.map((e) => e.id)).to.deep.equal(ids);
    // a reconnect from the end (run.finished, or what followed it: the session's outcome) is a 204,
    // which stops EventSource, not a stream held open for good
    const url = `${h.url}/api/v1/autonomy/streaming/${body.session_id}/events`;
    // the session's outcome (its session.updated) is appended after run.finished, by a write of its own
    const log = await eventually(async () => {
      const events = await h.rt.events.after(`session:${body.session_id}`, '0-0');
      const finished = events.findIndex((e) => e.type === 'run.finished');
      return finished >= 0 && events.slice(finished + 1).some((e) => e.type === 'session.updated') ? events : null;
    }, 'the session to take its outcome');
    for (const after of [ids.at(-1)!, log.at(-1)!.id]) {
      const res = await fetch(url, { headers: { authorization: `Bearer ${KEYS.a}`, 'last-event-id': after }, signal: AbortSignal.timeout(5000) });
      expect(res.status, after).to.equal(204);
    }
    expect(log.at(-1)!.type).to.equal('session.updated');
  });

  it('tells a reader who resumes from before the events still kept what it missed, then sends what is kept', async () => {
    const steps = [1, 2, 3].map((i) => ({ tool: 'message', args: { text: `m${i}` } }));
    const { body } = await h.call('POST', '/api/v1/autonomy/run', { body: { steps } });
    const scope = `session:${body.session_id}`;
    // the session's outcome (its session.updated) follows run.finished: the log is whole once it is in
    const ended = (log: { type: string }[]) => {
      const finished = log.findIndex((e) => e.type === 'run.finished');
      return finished >= 0 && log.slice(finished + 1).some((e) => e.type === 'session.updated');
    };
    await eventually(async () => ended(await h.rt.events.after(scope, '0-0')), 'the run to end and its session to take its outcome');
    const log = await h.rt.events.after(scope, '0-0');
    // the log trimmed to its last 3 events as a long session's is past EVENTS_KEPT (test/integration/event-log.test.ts):
    // the oldest go and the newest dropped is noted
    const kept = log.slice(-3);
    await h.rt.redis.xtrim(h.rt.events.key(scope), 'MAXLEN', 3);
    await h.rt.redis.xsetid(h.rt.events.key(scope), log.at(-1)!.id, 'MAXDELETEDID', log.at(-4)!.id);
    const url = `${h.url}/api/v1/autonomy/streaming/${body.session_id}/events`;
    const read = async (after: string) => {
      const res = await fetch(url, { headers: { authorization: `Bearer ${KEYS.a}`, 'last-event-id': after }, signal: AbortSignal.timeout(5000) });
      return res.status === 200 ? await res.text() : `status ${res.status}`;
    };
    const text = await read(log[0]!.id);
    const notice = /event: stream\.truncated\ndata: (.*)\n\n/.exec(text);
    expect(notice, text).to.not.equal(null);
    expect(JSON.parse(notice![1]!)).to.deep.include({ type: 'stream.truncated', after: log[0]!.id, first_kept: kept[0]!.id });
    // the notice comes first and has no id (a reconnect resumes from the last event, not from it); then what is kept
    expect(text.indexOf('stream.truncated')).to.be.below(text.indexOf(`id: ${kept[0]!.id}`));
    expect(text).to.not.contain(`id: ${log[1]!.id}\n`);
    // a reader with nothing missing gets no notice
    const whole = await read(kept[0]!.id);
    expect(whole).to.not.contain('stream.truncated');
  });

  it('holds a tenant to SERVICE_TENANT_MAX_STREAMS streams open on a server: one more is a 429, another tenant is not held to it', async () => {
    const capped = await startHarness({ env: { SERVICE_TENANT_MAX_STREAMS: '2' } });
    const held = releasable(capped, 'release-streams-cap');
    const opened: AbortController[] = [];
    try {
      const { body } = await capped.call<Record<string, any>>('POST', '/api/v1/autonomy/run', {
        body: { steps: [{ tool: 'shell', args: { command: held.command } }] },
      });
      const urlOf = (session: string) => `${capped.url}/api/v1/autonomy/streaming/${session}/events`;
      const open = async (key = KEYS.a, url = urlOf(body.session_id)) => {
        const abort = new AbortController();
        opened.push(abort);
        return fetch(url, { headers: { authorization: `Bearer ${key}` }, signal: abort.signal });
      };
      const [first, second] = [await open(), await open()];
      expect([first.status, second.status]).to.deep.equal([200, 200]);
      const third = await open();
      expect(third.status).to.equal(429);
      expect(third.headers.get('retry-after')).to.equal('5');
      expect(((await third.json()) as { detail: string }).detail).to.contain('SERVICE_TENANT_MAX_STREAMS');
      // another tenant's are its own
      const other = await capped.call<Record<string, any>>('POST', '/api/v1/autonomy/run', {
        key: KEYS.b,
        body: { steps: [{ tool: 'shell', args: { command: held.command } }] },
      });
      expect((await open(KEYS.b, urlOf(other.body.session_id))).status).to.equal(200);
      // one closed, its place is free again
      opened[0]!.abort();
      await eventually(async () => {
        const again = await open();
        return again.status === 200 || null;
      }, 'a place to free');
    } finally {
      for (const a of opened) a.abort();
      await Promise.all([held.release(), held.release('tenant-b')]);
      await capped.close();
    }
  });

  it('gives back the place of a POST stream whose client left, and refuses a POST stream at the limit before starting its run', async () => {
    const capped = await startHarness({ env: { SERVICE_TENANT_MAX_STREAMS: '1' } });
    const held = releasable(capped, 'release-post-stream');
    const opened: AbortController[] = [];
    try {
      const post = async (steps: unknown[]) => {
        const abort = new AbortController();
        opened.push(abort);
        return { res: await postStream(capped, { steps }, abort.signal), abort };
      };
      const first = await post([{ tool: 'shell', args: { command: held.command } }]);
      expect(first.res.status).to.equal(200);
      const runId = first.res.headers.get('location')!.split('/').pop()!;
      await first.res.body!.getReader().read(); // the stream began
      first.abort.abort();
      // its client gone, its place is free while the run still runs
      const run = (await capped.call<Record<string, any>>('GET', `/api/v1/runs/${runId}`)).body;
      const watch = new AbortController();
      opened.push(watch);
      const url = `${capped.url}/api/v1/autonomy/streaming/${run.session_id}/events`;
      const again = await eventually(async () => {
        const res = await fetch(url, { headers: { authorization: `Bearer ${KEYS.a}` }, signal: watch.signal });
        return res.status === 200 ? res : null;
      }, 'the left stream’s place to be free');
      expect(again.status).to.equal(200);
      // at its limit again: a POST stream is refused before it starts a run
      const before = (await capped.call<Record<string, any>>('GET', '/api/v1/runs?limit=100')).body.data.length;
      const refused = await post([{ tool: 'message', args: { text: 'x' } }]);
      expect(refused.res.status).to.equal(429);
      expect((await capped.call<Record<string, any>>('GET', '/api/v1/runs?limit=100')).body.data.length).to.equal(before);
    } finally {
      for (const a of opened) a.abort();
      await held.release();
      await capped.close();
    }
  });

  it('of POST streams asked at once at the limit, starts the run of one only; a refused run gives its place back', async () => {
    const capped = await startHarness({ env: { SERVICE_TENANT_MAX_STREAMS: '1' } });
    const held = releasable(capped, 'release-post-streams');
    const opened: AbortController[] = [];
    try {
      const post = async (body: object) => {
        const abort = new AbortController();
        opened.push(abort);
        return postStream(capped, body, abort.signal);
      };
      // a run the engine refuses (a goal with no agent endpoint): its stream's place is given back
      expect((await post({ goal: 'plan it' })).status).to.equal(422);
      const answers = await Promise.all(Array.from({ length: 6 }, () => post({ steps: [{ tool: 'shell', args: { command: held.command } }] })));
      expect(answers.map((r) => r.status).sort()).to.deep.equal([200, 429, 429, 429, 429, 429]);
      expect((await capped.call<Record<string, any>>('GET', '/api/v1/runs?limit=100')).body.data.length, 'one run started').to.equal(1);
    } finally {
      for (const a of opened) a.abort();
      await held.release();
      await capped.close();
    }
  });

  it('lets a run started through each route be watched to its end', async () => {
    const automation = (
      await h.call('POST', '/api/v1/automations', { body: { name: 'watched', steps: [{ tool: 'shell', args: { command: 'echo automation' } }] } })
    ).body;
    const started = [
      await h.call('POST', '/api/v1/autonomy/run', { body: { steps: [{ tool: 'shell', args: { command: 'echo autonomy' } }] } }),
      await h.call('POST', '/api/v1/autonomy/vibe/run', { body: { steps: [{ tool: 'write_file', args: { path: 'vibe.txt', content: 'x' } }] } }),
      await h.call('POST', '/api/v1/automations/run', { body: { automation_id: automation.id } }),
    ];
    for (const res of started) {
      expect(res.status, res.text).to.equal(202);
      const stream = await fetch(`${h.url}${res.body.events_url}`, { headers: { authorization: `Bearer ${KEYS.a}` } });
      const text = await stream.text(); // ends after run.finished
      const types = [...text.matchAll(/^event: (.+)$/gm)].map((m) => m[1]);
      expect(types[0], res.body.run.kind).to.equal('run.queued');
      expect(types).to.include('run.started').and.include('step.finished');
      expect(types.at(-1)).to.equal('run.finished');
      expect(text).to.contain('"status":"succeeded"');
      // EventSource reconnects from the end on its own: every route's run answers it 204, an automation's (whose
      // run session has no session record) too, instead of a stream of heartbeats held open for good
      const lastId = [...text.matchAll(/^id: (.+)$/gm)].at(-1)![1]!;
      const again = await fetch(`${h.url}${res.body.events_url}`, {
        headers: { authorization: `Bearer ${KEYS.a}`, 'last-event-id': lastId },
        signal: AbortSignal.timeout(5000),
      });
      expect(again.status, res.body.run.kind).to.equal(204);
    }
  });

  it('keeps a multi-agent session’s run stream open until the log holds the end of each of its runs', async () => {
    const session = (await h.call<Record<string, any>>('POST', '/api/v1/sessions', { body: { title: 'two runs' } })).body;
    const step = [{ tool: 'message', args: { text: 'x' } }];
    const added = await h.call('POST', `/api/v1/sessions/${session.id}/tasks`, {
      body: {
        tasks: [
          { id: 'a', steps: step },
          { id: 'b', depends_on: ['a'], steps: step },
        ],
      },
    });
    expect(added.status, added.text).to.equal(201);
    const scope = `session:${session.id}`;
    const ends = await eventually(async () => {
      const s = (await h.call<Record<string, any>>('GET', `/api/v1/sessions/${session.id}`)).body;
      const finished = (await h.rt.events.after(scope, '0-0')).filter((e) => e.type === 'run.finished');
      return s.outcome === 'succeeded' && finished.length === 2 ? finished : null;
    }, 'both tasks to end');
    // b's end not in the log yet (Redis refused it; it is being tried again): a reader who saw a's end waits for it
    await h.rt.redis.xdel(h.rt.events.key(scope), ends[1]!.id);
    const url = `${h.url}/api/v1/autonomy/streaming/${session.id}/events`;
    const reader = new AbortController();
    const open = await fetch(url, { headers: { authorization: `Bearer ${KEYS.a}`, 'last-event-id': ends[0]!.id }, signal: reader.signal });
    expect(open.status, 'not a 204: the stream waits for b’s end').to.equal(200);
    reader.abort();
    await open.body?.cancel().catch(() => undefined);
    // once it is in, a reader who saw it is told the stream has ended
    const { id: _id, at: _at, ...end } = ends[1]!;
    const back = await h.rt.events.append(scope, end as never);
    const after = await fetch(url, { headers: { authorization: `Bearer ${KEYS.a}`, 'last-event-id': back.id }, signal: AbortSignal.timeout(5000) });
    expect(after.status, await after.text()).to.equal(204);
  });

  it('keeps a run’s events in order when Redis refuses one for a moment: the run’s later events wait behind it', async () => {
    const append = h.rt.events.append;
    let refused = 0;
    // Redis refuses the start's event (an OOM at maxmemory, say) once; it takes everything else
    h.rt.events.append = (async (...args: Parameters<typeof append>) => {
      if (args[1].type === 'run.started' && refused++ === 0) throw new Error('OOM command not allowed when used memory > maxmemory');
      return append.apply(h.rt.events, args);
    }) as typeof append;
    let log: { type: string }[];
    try {
      const { body } = await h.call('POST', '/api/v1/autonomy/run', {
        body: {
          steps: [
            { tool: 'message', args: { text: 'a' } },
            { tool: 'shell', args: { command: 'echo b' } },
          ],
        },
      });
      log = await eventually(
        async () => {
          const events = await h.rt.events.after(`session:${body.session_id}`, '0-0');
          return events.some((e) => e.type === 'run.started') && events.some((e) => e.type === 'run.finished') ? events : null;
        },
        'the refused event to be taken on its retry',
        10_000,
      );
    } finally {
      h.rt.events.append = append;
    }
    expect(refused).to.be.greaterThan(0);
    const types = log.map((e) => e.type).filter((t) => t.startsWith('run.') || t.startsWith('step.'));
    expect(types[0]).to.equal('run.queued');
    expect(types[1], types.join(' ')).to.equal('run.started');
    expect(types.at(-1), types.join(' ')).to.equal('run.finished');
    expect(types.filter((t) => t === 'step.finished')).to.have.length(2);
  });

  /** A no-op run of tenant A once it has ended and its session has taken its outcome: its answer, its log's scope, its log. */
  const endedRun = async (text: string) => {
    const { body } = await h.call('POST', '/api/v1/autonomy/run', { body: { steps: [{ tool: 'message', args: { text } }] } });
    const scope = `session:${body.session_id}`;
    const log = await eventually(async () => {
      const events = await h.rt.events.after(scope, '0-0');
      const finished = events.findIndex((e) => e.type === 'run.finished');
      return finished >= 0 && events.slice(finished + 1).some((e) => e.type === 'session.updated') ? events : null;
    }, 'the run to end and its session to take its outcome');
    return { body, scope, log };
  };
  /** An event of the log appended again, as the retry of its append would (with a new id). */
  const appendAgain = (scope: string, e: ServiceEvent) =>
    h.rt.events.append(scope, { tenant_id: e.tenant_id, session_id: e.session_id, run_id: e.run_id, type: e.type, data: e.data } as never);

  it('keeps the stream of a run that ended in the store open until its run.finished is in the log, then sends it', async () => {
    const { body, scope, log } = await endedRun('x');
    // as when Redis refused the append (an outage): the run ended in the store, its run.finished not yet in the log
    const finished = log.find((e) => e.type === 'run.finished')!;
    await h.rt.redis.xdel(h.rt.events.key(scope), finished.id);
    const before = log[log.indexOf(finished) - 1]!.id;
    const reader = open(h, body.session_id, before);
    await new Promise((r) => setTimeout(r, 500));
    expect(reader.isEnded()).to.equal(false);
    expect(reader.es.readyState, 'the stream is open, not ended by a 204').to.equal(EventSource.OPEN);
    // the append's retry lands: the reader gets the end it had not seen
    await appendAgain(scope, finished);
    await eventually(() => reader.isEnded(), 'run.finished');
    expect(reader.received.map((e) => e.type)).to.deep.equal(['run.finished']);
  });

  it('refuses a Last-Event-ID after every event of the stream (400), which would hold it open past the run’s end', async () => {
    const { body } = await h.call('POST', '/api/v1/autonomy/run', { body: { steps: [{ tool: 'shell', args: { command: 'sleep 1' } }] } });
    const url = `${h.url}/api/v1/autonomy/streaming/${body.session_id}/events`;
    const res = await fetch(url, { headers: { authorization: `Bearer ${KEYS.a}`, 'last-event-id': '999999999999999-0' }, signal: AbortSignal.timeout(5000) });
    expect(res.status).to.equal(400);
    expect(((await res.json()) as { errors: { path: string }[] }).errors[0]!.path).to.equal('/header/last-event-id');
    // given as the query's last_event_id, the error names it there
    const queried = await fetch(`${url}?last_event_id=999999999999999-0`, {
      headers: { authorization: `Bearer ${KEYS.a}` },
      signal: AbortSignal.timeout(5000),
    });
    expect(queried.status).to.equal(400);
    expect(((await queried.json()) as { errors: { path: string }[] }).errors[0]!.path).to.equal('/query/last_event_id');
  });

  it('sends what comes after a Last-Event-ID the log lost (Redis back from an older save), and ends a stream whose run.finished will not come once its retries are over', async () => {
    const { body, scope, log } = await endedRun('x');
    // the reader had every event up to the step's end; Redis came back without the step's end and what followed
    const stepFinished = log.find((e) => e.type === 'step.finished')!;
    const lost = log.slice(log.indexOf(stepFinished));
    await h.rt.redis.xdel(h.rt.events.key(scope), ...lost.map((e) => e.id));
    const reader = open(h, body.session_id, stepFinished.id);
    await eventually(() => reader.es.readyState === EventSource.OPEN || null, 'the stream to open (it was a 400, and the reader gave up)');
    // what is appended from now on reaches it: its ids come after the reader's
    const finished = lost.find((e) => e.type === 'run.finished')!;
    await appendAgain(scope, finished);
    await eventually(() => reader.isEnded(), 'the run.finished appended after the loss');
    expect(reader.received.map((e) => e.type)).to.deep.equal(['run.finished']);

    // a run.finished nobody will append again: the store's end is past the append's retries (6 minutes), so the
    // stream opened just before they ran out ends at a heartbeat after, and a reconnect is answered 204
    const { body: other, scope: otherScope, log: otherLog } = await endedRun('y');
    const otherEnd = otherLog.findIndex((e) => e.type === 'run.finished');
    await h.rt.redis.xdel(h.rt.events.key(otherScope), ...otherLog.slice(otherEnd).map((e) => e.id));
    const almost = new Date(Date.now() - 6 * 60_000 + 1500).toISOString();
    expect(await h.rt.store.sessions.update('tenant-a', other.session_id, { updated_at: almost }, ['idle'])).to.not.equal(null);
    const stuck = await fetch(`${h.url}/api/v1/autonomy/streaming/${other.session_id}/events`, {
      headers: { authorization: `Bearer ${KEYS.a}` },
      signal: AbortSignal.timeout(15_000),
    });
    expect(stuck.status).to.equal(200);
    const t0 = Date.now();
    await stuck.text();
    expect(Date.now() - t0, 'ms the stream stayed open').to.be.below(6000);
    const again = await fetch(`${h.url}/api/v1/autonomy/streaming/${other.session_id}/events`, { headers: { authorization: `Bearer ${KEYS.a}` } });
    expect(again.status).to.equal(204);
  });

  it('ends the stream a run is answered as (stream: true), replayed with its key, once its run.finished will not come', async () => {
    const body = { steps: [{ tool: 'message', args: { text: 'answered as a stream' } }] };
    const headers = { 'idempotency-key': `stream-lost-${Date.now()}` };
    const first = await h.call<Record<string, string>>('POST', '/api/v1/autonomy/run', { body, headers });
    const scope = `session:${first.body.session_id}`;
    const log = await eventually(async () => {
      const events = await h.rt.events.after(scope, '0-0');
      const finished = events.findIndex((e) => e.type === 'run.finished');
      return finished >= 0 && events.slice(finished + 1).some((e) => e.type === 'session.updated') ? events : null;
    }, 'the run to end and its session to take its outcome');
    // Redis came back from a save older than the run's end; the end's appends were tried out long ago
    const end = log.findIndex((e) => e.type === 'run.finished');
    await h.rt.redis.xdel(h.rt.events.key(scope), ...log.slice(end).map((e) => e.id));
    const old = new Date(Date.now() - 7 * 60_000).toISOString();
    expect(await h.rt.store.sessions.update('tenant-a', first.body.session_id!, { updated_at: old }, ['idle'])).to.not.equal(null);
    const replayed = await fetch(`${h.url}/api/v1/autonomy/run`, {
      method: 'POST',
      headers: { authorization: `Bearer ${KEYS.a}`, 'content-type': 'application/json', ...headers },
      body: JSON.stringify({ ...body, stream: true }),
      signal: AbortSignal.timeout(15_000),
    });
    expect(replayed.status).to.equal(200);
    expect(replayed.headers.get('idempotent-replayed')).to.equal('true');
    const t0 = Date.now();
    const text = await replayed.text();
    expect(Date.now() - t0, 'ms the stream stayed open').to.be.below(6000);
    expect(text).to.contain('run.started').and.not.contain('run.finished');
  });

  it('never cuts short the slow replay of a run that ended long ago, its end in the log (the check for an end that will not come finds it)', async () => {
    const steps = Array.from({ length: 4 }, (_, i) => ({ tool: 'message', args: { text: `m${i}` } }));
    const { body } = await h.call('POST', '/api/v1/autonomy/run', { body: { steps } });
    const session = await eventually(async () => {
      const s = await h.rt.store.sessions.get('tenant-a', body.session_id);
      return s?.outcome ? s : null;
    }, 'the run to end');
    await eventually(async () => (await h.rt.events.after(`session:${body.session_id}`, '0-0')).some((e) => e.type === 'run.finished'), 'its end in the log');
    // ended longer ago than its end's retries (6 minutes); each page of its replay comes slower than a heartbeat
    const old = new Date(Date.now() - 7 * 60_000).toISOString();
    expect(await h.rt.store.sessions.update('tenant-a', body.session_id, { updated_at: old }, [session.status])).to.not.equal(null);
    const after = h.rt.hub.after;
    h.rt.hub.after = async (...args: Parameters<typeof after>) => {
      await new Promise((r) => setTimeout(r, 1200));
      return after.apply(h.rt.hub, args);
    };
    try {
      const res = await fetch(`${h.url}/api/v1/autonomy/streaming/${body.session_id}/events`, { headers: { authorization: `Bearer ${KEYS.a}` } });
      expect(res.status).to.equal(200);
      const types = [...(await res.text()).matchAll(/^event: (.+)$/gm)].map((m) => m[1]);
      expect(types.at(-1), types.join(' ')).to.equal('run.finished');
      expect(types.filter((t) => t === 'step.finished')).to.have.length(4);
    } finally {
      h.rt.hub.after = after;
    }
  });

  it('ends at a heartbeat the stream of a reader who had the run’s end before its session took its outcome, once its retries are over', async () => {
    const { body, log } = await endedRun('z');
    // the window: the run's end is in the log, its session's outcome not yet stored
    expect(await h.rt.store.sessions.update('tenant-a', body.session_id, { outcome: null }, ['idle'])).to.not.equal(null);
    const controller = new AbortController();
    const res = await fetch(`${h.url}/api/v1/autonomy/streaming/${body.session_id}/events`, {
      headers: { authorization: `Bearer ${KEYS.a}`, 'last-event-id': log.at(-1)!.id },
      signal: controller.signal,
    });
    expect(res.status).to.equal(200);
    // the outcome lands, longer ago than the end's retries: no end is ahead of this reader
    const old = new Date(Date.now() - 7 * 60_000).toISOString();
    expect(await h.rt.store.sessions.update('tenant-a', body.session_id, { outcome: 'succeeded', updated_at: old }, ['idle'])).to.not.equal(null);
    const timer = setTimeout(() => controller.abort(), 8000);
    const t0 = Date.now();
    await res.text().catch(() => undefined);
    clearTimeout(timer);
    expect(Date.now() - t0, 'ms the stream stayed open').to.be.below(5000);
  });

  it('sends heartbeats while a run is quiet', async () => {
    const { body } = await h.call('POST', '/api/v1/autonomy/run', { body: { steps: [{ tool: 'shell', args: { command: 'sleep 2.5' } }] } });
    const res = await fetch(`${h.url}/api/v1/autonomy/streaming/${body.session_id}/events`, { headers: { authorization: `Bearer ${KEYS.a}` } });
    expect(res.headers.get('content-type')).to.contain('text/event-stream');
    const text = await res.text();
    expect(text).to.contain(': heartbeat');
    expect(text).to.contain('event: run.finished');
  });

  it('holds about 1 MB for a reader that stops reading, live or replaying, and sends it every event in order once it reads', async () => {
    const onServer: net.Socket[] = [];
    const track = (s: net.Socket) => onServer.push(s);
    h.web.server.on('connection', track);
    /** A stream read by nobody until read() is called: its socket is paused, so the server's writes back up. */
    const unread = (sessionId: string) => {
      const s = net.connect(Number(new URL(h.url).port), '127.0.0.1');
      s.on('error', () => undefined);
      s.write(`GET /api/v1/autonomy/streaming/${sessionId}/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${KEYS.a}\r\nConnection: close\r\n\r\n`);
      s.pause();
      return () =>
        new Promise<string[]>((resolve) => {
          let text = '';
          s.setEncoding('utf8');
          s.on('data', (d: string) => {
            text += d;
            // the response's last chunk (the stream ends after run.finished; the connection is kept alive)
            if (!text.endsWith('\r\n0\r\n\r\n')) return;
            s.destroy();
            resolve([...text.matchAll(/(?:^|\n)id: (\d+-\d+)\n/g)].map((m) => m[1]!));
          });
          s.resume();
        });
    };
    try {
      // each big step streams its 1 MB of output, six times larger as JSON (\u0001): about 12 MB of frames in all
      const big = { tool: 'shell', args: { command: "head -c 1000000 /dev/zero | tr '\\0' '\\001'" } };
      const { body } = await h.call('POST', '/api/v1/autonomy/run', { body: { steps: [{ tool: 'shell', args: { command: 'sleep 0.5' } }, big, big] } });
      const live = unread(body.session_id);
      const scope = `session:${body.session_id}`;
      await eventually(async () => (await h.rt.events.after(scope, '0-0')).some((e) => e.type === 'run.finished'), 'the run to end', 20_000);
      const replaying = unread(body.session_id);
      await new Promise((r) => setTimeout(r, 1000));
      const held = onServer.map((s) => s.writableLength);
      expect(Math.max(...held), `bytes held for each reader: ${held.join(', ')}`).to.be.below(3 * 1024 * 1024);
      const log = (await h.rt.events.after(scope, '0-0', 5000)).map((e) => e.id);
      const upTo = log.indexOf((await h.rt.events.after(scope, '0-0', 5000)).find((e) => e.type === 'run.finished')!.id);
      const [liveIds, replayedIds] = await Promise.all([live(), replaying()]);
      expect(liveIds).to.deep.equal(log.slice(0, upTo + 1));
      expect(replayedIds).to.deep.equal(log.slice(0, upTo + 1));
    } finally {
      h.web.server.off('connection', track);
    }
  });

  it('answers POST with stream: true as the run’s own SSE stream until it ends', async () => {
    const res = await fetch(`${h.url}/api/v1/autonomy/run`, {
      method: 'POST',
      headers: { authorization: `Bearer ${KEYS.a}`, 'content-type': 'application/json' },
      body: JSON.stringify({ stream: true, steps: [{ tool: 'shell', args: { command: 'echo streamed' } }] }),
    });
    expect(res.status).to.equal(200);
    expect(res.headers.get('content-type')).to.contain('text/event-stream');
    expect(res.headers.get('location')).to.match(/^\/api\/v1\/runs\/run_/);
    const text = await res.text();
    const types = [...text.matchAll(/^event: (.+)$/gm)].map((m) => m[1]);
    expect(types[0]).to.equal('run.queued');
    expect(types).to.include('step.output');
    expect(types[types.length - 1]).to.equal('run.finished');
    expect(text).to.contain('streamed');
    expect(res.headers.get('idempotent-replayed')).to.equal(null);
  });

  it('says a streamed run is an Idempotency-Key’s earlier run, as the 202 does, and streams it from its start', async () => {
    const post = (stream: boolean) =>
      fetch(`${h.url}/api/v1/autonomy/run`, {
        method: 'POST',
        headers: { authorization: `Bearer ${KEYS.a}`, 'content-type': 'application/json', 'idempotency-key': 'stream-replayed-1' },
        body: JSON.stringify({ ...(stream ? { stream: true } : {}), steps: [{ tool: 'shell', args: { command: 'echo keyed' } }] }),
      });
    const first = await post(false);
    expect(first.status).to.equal(202);
    const { run_id } = (await first.json()) as { run_id: string };
    const again = await post(true);
    expect(again.status).to.equal(200);
    expect(again.headers.get('idempotent-replayed')).to.equal('true');
    expect(again.headers.get('location')).to.equal(`/api/v1/runs/${run_id}`);
    const text = await again.text();
    expect([...text.matchAll(/^event: (.+)$/gm)].map((m) => m[1])[0]).to.equal('run.queued');
  });
});
