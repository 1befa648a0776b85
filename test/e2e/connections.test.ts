// Connections: per-tenant provider credentials, sealed at rest and never shown, checked against fake
// providers on loopback through each provider's own SDK.
import fs from 'node:fs';
import path from 'node:path';
import { expect } from 'chai';
import { FAKE_TOKEN, SMTP_USER, startFakeProviders, type FakeProviders } from '../support/fake-providers.js';
import { freePort, KEYS, startHarness, type Harness } from '../support/harness.js';

// eslint-disable-next-line @typescript-eslint/no-explicit-any
type Body = Record<string, any>;

describe('connections', function () {
  let h: Harness;
  /** another web process on the same store that keeps to the address rule (no SERVICE_HTTP_ALLOW_PRIVATE) */
  let strict: Harness;
  let fake: FakeProviders;

  before(async () => {
    fake = await startFakeProviders();
    h = await startHarness({ workers: false, env: { SERVICE_HTTP_ALLOW_PRIVATE: '1' } });
    strict = await startHarness({
      workers: false,
      env: {
        SERVICE_DATA_DIR: h.config.dataDir,
        SERVICE_WORKSPACE_ROOT: h.workspace,
        SERVICE_QUEUE_PREFIX: h.config.queuePrefix,
        SERVICE_HTTP_ALLOW_PRIVATE: '0',
      },
    });
  });
  after(async () => {
    await strict?.close();
    await h?.close();
    await fake?.close();
  });

  const create = (body: Body, key = KEYS.a) => h.call<Body>('POST', '/api/v1/connections', { body, key });
  const connectionsOf = (f: FakeProviders, credential = FAKE_TOKEN): Body[] => [
    { provider: 'codehost', name: 'github', base_url: f.github, credential },
    { provider: 'chat', name: 'slack', base_url: f.slack, credential },
    { provider: 'tracker', name: 'linear', base_url: f.linear, credential },
    { provider: 'pager', name: 'pagerduty', base_url: f.pager, credential, settings: { from: 'oncall@acme.test' } },
    { provider: 'email', name: 'smtp', base_url: f.smtp, credential, settings: { username: SMTP_USER, from: 'bot@acme.test' } },
  ];

  it('keeps a connection per provider without ever showing its credential, and tests each against its provider through its SDK', async () => {
    const made: Body[] = [];
    for (const c of connectionsOf(fake)) {
      const res = await create(c);
      expect(res.status, res.text).to.equal(201);
      expect(res.headers.get('location')).to.equal(`/api/v1/connections/${res.body.id}`);
      expect(res.body).to.deep.include({ provider: c.provider, name: c.name, base_url: c.base_url, last_used_at: null, last_test: null });
      expect(res.text).not.to.contain(FAKE_TOKEN);
      made.push(res.body);
    }
    const expected: Record<string, { identity: string; capabilities: string[] }> = {
      codehost: { identity: 'acme-bot', capabilities: ['repo', 'workflow'] },
      chat: { identity: 'acme-bot in Acme', capabilities: ['chat:write', 'app_mentions:read'] },
      tracker: { identity: 'bot@acme.test', capabilities: ['member'] },
      pager: { identity: 'oncall@acme.test', capabilities: ['teams', 'urgencies', 'read_only_users'] },
      email: { identity: SMTP_USER, capabilities: ['send'] },
    };
    for (const c of made) {
      const tested = await h.call<Body>('POST', `/api/v1/connections/${c.id}/test`);
      expect(tested.status, tested.text).to.equal(200);
      expect(tested.body, c.provider).to.deep.include({ ok: true, error: null, ...expected[c.provider] });
    }
    // each SDK presented the credential the way its provider takes it
    const auth = (p: string) => fake.requests.filter((r) => r.provider === p).map((r) => r.authorization);
    expect(auth('github')).to.deep.equal([`token ${FAKE_TOKEN}`]);
    expect(auth('slack')).to.deep.equal([`Bearer ${FAKE_TOKEN}`]);
    expect(auth('linear')).to.deep.equal([FAKE_TOKEN]);
    expect(auth('pager')).to.deep.equal([`Token token=${FAKE_TOKEN}`]);

    const listed = await h.call<Body>('GET', '/api/v1/connections');
    expect(listed.body.data.map((c: Body) => c.name)).to.deep.equal(['github', 'slack', 'linear', 'pagerduty', 'smtp']);
    expect(listed.body.data.every((c: Body) => c.last_test?.ok === true && typeof c.last_used_at === 'string')).to.equal(true);
    expect((await h.call<Body>('GET', '/api/v1/connections?provider=chat')).body.data.map((c: Body) => c.name)).to.deep.equal(['slack']);

    // sealed at rest, and in no log line
    const file = fs.readFileSync(path.join(h.config.dataDir, 'service.sqlite'));
    const wal = fs.existsSync(path.join(h.config.dataDir, 'service.sqlite-wal'))
      ? fs.readFileSync(path.join(h.config.dataDir, 'service.sqlite-wal'))
      : Buffer.alloc(0);
    expect(file.includes(FAKE_TOKEN) || wal.includes(FAKE_TOKEN), 'the store holds the credential in clear').to.equal(false);
    expect(h.logs.join('')).not.to.contain(FAKE_TOKEN);
  });

  it('says what a provider refused, with a stable code and without its body or the credential', async () => {
    const wrong = 'wrong-token-abcdefghijklmnopqrstuvwxyz';
    const f2: Body[] = connectionsOf(fake, wrong).map((c) => ({ ...c, name: `${c.name}-wrong` }));
    for (const c of f2) {
      const id = (await create(c)).body.id;
      const tested = await h.call<Body>('POST', `/api/v1/connections/${id}/test`);
      expect(tested.status).to.equal(200);
      expect(tested.body, c.provider).to.deep.include({ ok: false, identity: null, capabilities: [] });
      expect(tested.body.error.code, `${c.provider}: ${tested.body.error.message}`).to.equal('provider-auth-failed');
      expect(tested.text).not.to.contain(wrong);
      expect((await h.call<Body>('GET', `/api/v1/connections/${id}`)).body.last_test.ok).to.equal(false);
    }
    // nothing listens there: unreachable, at once
    const port = await freePort();
    const gone = (await create({ provider: 'codehost', name: 'gone', base_url: `http://127.0.0.1:${port}`, credential: FAKE_TOKEN })).body.id;
    const tested = await h.call<Body>('POST', `/api/v1/connections/${gone}/test`);
    expect(tested.body.error.code).to.equal('provider-unreachable');
    expect(h.logs.join('')).not.to.contain(wrong);
  });

  it('tries a 5xx and a 429 again as Retry-After says', async () => {
    const gh = (await h.call<Body>('GET', '/api/v1/connections?provider=codehost')).body.data.find((c: Body) => c.name === 'github');
    const slack = (await h.call<Body>('GET', '/api/v1/connections?provider=chat')).body.data.find((c: Body) => c.name === 'slack');
    const before = fake.requests.length;
    fake.failNext('github', 503, 1, 1);
    let started = Date.now();
    expect((await h.call<Body>('POST', `/api/v1/connections/${gh.id}/test`)).body.ok).to.equal(true);
    expect(Date.now() - started, 'waited for Retry-After').to.be.within(950, 5000);
    fake.failNext('slack', 429, 1, 1);
    started = Date.now();
    expect((await h.call<Body>('POST', `/api/v1/connections/${slack.id}/test`)).body.ok).to.equal(true);
    expect(Date.now() - started).to.be.within(950, 5000);
    expect(fake.requests.length - before, 'one failure and one success each').to.equal(4);
    // a provider that keeps failing: three calls, then the failure
    fake.failNext('github', 500, 5, 0);
    const failed = await h.call<Body>('POST', `/api/v1/connections/${gh.id}/test`);
    expect(failed.body.error.code).to.equal('provider-error');
    expect(fake.requests.length - before).to.equal(7);
    fake.failNext('github', 500, 0);
  });

  it('renames, rotates (dropping the last test), refuses a taken name, a bad base_url or settings, and removes', async () => {
    const made = (await create({ provider: 'codehost', name: 'ghe', base_url: fake.github, credential: 'old-token-aaaaaaaaaaaaaaaaaaaaaa' })).body;
    expect((await h.call<Body>('POST', `/api/v1/connections/${made.id}/test`)).body.ok).to.equal(false);
    const rotated = await h.call<Body>('PATCH', `/api/v1/connections/${made.id}`, { body: { credential: FAKE_TOKEN, name: 'ghe-2' } });
    expect(rotated.status, rotated.text).to.equal(200);
    expect(rotated.body).to.deep.include({ name: 'ghe-2', last_test: null });
    expect((await h.call<Body>('POST', `/api/v1/connections/${made.id}/test`)).body.ok, 'the new credential is used').to.equal(true);

    expect((await h.call<Body>('PATCH', `/api/v1/connections/${made.id}`, { body: { name: 'github' } })).status, 'taken').to.equal(409);
    expect((await create({ provider: 'chat', name: 'github', credential: 'x' })).status, 'taken').to.equal(409);
    expect((await h.call<Body>('PATCH', `/api/v1/connections/${made.id}`, { body: { provider: 'chat' } })).status, 'the provider stays').to.equal(400);
    expect((await h.call<Body>('PATCH', `/api/v1/connections/${made.id}`, { body: {} })).status).to.equal(400);

    const email = await create({ provider: 'email', name: 'mail', credential: 'x' });
    expect(email.status).to.equal(400);
    expect(email.body.errors.map((e: Body) => e.path).sort()).to.deep.equal(['/body/base_url', '/body/settings/from', '/body/settings/username']);
    const scheme = await create({ provider: 'codehost', name: 'ftp', base_url: 'ftp://example.com', credential: 'x' });
    expect(scheme.status).to.equal(400);
    expect(scheme.body.errors[0].path).to.equal('/body/base_url');
    const inUrl = await create({ provider: 'codehost', name: 'userinfo', base_url: 'https://user:pw@example.com', credential: 'x' });
    expect(inUrl.status).to.equal(400);
    expect((await create({ provider: 'codehost', name: 'nocred', base_url: fake.github })).status).to.equal(400);

    expect((await h.call('DELETE', `/api/v1/connections/${made.id}`)).status).to.equal(204);
    expect((await h.call('GET', `/api/v1/connections/${made.id}`)).status).to.equal(404);
    expect((await h.call('DELETE', `/api/v1/connections/${made.id}`)).status).to.equal(404);
    const names = (await h.call<Body>('GET', '/api/v1/connections')).body.data.map((c: Body) => c.name);
    expect(names).not.to.include('mail').and.not.to.include('ftp').and.not.to.include('ghe-2');
  });

  it('keeps private and loopback addresses out unless SERVICE_HTTP_ALLOW_PRIVATE=1, when made and when used', async () => {
    const refused = await strict.call<Body>('POST', '/api/v1/connections', {
      body: { provider: 'codehost', name: 'internal', base_url: 'http://127.0.0.1:9/', credential: 'x' },
    });
    expect(refused.status, refused.text).to.equal(422);
    expect(refused.body.code).to.equal('address-not-allowed');
    const metadata = await strict.call<Body>('POST', '/api/v1/connections', {
      body: { provider: 'codehost', name: 'imds', base_url: 'http://169.254.169.254/', credential: 'x' },
    });
    expect(metadata.body.code).to.equal('address-not-allowed');
    const named = await strict.call<Body>('POST', '/api/v1/connections', {
      body: { provider: 'chat', name: 'localhost', base_url: 'http://localhost:9/api/', credential: 'x' },
    });
    expect(named.body.code, 'a name that resolves to loopback').to.equal('address-not-allowed');
    // made where it was allowed, used where it is not: refused before any request leaves
    const gh = (await h.call<Body>('GET', '/api/v1/connections?provider=codehost')).body.data.find((c: Body) => c.name === 'github');
    const before = fake.requests.length;
    const tested = await strict.call<Body>('POST', `/api/v1/connections/${gh.id}/test`);
    expect(tested.body).to.deep.include({ ok: false });
    expect(tested.body.error.code).to.equal('address-not-allowed');
    expect(fake.requests.length).to.equal(before);
  });

  it('answers 404 for another tenant’s connection on every route, and lists only the tenant’s own', async () => {
    const mine = (await h.call<Body>('GET', '/api/v1/connections')).body.data[0];
    for (const [method, suffix, body] of [
      ['GET', '', undefined],
      ['PATCH', '', { name: 'stolen' }],
      ['DELETE', '', undefined],
      ['POST', '/test', undefined],
    ] as const) {
      const res = await h.call<Body>(method, `/api/v1/connections/${mine.id}${suffix}`, { key: KEYS.b, body });
      expect(res.status, `${method} ${suffix}`).to.equal(404);
    }
    expect((await h.call<Body>('GET', '/api/v1/connections', { key: KEYS.b })).body.data).to.deep.equal([]);
    expect((await h.call<Body>('GET', `/api/v1/connections/${mine.id}`)).body.name).to.equal(mine.name);
    expect((await h.call('GET', '/api/v1/connections/con_nope')).status).to.equal(400);
  });
});
