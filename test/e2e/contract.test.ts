// The OpenAPI document the service serves says what the service does: the routes SPEC.md names are in
// it, and the statuses and headers the running service answers are declared where it answers them.
import http from 'node:http';
import { expect } from 'chai';
import { WEBHOOK_MEDIA_TYPES } from '../../engine/webhooks/verify.js';
import { KEYS, startHarness, type Harness } from '../support/harness.js';

type Body = Record<string, any>;
type Spec = { paths: Record<string, Record<string, Body>>; components: Body };

const JSON_BODY_METHODS = ['post', 'put', 'patch'];

/** A value of a path parameter that passes its schema: the id patterns are `^<prefix>_[0-9a-z]{26}$`. */
function sampleOf(spec: Spec, param: Body): string {
  const resolved = param.$ref ? spec.components.parameters[param.$ref.split('/').pop()!] : param;
  let schema = resolved.schema as Body;
  if (schema.$ref) schema = spec.components.schemas[schema.$ref.split('/').pop()!];
  if (schema.enum) return String(schema.enum[0]);
  const prefix = /^\^([a-z]+_)\[0-9a-z\]\{26\}\$$/.exec(schema.pattern ?? '')?.[1];
  if (prefix) return `${prefix}${'0'.repeat(26)}`;
  return 'tenant-a';
}

