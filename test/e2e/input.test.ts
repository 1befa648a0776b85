import http from 'node:http';
import net, { type AddressInfo } from 'node:net';
import { expect } from 'chai';
import sinon from 'sinon';
import { wav } from '../support/audio.js';
import { KEYS, startHarness, type Harness } from '../support/harness.js';
import { bodyOfAnswer, rawExchange } from '../support/raw-http.js';

/** What a server answers to bytes sent as they are, on a connection of their own, until it closes it. */
const rawAnswer = async (url: string, bytes: string) => (await rawExchange(url, [[0, bytes]])).text;

describe('bad input', () => {
  let h: Harness;
  before(async () => {
    h = await startHarness();
  });
  after(async () => {
    await h.close();
  });

  async function expectProblem(res: { status: number; headers: Headers; body: any }, status: number, code: string) {
    expect(res.status).to.equal(status);
    expect(res.headers.get('content-type')).to.contain('application/problem+json');
    expect(res.body).to.include({ status, code });
    expect(res.body.request_id).to.be.a('string').and.equal(res.headers.get('x-request-id'));
    expect(res.body.title).to.be.a('string');
    expect(res.body.type).to.equal(`/problems/${code}`);
  }

  it('names the missing field of the trigger variant its type picks, in one error', async () => {
    const res = await h.call('POST', '/api/v1/automations', {
      body: { name: 'x', triggers: [{ type: 'cron', schedule: '0 3 * * *' }], steps: [{ tool: 'shell', args: { command: 'true' } }] },
    });
    await expectProblem(res, 400, 'bad-request');
    expect(res.body.errors).to.deep.equal([{ path: '/body/triggers/0/timezone', message: "must have required property 'timezone'" }]);
  });

  it('answers a 400 for a numeric query parameter that is not a finite number in range', async () => {
    // one code whichever check finds it (the finite-number check before the validator, or the validator)
    for (const q of ['1e309', 'Infinity', '-Infinity', 'NaN', 'abc', '-1', '0', '101', '1.5', '99999999999999999999']) {
      const res = await h.call('GET', `/api/v1/automations?limit=${q}`);
      expect(res.status, q).to.equal(400);
      expect(res.body.code, q).to.equal('bad-request');
      expect(res.body.errors[0].path, q).to.equal('/query/limit');
    }
    expect((await h.call('GET', '/api/v1/runs?limit=1e309')).status).to.equal(400);
    expect((await h.call('GET', '/api/v1/webhook-deliveries?limit=Infinity')).status).to.equal(400);
    // with a trailing slash, which Express and the validator take as the same route
    for (const path of ['/api/v1/runs/', '/api/v1/automations/', '/api/v1/sessions/', '/api/v1/webhook-deliveries/'])
      await expectProblem(await h.call('GET', `${path}?limit=1e309`), 400, 'bad-request');
    // only decimal numbers: not hex, not padded
    for (const q of ['0x10', '%20%201', '1_0']) expect((await h.call('GET', `/api/v1/automations?limit=${q}`)).status, q).to.equal(400);
    // HEAD is checked as the GET it stands for (it had a 500 for 1e309 and a 200 for 0x10)
    for (const q of ['1e309', '0x10']) expect((await h.call('HEAD', `/api/v1/runs?limit=${q}`)).status, `HEAD ${q}`).to.equal(400);
  });

  it('answers a 400 for a query parameter in bracket notation, a list one included (it was a 500)', async () => {
    for (const [method, url] of [
      ['GET', '/api/v1/automations?status[a]=1'],
      ['HEAD', '/api/v1/automations?status[a][b]=1'],
      ['GET', '/api/v1/autonomy/workspace-audit/stream?phases[x]=security'],
      ['GET', '/api/v1/runs?limit[a]=1'],
    ] as const) {
      const res = await h.call(method, url);
      expect(res.status, url).to.equal(400);
      if (method === 'GET') {
        await expectProblem(res, 400, 'bad-request');
        expect(res.body.errors[0].path, url).to.match(/^\/query\/(status|phases|limit)\[/);
      }
    }
    // a list as the spec writes it still goes
    expect((await h.call('GET', '/api/v1/automations?status=enabled,disabled')).status).to.equal(200);
  });

  it('answers a 400 for a header of the spec given twice (Node joined two Idempotency-Keys into one neither request named), and makes nothing', async () => {
    // headers as sent, each line as it is (fetch joins a repeated one); tenant b's: the file's other tests count tenant a's runs
    const send = async (path: string, method: string, headers: [string, string][], body = '') => {
      const lines = [`${method} ${path} HTTP/1.1`, 'Host: x', `Authorization: Bearer ${KEYS.b}`, ...headers.map(([k, v]) => `${k}: ${v}`)];
      const answer = await rawAnswer(h.url, `${lines.join('\r\n')}\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`);
      return { status: Number(answer.slice(9, 12)), body: bodyOfAnswer(answer) };
    };
    const runs = async () => (await h.call('GET', '/api/v1/runs', { key: KEYS.b })).body.data.length as number;
    const before = await runs();
    const body = JSON.stringify({ steps: [{ tool: 'message', args: { text: 'x' } }] });
    const twice = await send(
      '/api/v1/autonomy/run',
      'POST',
      [
        ['content-type', 'application/json'],
        ['idempotency-key', 'k-1'],
        ['idempotency-key', 'k-2'],
      ],
      body,
    );
    expect(twice.status, JSON.stringify(twice.body)).to.equal(400);
    expect(twice.body).to.include({ code: 'bad-request' });
    expect(twice.body.errors).to.deep.equal([{ path: '/header/idempotency-key', message: 'is given more than once (it holds one value)' }]);
    // the same value twice is still two values
    expect(
      (
        await send(
          '/api/v1/autonomy/run',
          'POST',
          [
            ['content-type', 'application/json'],
            ['Idempotency-Key', 'k-1'],
            ['Idempotency-Key', 'k-1'],
          ],
          body,
        )
      ).status,
    ).to.equal(400);
    const stream = await send('/api/v1/sessions/ses_x/trace', 'GET', [
      ['last-event-id', '1-0'],
      ['last-event-id', '2-0'],
    ]);
    expect(stream.status).to.equal(400);
    expect(stream.body.errors[0].path).to.equal('/header/last-event-id');
    expect(await runs()).to.equal(before);
    // one of each still goes
    expect(
      (
        await send(
          '/api/v1/autonomy/run',
          'POST',
          [
            ['content-type', 'application/json'],
            ['idempotency-key', 'k-1'],
          ],
          body,
        )
      ).status,
    ).to.equal(202);
  });

  it('refuses a string with a lone surrogate (not well-formed Unicode: strict readers refuse a page with it), and takes a pair', async () => {
    const post = (name: string) =>
      h.call('POST', '/api/v1/automations', {
        raw: `{"name":"${name}","steps":[{"tool":"message","args":{"text":"x"}}]}`,
        headers: { 'content-type': 'application/json' },
      });
    for (const name of ['\\ud800', 'a\\ud83d', '\\udc00b', '\\ud83d\\ud83d\\ude00x\\ud83d']) {
      const res = await post(name);
      expect(res.status, name).to.equal(400);
      expect(res.body.errors).to.deep.equal([{ path: '/body', message: 'strings must be well-formed Unicode' }]);
    }
    const before = (await h.call<{ data: unknown[] }>('GET', '/api/v1/automations?limit=100')).body.data.length;
    // a pair (an emoji), and an escaped backslash before a u (no escape at all) are fine
    for (const [name, stored] of [
      ['smile \\ud83d\\ude00', 'smile \u{1f600}'],
      ['\\\\ud800', '\\ud800'],
    ]) {
      const res = await post(name!);
      expect(res.status, name).to.equal(201);
      expect(res.body.name).to.equal(stored);
      await h.call('DELETE', `/api/v1/automations/${res.body.id}`);
    }
    expect((await h.call<{ data: unknown[] }>('GET', '/api/v1/automations?limit=100')).body.data.length).to.equal(before);
  });

  it('refuses a number too large for a double (parsed, it was Infinity: stored as null, and a 500 with an idempotency key), and stores nothing', async () => {
    const runsBefore = (await h.call<{ data: unknown[] }>('GET', '/api/v1/runs?limit=100')).body.data.length;
    const automationsBefore = (await h.call<{ data: unknown[] }>('GET', '/api/v1/automations?limit=100')).body.data.length;
    for (const n of ['1e309', '-1E400', '9'.repeat(309)])
      for (const key of [null, `inf-${n.slice(0, 6)}`]) {
        const headers = { 'content-type': 'application/json', ...(key ? { 'idempotency-key': key } : {}) };
        const run = await h.call('POST', '/api/v1/autonomy/run', { raw: `{"steps":[{"tool":"message","args":{"text":"x","n":${n}}}]}`, headers });
        expect(run.status, `${n} ${key}`).to.equal(400);
        expect(run.body.errors).to.deep.equal([{ path: '/body', message: 'numbers must be finite doubles' }]);
        const automation = await h.call('POST', '/api/v1/automations', {
          raw: `{"name":"n","steps":[{"tool":"message","args":{"text":"x","n":${n}}}]}`,
          headers,
        });
        expect(automation.status, `${n} ${key}`).to.equal(400);
      }
    expect((await h.call<{ data: unknown[] }>('GET', '/api/v1/runs?limit=100')).body.data.length).to.equal(runsBefore);
    expect((await h.call<{ data: unknown[] }>('GET', '/api/v1/automations?limit=100')).body.data.length).to.equal(automationsBefore);
    // a malformed number is malformed JSON, not a number too large
    const malformed = await h.call('POST', '/api/v1/automations', { raw: '{"name":"n","steps":[],"x":1e}', headers: { 'content-type': 'application/json' } });
    expect(malformed.status).to.equal(400);
    expect(malformed.body.code).to.equal('malformed-json');
    // the largest double, a tiny one (0 when parsed, as it should be) and a string that spells a huge number are fine
    const fine = await h.call('POST', '/api/v1/automations', {
      raw: '{"name":"n","steps":[{"tool":"message","args":{"text":"1e309","n":1.7976931348623157e308,"m":1e-400}}]}',
      headers: { 'content-type': 'application/json', 'idempotency-key': 'finite-1' },
    });
    expect(fine.status, fine.text).to.equal(201);
    expect(fine.body.steps[0].args).to.deep.equal({ text: '1e309', n: 1.7976931348623157e308, m: 0 });
    await h.call('DELETE', `/api/v1/automations/${fine.body.id}`);
  });

  it('refuses a body that is not UTF-8 (its bytes were stored as U+FFFD: a shell command that was not the one sent), and stores nothing', async () => {
    const before = (await h.call<{ data: unknown[] }>('GET', '/api/v1/automations?limit=100')).body.data.length;
    for (const bad of [[0xff], [0xc3, 0x28], [0xed, 0xa0, 0x80], [0xf4, 0x90, 0x80, 0x80]]) {
      const raw = Buffer.concat([Buffer.from('{"name":"n","steps":[{"tool":"shell","args":{"command":"printf '), Buffer.from(bad), Buffer.from('"}}]}')]);
      const res = await h.call('POST', '/api/v1/automations', { raw, headers: { 'content-type': 'application/json' } });
      expect(res.status, JSON.stringify(bad)).to.equal(400);
      expect(res.body.errors).to.deep.equal([{ path: '/body', message: 'must be UTF-8' }]);
    }
    expect((await h.call<{ data: unknown[] }>('GET', '/api/v1/automations?limit=100')).body.data.length).to.equal(before);
  });

  it('refuses a body nested deeper than 64 levels before parsing it, and stores nothing', async () => {
    const nested = (depth: number) => '{"a":'.repeat(depth) + '1' + '}'.repeat(depth);
    for (const depth of [65, 1000, 5000]) {
      const run = await h.call('POST', '/api/v1/autonomy/run', {
        raw: `{"inputs":${nested(depth)},"steps":[{"tool":"message","args":{"text":"x"}}]}`,
        headers: { 'content-type': 'application/json' },
      });
      await expectProblem(run, 400, 'validation-failed');
      expect(run.body.errors).to.deep.equal([{ path: '/body', message: 'must not nest objects and arrays deeper than 64 levels' }]);
      const session = await h.call('POST', '/api/v1/sessions', {
        raw: `{"title":"d","metadata":${nested(depth)}}`,
        headers: { 'content-type': 'application/json' },
      });
      await expectProblem(session, 400, 'validation-failed');
    }
    // brackets inside strings are text, not nesting
    const flat = await h.call('POST', '/api/v1/sessions', { body: { title: '['.repeat(100), metadata: { a: { b: '{'.repeat(500) } } } });
    expect(flat.status).to.equal(201);
    const deepest = await h.call('POST', '/api/v1/sessions', {
      raw: `{"title":"d","metadata":${nested(63)}}`,
      headers: { 'content-type': 'application/json' },
    });
    expect(deepest.status).to.equal(201);
    const sessions = await h.call<{ data: { kind: string }[] }>('GET', '/api/v1/sessions?kind=autonomy');
    expect(sessions.body.data).to.deep.equal([]);
    expect((await h.call<{ data: unknown[] }>('GET', '/api/v1/runs')).body.data).to.deep.equal([]);
  });

  it('refuses a body of more than 50,000 values or a list of more than 1,000 items before checking it, and stays responsive', async () => {
    const json = { 'content-type': 'application/json' };
    // 100 KB of list items that each fail the step schema: the validator listed every error, which takes it time
    // that grows with the square of their number (9 s for these, a 4.4 MB answer, the event loop held throughout)
    const items = `{"name":"x","steps":[${Array(50_000).fill('1').join(',')}]}`;
    const started = performance.now();
    const [refused, health] = await Promise.all([
      h.call('POST', '/api/v1/automations', { raw: items, headers: json }),
      new Promise((r) => setTimeout(r, 5)).then(async () => {
        const sent = performance.now();
        const res = await h.call('GET', '/healthz', { key: null });
        return { status: res.status, ms: performance.now() - sent };
      }),
    ]);
    expect(performance.now() - started).to.be.below(1000);
    expect(health.status).to.equal(200);
    expect(health.ms, 'a health check sent meanwhile').to.be.below(500);
    await expectProblem(refused, 400, 'validation-failed');
    // one pass over the bytes: the list's 1,001st item is met before the body's 50,001st value
    expect(refused.body.errors).to.deep.equal([{ path: '/body', message: 'must not hold a list of more than 1000 items' }]);
    expect(refused.text.length).to.be.below(2000);
    // as many values in short lists, and one list over the longest the spec has (a DAG's 1,000 tasks)
    const lists = Array.from({ length: 60 }, (_, i) => `"k${i}":[${Array(300).fill('[1,2]').join(',')}]`);
    const values = `{"title":"v","metadata":{${lists.join(',')}}}`;
    const many = await h.call('POST', '/api/v1/sessions', { raw: values, headers: json });
    await expectProblem(many, 400, 'validation-failed');
    expect(many.body.errors).to.deep.equal([{ path: '/body', message: 'must not hold more than 50000 JSON values' }]);
    const list = await h.call('POST', '/api/v1/sessions', { raw: `{"metadata":{"a":[${Array(1001).fill('1').join(',')}]}}`, headers: json });
    await expectProblem(list, 400, 'validation-failed');
    expect(list.body.errors).to.deep.equal([{ path: '/body', message: 'must not hold a list of more than 1000 items' }]);
    // commas and brackets inside strings are text
    const text = await h.call('POST', '/api/v1/sessions', {
      body: { title: ',['.repeat(50), metadata: { a: ',{'.repeat(30_000), b: `[${','.repeat(2000)}]` } },
    });
    expect(text.status, text.text).to.equal(201);
    expect((await h.call('GET', '/api/v1/automations')).body.data).to.deep.equal([]);
  });

  it('answers a body of many bad items quickly, listing its first 50 errors and counting the rest', async () => {
    // the largest body a client means: a DAG of 1,000 tasks, each with its title, dependencies and step, passes
    // both limits (answered by the route: this session is not there)
    const dag = Array.from({ length: 1000 }, (_, i) => ({
      id: `task-${i}`,
      title: `Build part ${i}`,
      depends_on: i > 2 ? [`task-${i - 1}`, `task-${i - 2}`, `task-${i - 3}`] : [],
      steps: [{ name: 'make', tool: 'shell', args: { command: `make part-${i}`, cwd: 'parts' } }],
      trigger_rule: 'all_success',
      max_attempts: 2,
    }));
    let started = performance.now();
    const missing = await h.call('POST', '/api/v1/sessions/ses_00000000000000000000000000/tasks', { body: { tasks: dag } });
    const good = performance.now() - started;
    await expectProblem(missing, 404, 'not-found');
    // under both limits: 1,000 tasks with 40 bad dependencies each, 40,000 errors
    const tasks = `{"tasks":[${Array(1000)
      .fill(`{"goal":"g","depends_on":[${Array(40).fill('1').join(',')}]}`)
      .join(',')}]}`;
    started = performance.now();
    const res = await h.call('POST', '/api/v1/sessions/ses_00000000000000000000000000/tasks', { raw: tasks, headers: { 'content-type': 'application/json' } });
    // Ajv copying its error list for each error held the event loop 9 s. Against the good body's time, measured
    // under the same load: about 9 times as long (1.05 s against 0.12 on a slow 2-core machine, alone; 2.1 s in a
    // full suite on another, whose good body took less than 0.09 s)
    expect(performance.now() - started).to.be.below(Math.max(3000, 25 * good));
    await expectProblem(res, 400, 'bad-request');
    expect(res.body.errors).to.have.length(50);
    expect(res.body.errors[0]).to.deep.equal({ path: '/body/tasks/0/depends_on/0', message: 'must be string' });
    expect(res.body.errors_omitted).to.equal(39_950);
    expect(res.body.detail).to.match(/; and 39950 more$/);
  });

  it('refuses a JSON body in any charset but UTF-8 with a 415, before reading it (RFC 8259 §8.1)', async () => {
    const utf16 = (text: string) => Buffer.from(text, 'utf16le');
    const deep = (depth: number) => '{"a":'.repeat(depth) + '1' + '}'.repeat(depth);
    // decoded after the checks, these passed them: a lone surrogate stored, a 5,000-deep value a 500 or a 503
    const bodies: [string, string][] = [
      ['/api/v1/automations', '{"name":"lone \\ud800","steps":[{"tool":"message","args":{"text":"x"}}]}'],
      ['/api/v1/sessions', `{"title":"d","metadata":${deep(5000)}}`],
      ['/api/v1/autonomy/run', `{"inputs":${deep(5000)},"steps":[{"tool":"message","args":{"text":"x"}}]}`],
    ];
    const sessions = async () => (await h.call<{ data: unknown[] }>('GET', '/api/v1/sessions?limit=100')).body.data.length;
    const sessionsBefore = await sessions();
    for (const [path, text] of bodies)
      for (const charset of ['utf-16le', 'UTF-16', 'utf-16be', 'utf-7', 'utf8', 'latin1']) {
        const res = await h.call('POST', path, {
          raw: charset.startsWith('utf-16') ? utf16(text) : text,
          headers: { 'content-type': `application/json; charset=${charset}` },
        });
        await expectProblem(res, 415, 'unsupported-media-type');
        expect(res.body.detail, `${path} ${charset}`).to.contain('UTF-8');
      }
    expect((await h.call('GET', '/api/v1/automations')).body.data).to.deep.equal([]);
    expect(await sessions()).to.equal(sessionsBefore);
    expect((await h.call<{ data: unknown[] }>('GET', '/api/v1/runs')).body.data).to.deep.equal([]);
    // UTF-8, however it is written, and a merge patch's JSON type too
    for (const type of ['application/json; charset=utf-8', 'application/json;charset="UTF-8"', 'application/json ; Charset=Utf-8']) {
      const res = await h.call('POST', '/api/v1/sessions', { raw: '{"title":"ü"}', headers: { 'content-type': type } });
      expect(res.status, `${type}: ${res.text}`).to.equal(201);
      expect(res.body.title).to.equal('ü');
    }
    const auto = await h.call('POST', '/api/v1/automations', { body: { name: 'a', steps: [{ tool: 'message', args: { text: 'x' } }] } });
    const patch = await h.call('PATCH', `/api/v1/automations/${auto.body.id}`, {
      raw: utf16('{"name":"b"}'),
      headers: { 'content-type': 'application/merge-patch+json; charset=utf-16le' },
    });
    await expectProblem(patch, 415, 'unsupported-media-type');
    expect((await h.call('GET', `/api/v1/automations/${auto.body.id}`)).body.name).to.equal('a');
    await h.call('DELETE', `/api/v1/automations/${auto.body.id}`);
  });

  it('refuses a body sent without a Content-Type with a 415, where it was dropped, and takes no body at all', async () => {
    const keys = async () => (await h.call<{ data: unknown[] }>('GET', '/api/v1/api-keys')).body.data.length;
    const sessions = async () => (await h.call<{ data: unknown[] }>('GET', '/api/v1/sessions?limit=100')).body.data.length;
    const before = { keys: await keys(), sessions: await sessions() };
    // a Buffer: fetch names no type for it (a string it would send as text/plain)
    for (const [path, text] of [
      ['/api/v1/api-keys', '{"label":"x","expires_at":"2027-06-30T00:00:00Z"}'],
      ['/api/v1/sessions', 'not json {{{'],
      ['/api/v1/autonomy/workspace-audit/run', '{"workspace":"nope"}'],
    ]) {
      const res = await h.call('POST', path!, { raw: Buffer.from(text!) });
      await expectProblem(res, 415, 'unsupported-media-type');
      expect(res.body.detail).to.contain('Content-Type');
    }
    // sent in chunks, its length unknown: a body all the same
    const chunked = await rawAnswer(
      h.url,
      `POST /api/v1/api-keys HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${KEYS.a}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n2\r\n{}\r\n0\r\n\r\n`,
    );
    expect(chunked).to.match(/^HTTP\/1\.1 415 /);
    expect({ keys: await keys(), sessions: await sessions() }).to.deep.equal(before);
    // chunks that end with none: no body, as a client that streams every request sends an empty one
    const empty = await rawAnswer(
      h.url,
      `POST /api/v1/sessions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${KEYS.a}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n0\r\n\r\n`,
    );
    expect(empty).to.match(/^HTTP\/1\.1 201 /);
    expect(await sessions()).to.equal(before.sessions + 1);
  });

  it('refuses a body whose Content-Type is no media type, or not JSON, with a 415 where the body is optional (it was taken as no body)', async () => {
    const keys = async () => (await h.call<{ data: unknown[] }>('GET', '/api/v1/api-keys')).body.data.length;
    const sessions = async () => (await h.call<{ data: unknown[] }>('GET', '/api/v1/sessions?limit=100')).body.data.length;
    const before = { keys: await keys(), sessions: await sessions() };
    for (const type of [';;;', ';', ' ; charset=utf-8', 'application', 'application/', '/json', 'text/plain'])
      for (const [path, text] of [
        ['/api/v1/api-keys', '{"label":"ci","expires_at":"2027-01-01T00:00:00Z"}'],
        ['/api/v1/sessions', '{"kind":"nope"}'],
      ]) {
        const res = await h.call('POST', path!, { raw: text!, headers: { 'content-type': type } });
        await expectProblem(res, 415, 'unsupported-media-type');
      }
    expect({ keys: await keys(), sessions: await sessions() }).to.deep.equal(before);
    // a type with odd spacing and case is still JSON
    const spaced = await h.call('POST', '/api/v1/api-keys', { raw: '{"label":"spaced"}', headers: { 'content-type': 'Application/JSON ; charset=UTF-8' } });
    expect(spaced.status, spaced.text).to.equal(201);
    const made = (spaced.body as { api_key: { id: string; label: string } }).api_key;
    expect(made.label).to.equal('spaced');
    await h.call('DELETE', `/api/v1/api-keys/${made.id}`);
  });

  it('makes a session or an API key from no body at all, as the spec allows', async () => {
    for (const path of ['/api/v1/sessions', '/api/v1/api-keys']) {
      const none = await h.call('POST', path);
      expect(none.status, `${path}: ${none.text}`).to.equal(201);
      const empty = await h.call('POST', path, { raw: '', headers: { 'content-type': 'application/json', 'content-length': '0' } });
      expect(empty.status, `${path}: ${empty.text}`).to.equal(201);
    }
  });

  it('answers HEAD wherever GET is: the same status and headers, no body, a stream not held open', async () => {
    const session = (await h.call<{ id: string }>('POST', '/api/v1/sessions')).body;
    for (const path of ['/api/v1/automations?limit=5', `/api/v1/sessions/${session.id}`, `/api/v1/sessions/${session.id}/trace`]) {
      const get = await fetch(`${h.url}${path}`, { headers: { authorization: `Bearer ${KEYS.a}` }, signal: AbortSignal.timeout(2000) }).catch(() => null);
      const head = await fetch(`${h.url}${path}`, { method: 'HEAD', headers: { authorization: `Bearer ${KEYS.a}` }, signal: AbortSignal.timeout(5000) });
      expect(head.status, path).to.equal(200);
      expect(await head.text(), path).to.equal('');
      if (get) expect(head.headers.get('content-type'), path).to.equal(get.headers.get('content-type'));
    }
    // checked as the GET it stands for
    const bad = await fetch(`${h.url}/api/v1/automations?limit=0`, { method: 'HEAD', headers: { authorization: `Bearer ${KEYS.a}` } });
    expect(bad.status).to.equal(400);
  });

  it('answers headers over 16 KB with a 431 problem, and closes the connection', async () => {
    const answer = await rawAnswer(h.url, `GET /api/v1/automations HTTP/1.1\r\nHost: x\r\nX-Big: ${'a'.repeat(20_000)}\r\n\r\n`);
    expect(answer).to.match(/^HTTP\/1\.1 431 /);
    expect(answer).to.contain('Content-Type: application/problem+json');
    const body = bodyOfAnswer(answer);
    expect(body).to.include({ status: 431, code: 'headers-too-large', type: '/problems/headers-too-large' });
    expect(body.request_id).to.match(/^[0-9a-f-]{36}$/);
    expect(answer).to.contain(`\r\nX-Request-Id: ${body.request_id}\r\n`);
  });

  it('answers what Node refuses before a request exists as problems with a request id, and a request without Host with a 400', async () => {
    const send = (text: string) => rawAnswer(h.url, text);
    // two lengths: no one can tell where the body ends (request smuggling)
    const twice = await send(`POST /api/v1/sessions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}`);
    expect(twice).to.match(/^HTTP\/1\.1 400 /);
    const problem = bodyOfAnswer(twice);
    expect(problem).to.include({ status: 400, code: 'bad-request', type: '/problems/bad-request' });
    expect(problem.request_id).to.match(/^[0-9a-f-]{36}$/);
    expect(twice).to.contain(`\r\nX-Request-Id: ${problem.request_id}\r\n`);
    // HTTP/1.1 requires Host (RFC 9112 §3.2): a problem like any other, with its request id
    const hostless = await send(`GET /api/v1/me HTTP/1.1\r\nAuthorization: Bearer ${KEYS.a}\r\nConnection: close\r\n\r\n`);
    expect(hostless).to.match(/^HTTP\/1\.1 400 /);
    expect(hostless).to.match(/\r\nContent-Type: application\/problem\+json/i);
    const noHost = bodyOfAnswer(hostless);
    expect(noHost).to.include({ status: 400, code: 'bad-request' });
    expect(noHost.detail).to.contain('Host');
    expect(hostless).to.match(new RegExp(`\r\nX-Request-Id: ${noHost.request_id}\r\n`, 'i'));
    // HTTP/1.0 had no Host
    const old = await send(`GET /healthz HTTP/1.0\r\n\r\n`);
    expect(old).to.match(/^HTTP\/1\.1 200 /);
    // an Expect the service cannot meet: a problem with its request id too (Node's own 417 was bare); 100-continue is met
    const expecting = (value: string) =>
      send(
        `POST /api/v1/sessions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${KEYS.a}\r\nContent-Type: application/json\r\nExpect: ${value}\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}`,
      );
    const unmet = await expecting('foo');
    expect(unmet).to.match(/^HTTP\/1\.1 417 /);
    const failed = bodyOfAnswer(unmet);
    expect(failed).to.include({ status: 417, code: 'expectation-failed' });
    expect(unmet).to.match(new RegExp(`\r\nX-Request-Id: ${failed.request_id}\r\n`, 'i'));
    expect(await expecting('100-continue')).to.match(/^HTTP\/1\.1 100 Continue\r\n\r\nHTTP\/1\.1 201 /);
  });

  it('answers a request whose target is in absolute form as the same request in origin form, checked the same', async () => {
    const send = async (head: string, body = ''): Promise<{ status: number; body: any }> => {
      const got = await rawAnswer(
        h.url,
        `${head}Host: elsewhere\r\nAuthorization: Bearer ${KEYS.a}\r\nConnection: close\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`,
      );
      return { status: Number(got.slice(9, 12)), body: bodyOfAnswer(got) };
    };
    const me = await send(`GET http://x/api/v1/me HTTP/1.1\r\n`);
    expect(me.status).to.equal(200);
    expect(me.body).to.include({ tenant_id: 'tenant-a' });
    // validated as any request is: a bad body, a bad query, a path in another case
    const bad = await send(`POST http://x:8080/api/v1/automations HTTP/1.1\r\nContent-Type: application/json\r\n`, '{"name":42,"colour":"red"}');
    expect(bad.status).to.equal(400);
    expect(bad.body.instance).to.equal('/api/v1/automations');
    expect((await send(`GET http://x/api/v1/automations?limit=0 HTTP/1.1\r\n`)).status).to.equal(400);
    expect((await send(`GET https://x/API/v1/automations?limit=100000 HTTP/1.1\r\n`)).status).to.equal(404);
    expect((await send(`GET http://x?limit=1 HTTP/1.1\r\n`)).status).to.equal(404);
    expect((await h.call('GET', '/api/v1/automations')).body.data).to.deep.equal([]);
  });

  it('takes reserved characters in query values as they are written (a path, a time)', async () => {
    const since = await h.call('GET', '/api/v1/autonomy/evidence-pack?since=2026-01-01T00:00:00Z');
    expect(since.status, since.text).to.equal(404); // nothing sealed yet: read, not refused
    const nested = await h.call('GET', '/api/v1/autonomy/smart-gates?workspace=apps/web');
    expect(nested.body.code, nested.text).to.equal('validation-failed'); // the service's own answer: no such folder
    // a leap second is a date-time by RFC 3339's grammar, but no instant this service can compare: said so
    // (it was a 404, as if nothing had been sealed since), as an API key's expiry says it
    const leap = await h.call('GET', '/api/v1/autonomy/evidence-pack?since=2026-06-30T23:59:60Z');
    await expectProblem(leap, 400, 'validation-failed');
    expect(leap.body.errors).to.deep.equal([{ path: '/query/since', message: 'an RFC 3339 date and time' }]);
    const key = await h.call('POST', '/api/v1/api-keys', { body: { expires_at: '2026-06-30T23:59:60Z' } });
    await expectProblem(key, 400, 'validation-failed');
  });

  it('answers a workspace that is not one of the tenant’s folders the same way, whatever is there, and never with a server path', async () => {
    const fsp = await import('node:fs/promises');
    const pathm = await import('node:path');
    await fsp.mkdir(pathm.join(h.tenantDir('tenant-b'), 'app'), { recursive: true });
    await fsp.writeFile(pathm.join(h.tenantDir('tenant-b'), 'app', 'secret.txt'), 'b\n');
    const details = new Set<string>();
    for (const ws of ['../tenant-b/app/secret.txt/x', '../tenant-b/app/nothing/x', '../tenant-b/app', 'missing']) {
      const res = await h.call('POST', '/api/v1/autonomy/run', { body: { workspace: ws, steps: [{ tool: 'message', args: { text: 'x' } }] } });
      await expectProblem(res, 400, 'validation-failed');
      expect(res.text).to.not.contain(h.workspace).and.not.contain('ENOTDIR').and.not.contain('ENOENT');
      details.add(JSON.stringify(res.body.errors));
    }
    expect(details.size).to.equal(1);
  });

  it('serves the API only at its own paths, letter for letter: no other case reaches a route unchecked', async () => {
    await expectProblem(await h.call('GET', '/API/v1/runs?limit=5'), 404, 'not-found');
    await expectProblem(await h.call('GET', '/Api/V1/runs?limit=100000'), 404, 'not-found');
    await expectProblem(await h.call('POST', '/API/v1/autonomy/run', { body: { steps: 'not-an-array' } }), 404, 'not-found');
    await expectProblem(await h.call('POST', '/api/v1/SESSIONS', { body: { title: { a: 1 }, metadata: 'x' } }), 404, 'not-found');
    const sessions = await h.call<{ data: { title: unknown }[] }>('GET', '/api/v1/sessions');
    expect(sessions.status).to.equal(200);
    expect(sessions.body.data.filter((s) => s.title !== null && typeof s.title !== 'string')).to.deep.equal([]);
  });

  it('malformed JSON is a 400 malformed-json', async () => {
    await expectProblem(
      await h.call('POST', '/api/v1/automations', { raw: '{"name": "x",', headers: { 'content-type': 'application/json' } }),
      400,
      'malformed-json',
    );
    expect(
      (await h.call<{ detail: string }>('POST', '/api/v1/automations', { raw: '{"name": "x",', headers: { 'content-type': 'application/json' } })).body.detail,
    ).to.equal('The body is not valid JSON.');
    // JSON, but not an object: said so
    for (const raw of ['null', '"x"', '1']) {
      const bare = await h.call<{ code: string; detail: string }>('POST', '/api/v1/automations', { raw, headers: { 'content-type': 'application/json' } });
      expect(bare.status, raw).to.equal(400);
      expect(bare.body, raw).to.include({ code: 'malformed-json', detail: 'The body must be a JSON object.' });
    }
  });

  it('a body that is not JSON is a 415', async () => {
    await expectProblem(
      await h.call('POST', '/api/v1/automations', { raw: 'name=x', headers: { 'content-type': 'application/x-www-form-urlencoded' } }),
      415,
      'unsupported-media-type',
    );
    await expectProblem(
      await h.call('POST', '/api/v1/automations', { raw: 'hello', headers: { 'content-type': 'text/plain' } }),
      415,
      'unsupported-media-type',
    );
  });

  it('a body over 1 MB is a 413', async () => {
    const big = JSON.stringify({ name: 'x', goal: 'g'.repeat(1024 * 1024 + 10) });
    await expectProblem(await h.call('POST', '/api/v1/automations', { raw: big, headers: { 'content-type': 'application/json' } }), 413, 'payload-too-large');
  });

  it('answers a body declared over its limit at once, without waiting for it, and closes the connection', async () => {
    /** the answer to a request whose head alone is sent: the body it announces never comes */
    const headOnly = async (head: string) => (await rawExchange(h.url, [[0, head]], 3000)).text;
    for (const [what, head] of [
      ['the API', `POST /api/v1/automations HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${KEYS.a}\r\nContent-Type: application/json\r\n`],
      ['the webhook intake', 'POST /webhooks/tenant-a/codehost HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n'],
    ]) {
      const answer = await headOnly(`${head}Content-Length: 52428800\r\n\r\n`);
      expect(answer, what).to.match(/^HTTP\/1\.1 413 /);
      expect(answer, what).to.match(/\r\nConnection: close\r\n/i);
      expect(JSON.parse(answer.slice(answer.indexOf('\r\n\r\n') + 4))).to.include({ code: 'payload-too-large' });
    }
  });

  it('ends an upload whose body stops coming with its 408: it gives back its place (8 stalled ones held a tenant’s every place)', async () => {
    // a transcription provider that reads what it is sent and answers once it has all of it
    const provider = http.createServer((req, res) => {
      req.resume();
      req.on('end', () => res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ text: 'hello', duration: 1, language: 'english' })));
    });
    await new Promise<void>((r) => provider.listen(0, '127.0.0.1', r));
    const voice = await startHarness({
      workers: false,
      env: {
        SERVICE_BODY_IDLE_SECONDS: '1',
        SERVICE_TRANSCRIBE_PROVIDER: 'openai',
        SERVICE_TRANSCRIBE_BASE_URL: `http://127.0.0.1:${(provider.address() as AddressInfo).port}/v1`,
        SERVICE_TRANSCRIBE_API_KEY: 'sk-test-stalled',
        SERVICE_TRANSCRIBE_MODEL: 'whisper-1',
      },
    });
    try {
      const audio = wav(5);
      /** an upload that sends part of its audio and then nothing: the server's answer */
      const stalled = () =>
        new Promise<string>((resolve, reject) => {
          const socket = net.connect(Number(new URL(voice.url).port), '127.0.0.1', () => {
            socket.write(
              `POST /api/v1/autonomy/voice/transcribe HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${KEYS.a}\r\nContent-Type: audio/wav\r\nContent-Length: ${audio.length}\r\n\r\n`,
            );
            socket.write(audio.subarray(0, 50_000));
          });
          let answer = '';
          socket.on('data', (d) => (answer += d));
          socket.on('close', () => resolve(answer));
          socket.on('error', reject);
          setTimeout(() => socket.destroy(), 8000);
        });
      const answers = await Promise.all(Array.from({ length: 8 }, stalled));
      for (const a of answers) expect(a).to.match(/^HTTP\/1\.1 408 /);
      const next = await voice.call('POST', '/api/v1/autonomy/voice/transcribe', { raw: wav(1), headers: { 'content-type': 'audio/wav' } });
      expect(next.status, next.text).to.equal(200);
    } finally {
      await voice.close();
      provider.closeAllConnections();
      provider.close();
    }
  });

  describe('a body that stops coming (SERVICE_BODY_IDLE_SECONDS=1)', () => {
    let slow: Harness;
    before(async () => {
      slow = await startHarness({ env: { SERVICE_BODY_IDLE_SECONDS: '1' }, workers: false });
      // the intake reads the body of a kind with a secret (one without is refused before its body)
      expect((await slow.call('PUT', '/api/v1/webhook-secrets/codehost', { body: { secrets: ['codehost-secret-0123456789'] } })).status).to.equal(200);
    });
    after(async () => {
      await slow.close();
    });

    const sent = (parts: [number, string][]) => rawExchange(slow.url, parts);
    const head = (path: string, headers: string) => `POST ${path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${KEYS.a}\r\n${headers}\r\n`;
    const automation = JSON.stringify({ name: 'slow', steps: [{ tool: 'message', args: { text: 'x' } }] });

    it('answers 408 and closes the connection when the body sends nothing for that long, and does nothing it asked', async () => {
      const cases: [string, string][] = [
        // part of a declared body, then nothing
        [
          'JSON, part sent',
          head('/api/v1/automations', `Content-Type: application/json\r\nContent-Length: ${automation.length}\r\n`) + automation.slice(0, 10),
        ],
        // chunks of no type, not one sent: held until the 300 s request timeout before
        ['chunks of no type, none sent', head('/api/v1/sessions', 'Transfer-Encoding: chunked\r\n')],
        // signed, as far as its headers say: one without a signature is refused before its body is read
        [
          'the webhook intake',
          `POST /webhooks/tenant-a/codehost HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-Hub-Signature-256: sha256=${'0'.repeat(64)}\r\nContent-Length: 40\r\n\r\n{"a":`,
        ],
      ];
      const answers = await Promise.all(cases.map(([, bytes]) => sent([[0, bytes]])));
      for (const [i, { text, ms }] of answers.entries()) {
        const what = cases[i]![0];
        expect(text, what).to.match(/^HTTP\/1\.1 408 /);
        expect(text, what).to.match(/\r\nConnection: close\r\n/i);
        expect(bodyOfAnswer(text), what).to.include({ code: 'request-timeout', status: 408 });
        expect(ms, what).to.be.within(900, 4000);
      }
      expect((await slow.call('GET', '/api/v1/automations')).body.data).to.deep.equal([]);
      expect((await slow.call('GET', '/api/v1/sessions')).body.data).to.deep.equal([]);
    });

    it('answers 408 to a pipelined request whose body stalls, and closes a kept-alive connection whose body the route never read', async () => {
      // the second request, written with the first, sends 10 bytes of its body and no more (an earlier request's
      // body ending reset the connection's timer: it was never answered)
      const whole = head('/api/v1/automations', `Content-Type: application/json\r\nContent-Length: ${automation.length}\r\n`) + automation;
      const cut = head('/api/v1/automations', `Content-Type: application/json\r\nContent-Length: ${automation.length}\r\n`) + automation.slice(0, 10);
      const piped = await rawExchange(slow.url, [[0, whole + cut]]);
      expect(piped.text).to.match(/^HTTP\/1\.1 201 /);
      expect(piped.text).to.match(/HTTP\/1\.1 408 Request Timeout/);
      expect(piped.ms).to.be.below(4000);
      // answered without its body read (no key: a 401), then idle: closed at the keep-alive timeout, not kept for good
      const keepAlive = slow.web.server.keepAliveTimeout;
      slow.web.server.keepAliveTimeout = 500;
      try {
        const unread = `POST /api/v1/automations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${automation.length}\r\n\r\n${automation}`;
        const answered = await rawExchange(slow.url, [[0, unread]], 5000);
        expect(answered.text).to.match(/^HTTP\/1\.1 401 /);
        expect(answered.ms, 'closed by the server, not by the client at 5 s').to.be.below(4000);
      } finally {
        slow.web.server.keepAliveTimeout = keepAlive;
      }
      for (const a of (await slow.call('GET', '/api/v1/automations')).body.data) await slow.call('DELETE', `/api/v1/automations/${a.id}`);
    });

    it('holds no process open with the check of a body answered before it was all in (a closed server’s process lingered 60 s)', async () => {
      // no key: a 401 before the body is read; the client then goes, its body never all sent
      const setInterval = sinon.spy(globalThis, 'setInterval');
      let answer;
      try {
        answer = await rawExchange(
          slow.url,
          [[0, `POST /api/v1/automations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{"name":`]],
          1500,
        );
      } finally {
        setInterval.restore();
      }
      expect(answer.text).to.match(/^HTTP\/1\.1 401 /);
      const checks = setInterval.getCalls().filter((c) => c.args[1] === 1000);
      expect(checks, 'the body check, one interval of the idle limit').to.have.length(1);
      expect(checks[0]!.returnValue.hasRef(), 'a check that holds the event loop').to.equal(false);
    });

    it('takes a whole body its route reads later than the idle limit (a slow key lookup): only a body that stops coming is refused', async () => {
      const keys = slow.rt.engine.apiKeys;
      const resolve = keys.resolve.bind(keys);
      keys.resolve = async (key) => {
        await new Promise((r) => setTimeout(r, 2500));
        return resolve(key);
      };
      let made: { status: number; text: string; body: { id: string } }[] = [];
      try {
        // small, and past what Node buffers before it stops reading the connection (the bytes read then stand
        // still); each on a connection of its own, at once
        const bodies = [{ description: 'small' }, { description: 'd'.repeat(1999) }, { inputs: { blob: 'x'.repeat(600_000) } }];
        made = await Promise.all(bodies.map((extra) => slow.call('POST', '/api/v1/automations', { body: { ...JSON.parse(automation), ...extra } })));
      } finally {
        keys.resolve = resolve;
      }
      for (const m of made) {
        expect(m.status, `not taken for a body that stopped coming: ${m.text.slice(0, 300)}`).to.equal(201);
        await slow.call('DELETE', `/api/v1/automations/${m.body.id}`);
      }
    });

    it('takes a body that keeps coming, however slowly, and keeps an idle connection alive between requests', async () => {
      const bytes = head('/api/v1/automations', `Content-Type: application/json\r\nContent-Length: ${automation.length}\r\n`) + automation;
      // a piece every 0.4 s for 2.4 s, the idle limit 1 s
      const pieces = Array.from({ length: 7 }, (_, i): [number, string] => [i ? 400 : 0, bytes.slice((i * bytes.length) / 7, ((i + 1) * bytes.length) / 7)]);
      // then, 1.5 s after, a second request on the same connection
      const { text } = await sent([
        ...pieces,
        [1500, `GET /api/v1/automations HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${KEYS.a}\r\nConnection: close\r\n\r\n`],
      ]);
      expect(text).to.match(/^HTTP\/1\.1 201 /);
      expect(text.match(/HTTP\/1\.1 200 /g), text).to.have.length(1);
      await slow.call('DELETE', `/api/v1/automations/${(await slow.call('GET', '/api/v1/automations')).body.data[0].id}`);
    });
  });

  it('unknown fields and wrong types are a 400 listing each one', async () => {
    const res = await h.call('POST', '/api/v1/automations', { body: { name: 42, goal: 'g', colour: 'red' } });
    await expectProblem(res, 400, 'bad-request');
    const paths = res.body.errors.map((e: { path: string }) => e.path);
    expect(paths).to.include('/body/colour').and.include('/body/name');
  });

  it('unknown query parameters, bad ids and unknown routes are refused as problems', async () => {
    await expectProblem(await h.call('GET', '/api/v1/automations?colour=red'), 400, 'bad-request');
    await expectProblem(await h.call('GET', '/api/v1/automations/not-an-id'), 400, 'bad-request');
    await expectProblem(await h.call('GET', '/api/v1/automations/aut_00000000000000000000000000'), 404, 'not-found');
    await expectProblem(await h.call('GET', '/api/v1/nothing-here'), 404, 'not-found');
    await expectProblem(await h.call('PUT', '/api/v1/automations'), 405, 'method-not-allowed');
    await expectProblem(await h.call('GET', '/nowhere', { key: null }), 404, 'not-found');
  });

  it('echoes a given X-Request-Id and makes one otherwise', async () => {
    const given = await h.call('GET', '/api/v1/automations', { headers: { 'x-request-id': 'ci-run-42.step-3' } });
    expect(given.headers.get('x-request-id')).to.equal('ci-run-42.step-3');
    const made = await h.call('GET', '/api/v1/automations', { headers: { 'x-request-id': 'bad id with spaces' } });
    expect(made.headers.get('x-request-id')).to.match(/^[0-9a-f-]{36}$/);
  });

  it('changes nothing and stays up after a burst of bad requests', async () => {
    const bad = [
      h.call('POST', '/api/v1/automations', { raw: '{', headers: { 'content-type': 'application/json' } }),
      h.call('POST', '/api/v1/automations', { raw: '[]', headers: { 'content-type': 'application/json' } }),
      h.call('POST', '/api/v1/automations', { raw: 'null', headers: { 'content-type': 'application/json' } }),
      h.call('POST', '/api/v1/automations', { raw: '"text"', headers: { 'content-type': 'application/json' } }),
      h.call('POST', '/api/v1/automations', { raw: '{"name":"x","goal":"y","__proto__":{"polluted":true}}', headers: { 'content-type': 'application/json' } }),
      h.call('POST', '/api/v1/automations', { raw: Buffer.from([0xff, 0xfe, 0x00]), headers: { 'content-type': 'application/json' } }),
      h.call('POST', '/api/v1/automations', { raw: '{}', headers: { 'content-type': 'application/json; charset=latin9' } }),
      h.call('PATCH', '/api/v1/automations/aut_00000000000000000000000000', { body: { triggers: 'every day' } }),
    ];
    const statuses = (await Promise.all(bad)).map((r) => r.status);
    for (const s of statuses) expect(s).to.be.within(400, 499);
    expect(({} as Record<string, unknown>).polluted).to.equal(undefined);
    expect((await h.call('GET', '/api/v1/automations')).body.data).to.have.length(0);
    expect((await h.call('GET', '/healthz', { key: null })).status).to.equal(200);
  });
});