describe('the served OpenAPI document against the running service', function () {
  this.timeout(30_000);
  let h: Harness;
  let spec: Spec;

  before(async () => {
    h = await startHarness();
    spec = (await h.call<Spec>('GET', '/openapi.json', { key: null })).body;
  });
  after(async () => {
    await h.close();
  });

  it('declares /docs and /redoc, the documentation pages SPEC names, as the HTML pages it serves', async () => {
    for (const page of ['/docs', '/redoc']) {
      const res = await h.call('GET', page, { key: null });
      expect(res.status, page).to.equal(200);
      expect(res.headers.get('content-type'), page).to.match(/^text\/html/);
      const op = spec.paths[page]?.get;
      expect(op, `${page} in /openapi.json`).to.be.an('object');
      expect(op!.security, page).to.deep.equal([]);
      expect(op!.responses['200'].content, page).to.have.property('text/html');
    }
  });

  it('declares the 413 and 415 that every JSON-body operation under /api/v1 answers', async () => {
    const big = JSON.stringify({ pad: 'x'.repeat(1024 * 1024 + 1) });
    let checked = 0;
    for (const [template, item] of Object.entries(spec.paths)) {
      if (!template.startsWith('/api/v1/')) continue;
      for (const method of JSON_BODY_METHODS) {
        const op = item[method];
        if (!op?.requestBody?.content?.['application/json']) continue;
        let path = template;
        for (const param of [...((item.parameters ?? []) as Body[]), ...((op.parameters ?? []) as Body[])]) {
          const name = (param.$ref ? spec.components.parameters[param.$ref.split('/').pop()!] : param).name as string;
          path = path.replace(`{${name}}`, sampleOf(spec, param));
        }
        const what = `${method.toUpperCase()} ${template}`;
        const plain = await h.call<Body>(method.toUpperCase(), path, { raw: 'hello', headers: { 'content-type': 'text/plain' } });
        expect(plain.status, `${what}: ${plain.text}`).to.equal(415);
        expect(plain.headers.get('content-type'), what).to.match(/^application\/problem\+json/);
        expect(op.responses, `${what} answers 415`).to.have.property('415');
        const tooLarge = await h.call<Body>(method.toUpperCase(), path, { raw: big, headers: { 'content-type': 'application/json' } });
        expect(tooLarge.status, `${what}: ${tooLarge.text}`).to.equal(413);
        expect(tooLarge.headers.get('content-type'), what).to.match(/^application\/problem\+json/);
        expect(op.responses, `${what} answers 413`).to.have.property('413');
        checked++;
      }
    }
    expect(checked).to.be.at.least(15);
  });

  it('declares for each webhook kind the media types its intake takes, and no other', () => {
    for (const [kind, types] of Object.entries(WEBHOOK_MEDIA_TYPES)) {
      const op = spec.paths[`/webhooks/{tenant_id}/${kind}`]?.post;
      expect(Object.keys(op?.requestBody?.content ?? {}).sort(), kind).to.deep.equal([...types].sort());
      expect(op!.responses, kind).to.have.property('415');
    }
  });

  it('declares the 304 that a GET answers to If-None-Match naming its ETag, on every GET that answers it', async () => {
    // node:http, not fetch: fetch sends Cache-Control: no-cache with a conditional request, which is never 304
    const get = (path: string, headers: Record<string, string>) =>
      new Promise<{ status: number; etag?: string; length: number }>((resolve, reject) =>
        http
          .get(`${h.url}${path}`, { headers: { authorization: `Bearer ${KEYS.a}`, ...headers } }, (res) => {
            let length = 0;
            res.on('data', (c: Buffer) => (length += c.length));
            res.on('end', () => resolve({ status: res.statusCode!, etag: res.headers.etag as string | undefined, length }));
          })
          .on('error', reject),
      );
    let checked = 0;
    for (const [template, item] of Object.entries(spec.paths)) {
      const op = item.get;
      // a path of parameters needs a resource of its own; the stream routes answer no JSON; /auth/* redirect
      if (!op || template.includes('{') || template.startsWith('/auth/')) continue;
      const first = await get(template, {});
      if (first.status !== 200) continue;
      const again = await get(template, { 'if-none-match': first.etag ?? '"none"' });
      if (op.responses['304']) {
        expect(first.etag, template).to.match(/^W\/"/);
        // an answer that tells the time of its making (smart-gates, readiness) is another one a moment later
        if (again.status === 200 && again.etag !== first.etag) continue;
        expect([again.status, again.length], `${template} answers 304 with no body`).to.deep.equal([304, 0]);
        checked++;
      } else expect(again.status, `${template} answers 304 but does not declare it`).to.not.equal(304);
    }
    expect(checked).to.be.at.least(15);
  });

  it('declares the 204 its audit stream answers to a reconnect after the report, and the stream’s headers', async () => {
    const run = await h.call<Body>('POST', '/api/v1/autonomy/workspace-audit/run', { body: { phases: ['sanity'], timeout_seconds: 20 } });
    expect(run.status, run.text).to.equal(200);
    expect(run.body.status).to.equal('completed');
    // after every event of that audit: nothing more will come
    const after = await fetch(`${h.url}/api/v1/autonomy/workspace-audit/stream`, {
      headers: { authorization: `Bearer ${KEYS.a}`, 'last-event-id': `${run.body.report_id}/999999999999999-0` },
    });
    expect(after.status).to.equal(204);
    const op = spec.paths['/api/v1/autonomy/workspace-audit/stream']!.get!;
    expect(op.responses).to.have.property('204');
    expect(op.responses['200'].headers).to.have.all.keys('X-Report-Id', 'Content-Location');
  });

  it('answers an added agent with its Location, where the agent is', async () => {
    const session = await h.call<Body>('POST', '/api/v1/sessions', { body: { title: 'agents' } });
    const added = await h.call<Body>('POST', `/api/v1/sessions/${session.body.id}/agents`, { body: { name: 'writer' } });
    expect(added.status, added.text).to.equal(201);
    const location = added.headers.get('location');
    expect(location).to.equal(`/api/v1/sessions/${session.body.id}/agents/${added.body.id}`);
    const fetched = await h.call<Body>('GET', location!);
    expect(fetched.status).to.equal(200);
    expect(fetched.body).to.deep.equal(added.body);
    expect(spec.paths['/api/v1/sessions/{id}/agents']!.post!.responses['201'].headers).to.have.property('Location');
  });
});
