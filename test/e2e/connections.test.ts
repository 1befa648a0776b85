// Connections: per-tenant provider credentials, sealed at rest and never shown, checked against fake
// providers on loopback through each provider's own SDK.
import { execFileSync } from 'node:child_process';
import { generateKeyPairSync, randomBytes } from 'node:crypto';
import dns from 'node:dns';
import fs from 'node:fs';
import http from 'node:http';
import net, { type AddressInfo } from 'node:net';
import { gzipSync } from 'node:zlib';
import path from 'node:path';
import { expect } from 'chai';
import { FAKE_TOKEN, gitBlobSha, makePullRequestRepo, SMTP_USER, startFakeProviders, type FakeProviders } from '../support/fake-providers.js';
import { startScriptedModel, type ScriptedModel } from '../support/scripted-model.js';
import { connectionsOf as connectionsCapability } from '../../engine/connections/index.js';
import { chatKit, codehostKit, emailKit, pagerKit, trackerKit } from '../../engine/connections/kits.js';
import { ACTIONS } from '../../engine/connections/actions.js';
import { binaryPatch } from '../../engine/platform/git-binary.js';
import { createSecretBox, loadSecretKey } from '../../engine/platform/secret-box.js';
import { eventually, finishedRun, freePort, KEYS, sameDeployment, startHarness, type Harness } from '../support/harness.js';

// eslint-disable-next-line @typescript-eslint/no-explicit-any
type Body = Record<string, any>;

/**
 * A connection of tenant-a whose credential was stored before credentials were checked as they are now: made with a
 * good one, then given `credential` sealed as the service seals it, past its checks.
 */
async function storedBefore(h: Harness, body: Body, credential: string): Promise<string> {
  const made = await h.call<Body>('POST', '/api/v1/connections', { body: { ...body, credential: 'placeholder-token-0123456789' }, key: KEYS.a });
  expect(made.status, made.text).to.equal(201);
  const sealed = createSecretBox(loadSecretKey(h.config).key).seal(credential, `connection:tenant-a:${made.body.id}`);
  await h.rt.store.connections.update('tenant-a', made.body.id, { sealed });
  return made.body.id;
}

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
      env: { ...sameDeployment(h), SERVICE_HTTP_ALLOW_PRIVATE: '0' },
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

  it('reads a provider’s answer only up to 4 MB as decoded (a gzip bomb), takes an answer that names no user for none, and bounds an SMTP server that never finishes', async () => {
    const bomb = gzipSync(Buffer.concat([Buffer.from('{"login":"'), Buffer.alloc(300 * 1024 * 1024, 0x61), Buffer.from('"}')]));
    const hostile = http.createServer((req, res) => {
      if (req.url!.startsWith('/bomb/')) {
        res.writeHead(200, { 'content-type': 'application/json', 'content-encoding': 'gzip' });
        return res.end(bomb);
      }
      if (req.url!.startsWith('/endless/')) {
        // an answer sent as it is, with no end in sight: 64 MB unless the reader stops
        res.writeHead(200, { 'content-type': 'application/json' });
        res.write('{"data":{"viewer":{"id":"');
        const chunk = Buffer.alloc(1024 * 1024, 0x61);
        let sent = 0;
        const more = () => {
          while (sent < 64 && res.write(chunk)) sent++;
          if (sent >= 64) res.end('"}}}');
          else res.once('drain', () => (sent++, more()));
        };
        return more();
      }
      if (req.url!.startsWith('/nologin/')) {
        res.writeHead(200, { 'content-type': 'application/json' });
        return res.end('{"id":1}');
      }
      res.writeHead(404).end();
    });
    await new Promise<void>((r) => hostile.listen(0, '127.0.0.1', r));
    // an SMTP server that greets, then answers a line every 200 ms and never ends its answer
    const dripping = new Set<net.Socket>();
    const drip = net.createServer((socket) => {
      dripping.add(socket);
      socket.on('close', () => dripping.delete(socket));
      socket.write('220 x ESMTP\r\n');
      socket.on('data', () => {
        const t = setInterval(() => socket.write('250-slow\r\n'), 200);
        socket.on('close', () => clearInterval(t));
      });
    });
    await new Promise<void>((r) => drip.listen(0, '127.0.0.1', r));
    const base = `http://127.0.0.1:${(hostile.address() as AddressInfo).port}`;
    try {
      const rss = process.memoryUsage().rss;
      let peak = rss;
      const sampler = setInterval(() => (peak = Math.max(peak, process.memoryUsage().rss)), 5);
      const bombed = (await create({ provider: 'codehost', name: 'bomb', base_url: `${base}/bomb/api/v3`, credential: FAKE_TOKEN })).body.id;
      const tested = await h.call<Body>('POST', `/api/v1/connections/${bombed}/test`);
      clearInterval(sampler);
      expect(tested.body.ok, tested.text).to.equal(false);
      expect(tested.body.error.message).to.match(/came encoded \(gzip\)/);
      expect((peak - rss) / 1024 / 1024, 'MB the answer took').to.be.below(120);
      // the tracker's SDK calls the global fetch itself: its answers are bounded as well, compressed or not
      for (const path of ['bomb', 'endless']) {
        const before = process.memoryUsage().rss;
        let top = before;
        const sampling = setInterval(() => (top = Math.max(top, process.memoryUsage().rss)), 5);
        const tracker = (await create({ provider: 'tracker', name: `tracker ${path}`, base_url: `${base}/${path}/graphql`, credential: FAKE_TOKEN })).body.id;
        const answered = await h.call<Body>('POST', `/api/v1/connections/${tracker}/test`);
        clearInterval(sampling);
        expect(answered.body, `${path}: ${answered.text}`).to.deep.include({ ok: false });
        expect((top - before) / 1024 / 1024, `${path}: MB the answer took`).to.be.below(60);
        expect(answered.body.error.message, path).to.match(/over 4 MB|encoded/);
      }
      // an action's answer of success past 4 MB: what it made is not said, and it is not taken for an empty success
      await create({ provider: 'codehost', name: 'endless comment', base_url: `${base}/endless/api/v3`, credential: FAKE_TOKEN });
      const commented = await h.rt.engine.connections
        .act('tenant-a', 'codehost', 'endless comment', 'comment', { repository: 'acme/app', number: 7, body: 'hi' })
        .catch((e: { code?: string }) => e);
      expect(commented, JSON.stringify(commented)).to.deep.include({ code: 'provider-answer-unreadable' });
      const nologin = (await create({ provider: 'codehost', name: 'nologin', base_url: `${base}/nologin/api/v3`, credential: FAKE_TOKEN })).body.id;
      const named = await h.call<Body>('POST', `/api/v1/connections/${nologin}/test`);
      expect(named.status, named.text).to.equal(200);
      expect(named.body).to.deep.include({ ok: false, identity: null });
      // the SMTP server that never finishes: held to the signal the test (30 s) or a step gives
      const access = {
        token: 'x',
        baseUrl: `smtp://127.0.0.1:${(drip.address() as AddressInfo).port}`,
        settings: { username: 'u', from: 'a@example.com' },
        allowPrivate: true,
      };
      const t0 = Date.now();
      const err = await emailKit.identify({ ...access, signal: AbortSignal.timeout(1000) }).catch((e: unknown) => e);
      expect(Date.now() - t0).to.be.below(5000);
      expect(emailKit.classify(err, 'x')).to.deep.include({ status: null });
      // and the connection given up on is closed, not left open for as long as the server goes on talking
      await eventually(() => dripping.size === 0, 'the SMTP connection to close', 2000);
    } finally {
      hostile.closeAllConnections();
      hostile.close();
      drip.close();
    }
  });

  it('reaches no private address through a name whose DNS answer changes after the check (rebinding): each connection looks it up again, guarded', async () => {
    const internal = http.createServer((_req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' }).end('{"login":"internal","ok":true}');
    });
    // connections, not requests: the tracker's SDK speaks only HTTPS to a name, which this server cannot answer
    let reached = 0;
    internal.on('connection', () => reached++);
    await new Promise<void>((r) => internal.listen(0, '127.0.0.1', r));
    const port = (internal.address() as AddressInfo).port;
    // the check before the call is answered a public address; the SDK's own lookup at connect time, loopback
    const lookup = dns.lookup;
    const checked = dns.promises.lookup;
    dns.promises.lookup = (async (host: string, options: object) =>
      host === 'rebind.example' ? [{ address: '93.184.216.34', family: 4 }] : checked(host, options as never)) as typeof checked;
    dns.lookup = ((host: string, options: unknown, callback?: unknown) => {
      const cb = (typeof options === 'function' ? options : callback) as (...args: unknown[]) => void;
      const opts = (typeof options === 'function' ? {} : options) as dns.LookupOptions;
      if (host !== 'rebind.example') return (lookup as (...args: unknown[]) => void)(host, options, callback);
      return opts.all ? cb(null, [{ address: '127.0.0.1', family: 4 }]) : cb(null, '127.0.0.1', 4);
    }) as typeof lookup;
    // nodemailer asks DNS itself (a resolver of its own, not dns.lookup): answered loopback too
    const resolve4 = dns.Resolver.prototype.resolve4;
    dns.Resolver.prototype.resolve4 = function (this: dns.Resolver, host: string, ...rest: unknown[]) {
      const cb = rest.at(-1) as (err: Error | null, addresses: string[]) => void;
      if (host === 'rebind.example') return void setImmediate(() => cb(null, ['127.0.0.1']));
      return (resolve4 as (...args: unknown[]) => void).call(this, host, ...rest);
    } as typeof resolve4;
    try {
      const base = `http://rebind.example:${port}`;
      const kits = [
        [codehostKit, `${base}/api/v3`],
        [chatKit, `${base}/api/`],
        [trackerKit, `https://rebind.example:${port}/graphql`],
        [pagerKit, base],
        [emailKit, `smtp://rebind.example:${port}`],
      ] as const;
      for (const [kit, baseUrl] of kits) {
        const access = { token: FAKE_TOKEN, baseUrl, settings: { from: 'a@example.com' }, allowPrivate: false, signal: AbortSignal.timeout(5000) };
        const err = await kit.identify(access).then(
          () => null,
          (e: unknown) => e,
        );
        expect(err, `${kit.provider}: answered`).to.not.equal(null);
        expect(kit.classify(err, FAKE_TOKEN), kit.provider).to.deep.include({ status: null });
        expect(reached, `${kit.provider} reached the private address`).to.equal(0);
      }
      // where private addresses are allowed (SERVICE_HTTP_ALLOW_PRIVATE), the same name is reached
      await codehostKit.identify({ token: FAKE_TOKEN, baseUrl: `${base}/api/v3`, settings: {}, allowPrivate: true });
      expect(reached).to.equal(1);
    } finally {
      dns.lookup = lookup;
      dns.promises.lookup = checked;
      dns.Resolver.prototype.resolve4 = resolve4;
      internal.closeAllConnections();
      internal.close();
    }
  });

  it('refuses a credential with a control character, and masks one stored before wherever its library quotes it', async () => {
    const newline = await create({
      provider: 'pager',
      name: 'nl',
      base_url: fake.pager,
      credential: 'u+PDkey_ABCDEFGHIJ12345\n',
      settings: { from: 'a@b.test' },
    });
    expect(newline.status, newline.text).to.equal(400);
    expect(newline.body.errors.map((e: Body) => e.path)).to.deep.equal(['/body/credential']);
    expect(newline.text).not.to.contain('ABCDEFGHIJ12345');
    // one stored before the check: fetch refuses the header and quotes the token in its error
    const secret = 'SECRETPART_abcdefgh\nX-Evil: 1';
    const stored = await storedBefore(h, { provider: 'pager', name: 'stored-nl', base_url: fake.pager, settings: { from: 'a@b.test' } }, secret);
    const tested = await h.call<Body>('POST', `/api/v1/connections/${stored}/test`);
    expect(tested.body).to.deep.include({ ok: false });
    const rotated = await h.call<Body>('PATCH', `/api/v1/connections/${stored}`, { body: { credential: 'two\tparts' } });
    expect(rotated.status, 'a rotation is checked too').to.equal(400);
    for (const text of [JSON.stringify(tested.body), h.logs.join('')]) expect(text).not.to.contain('abcdefgh');
  });

  it('refuses (400) a credential an HTTP header cannot carry for every provider but email, and a pager’s from that is no ASCII address, storing nothing', async () => {
    const before = (await h.call<Body>('GET', '/api/v1/connections?limit=100')).body.data.length;
    const bodies: Array<[Body, string]> = [
      [{ provider: 'chat', name: 'emoji', base_url: fake.slack, credential: 'toké😀' }, '/body/credential'],
      [{ provider: 'codehost', name: 'accent', base_url: fake.github, credential: 'ghp_tokén0123456789' }, '/body/credential'],
      [{ provider: 'tracker', name: 'spaced', base_url: fake.linear, credential: 'lin_api key 0123456789' }, '/body/credential'],
      [{ provider: 'pager', name: 'latin', base_url: fake.pager, credential: 'u+PDkeyé', settings: { from: 'oncall@acme.test' } }, '/body/credential'],
      [{ provider: 'pager', name: 'from-word', base_url: fake.pager, credential: FAKE_TOKEN, settings: { from: 'oncall' } }, '/body/settings/from'],
      [{ provider: 'pager', name: 'from-utf8', base_url: fake.pager, credential: FAKE_TOKEN, settings: { from: 'oncall@acmé.test' } }, '/body/settings/from'],
    ];
    for (const [body, path] of bodies) {
      const refused = await create(body);
      expect(refused.status, `${body.name}: ${refused.text}`).to.equal(400);
      expect(refused.headers.get('content-type')).to.match(/^application\/problem\+json/);
      expect(refused.body.code).to.equal('validation-failed');
      expect(refused.body.errors.map((e: Body) => e.path)).to.deep.equal([path]);
      expect(refused.text, body.name).not.to.contain(body.credential);
    }
    expect((await h.call<Body>('GET', '/api/v1/connections?limit=100')).body.data.length, 'nothing stored').to.equal(before);
    // a rotation is checked the same way, against the connection's provider
    const chat = await create({ provider: 'chat', name: 'ascii-chat', base_url: fake.slack, credential: FAKE_TOKEN });
    const rotated = await h.call<Body>('PATCH', `/api/v1/connections/${chat.body.id}`, { body: { credential: 'toké😀' } });
    expect(rotated.status, rotated.text).to.equal(400);
    expect(rotated.body.errors.map((e: Body) => e.path)).to.deep.equal(['/body/credential']);
    // an SMTP password may be UTF-8
    const mail = await create({
      provider: 'email',
      name: 'utf8-mail',
      base_url: fake.smtp,
      credential: 'pässwörd😀',
      settings: { username: SMTP_USER, from: 'bot@acme.test' },
    });
    expect(mail.status, mail.text).to.equal(201);
    for (const id of [chat.body.id, mail.body.id]) await h.call('DELETE', `/api/v1/connections/${id}`);
  });

  it('says a credential stored before with characters no header carries is refused as such, never which character or where', async () => {
    for (const [body, credential] of [
      [{ provider: 'chat', name: 'stored-emoji', base_url: fake.slack }, 'toké😀'],
      [{ provider: 'pager', name: 'stored-emoji-pager', base_url: fake.pager, settings: { from: 'oncall@acme.test' } }, 'u+PDkey😀'],
    ] as const) {
      const id = await storedBefore(h, body, credential);
      const tested = await h.call<Body>('POST', `/api/v1/connections/${id}/test`);
      expect(tested.status, tested.text).to.equal(200);
      expect(tested.body, body.provider).to.deep.include({ ok: false });
      // (Slack's SDK wraps fetch's error in its own, which is the test's verdict; the pager's is logged)
      if (body.provider === 'chat') expect(tested.body.error.message).to.contain("the credential holds characters the provider's HTTP header cannot carry");
      for (const text of [tested.text, h.logs.join('')]) expect(text, body.provider).not.to.match(/ByteString|index \d+ has a value/);
      await h.call('DELETE', `/api/v1/connections/${id}`);
    }
  });

  it('keeps what a provider says of a credential bounded: a 3.9 MB login and hundreds of scopes are clipped before they are masked and kept, and so is an action’s answer', async () => {
    const huge = 3.9 * 1024 * 1024;
    // the credential straddles the 256-character cut of the identity: none of it is left
    const user = `${'u'.repeat(250)}${FAKE_TOKEN}${'v'.repeat(huge)}`;
    const scopes = [...Array.from({ length: 200 }, (_, i) => `scope:${i}:${'s'.repeat(30)}`), 'w'.repeat(500)].join(',');
    const hostile = http.createServer((req, res) => {
      req.resume();
      req.on('end', () => {
        if (req.url!.endsWith('/auth.test')) {
          res.writeHead(200, { 'content-type': 'application/json', 'x-oauth-scopes': scopes });
          return res.end(JSON.stringify({ ok: true, user, team: 'Acme', user_id: 'U1', team_id: 'T1' }));
        }
        if (req.url!.endsWith('/chat.postMessage')) {
          res.writeHead(200, { 'content-type': 'application/json' });
          return res.end(JSON.stringify({ ok: true, channel: 'C1', ts: `${FAKE_TOKEN}${'1'.repeat(huge)}` }));
        }
        res.writeHead(404).end();
      });
    });
    await new Promise<void>((r) => hostile.listen(0, '127.0.0.1', r));
    try {
      const base = `http://127.0.0.1:${(hostile.address() as AddressInfo).port}/api/`;
      const made = await create({ provider: 'chat', name: 'talkative', base_url: base, credential: FAKE_TOKEN });
      expect(made.status, made.text).to.equal(201);
      const tested = await h.call<Body>('POST', `/api/v1/connections/${made.body.id}/test`);
      expect(tested.status, tested.text.slice(0, 300)).to.equal(200);
      expect(tested.body.ok, tested.text.slice(0, 300)).to.equal(true);
      expect(tested.body.identity).to.have.lengthOf(256);
      expect(tested.body.identity).to.equal(`${'u'.repeat(250)}[credential]`.slice(0, 256));
      expect(tested.body.capabilities).to.have.lengthOf(100);
      expect(tested.body.capabilities.every((c: string) => c.length <= 100)).to.equal(true);
      const kept = await h.call<Body>('GET', `/api/v1/connections/${made.body.id}`);
      expect(kept.text.length, 'characters one connection takes').to.be.below(16 * 1024);
      expect(kept.body.last_test).to.deep.equal(tested.body);
      for (const text of [tested.text, kept.text]) expect(text).not.to.contain(FAKE_TOKEN.slice(0, 6));
      // an action's answer: each string to 2000 characters, the credential masked before the cut
      const acted = await h.rt.engine.connections.act('tenant-a', 'chat', 'talkative', 'post', { channel: 'C1', text: 'hi' });
      expect(acted.answer.channel).to.equal('C1');
      expect(acted.answer.ts).to.have.lengthOf(2000);
      expect(String(acted.answer.ts).startsWith('[credential]1')).to.equal(true);
      await h.call('DELETE', `/api/v1/connections/${made.body.id}`);
    } finally {
      hostile.closeAllConnections();
      hostile.close();
    }
  });

  it('masks a short SMTP password an AUTH LOGIN server echoes in base64, in the test’s answer and in last_test', async () => {
    // a server that offers AUTH LOGIN and quotes the password line it was sent in its refusal
    const echoing = net.createServer((socket) => {
      let step = 'greeted';
      socket.write('220 mail.acme.test ESMTP\r\n');
      socket.on('data', (chunk) => {
        for (const line of chunk.toString('latin1').split('\r\n').filter(Boolean)) {
          if (/^(EHLO|HELO)/i.test(line)) socket.write('250-mail.acme.test\r\n250 AUTH LOGIN\r\n');
          else if (/^AUTH LOGIN/i.test(line)) ((step = 'user'), socket.write('334 VXNlcm5hbWU6\r\n'));
          else if (step === 'user') ((step = 'password'), socket.write('334 UGFzc3dvcmQ6\r\n'));
          else if (step === 'password') ((step = 'done'), socket.write(`535 5.7.8 Authentication failed for ${line}\r\n`));
          else if (/^QUIT/i.test(line)) socket.end('221 bye\r\n');
          else socket.write('502 no\r\n');
        }
      });
      socket.on('error', () => undefined);
    });
    await new Promise<void>((r) => echoing.listen(0, '127.0.0.1', r));
    try {
      for (const password of ['hunter2', 'Tr0ub4dor!']) {
        const made = await create({
          provider: 'email',
          name: `smtp-echo-${password.length}`,
          base_url: `smtp://127.0.0.1:${(echoing.address() as AddressInfo).port}`,
          credential: password,
          settings: { username: 'bot', from: 'bot@acme.test' },
        });
        expect(made.status, made.text).to.equal(201);
        const tested = await h.call<Body>('POST', `/api/v1/connections/${made.body.id}/test`);
        expect(tested.body.error?.code, tested.text).to.equal('provider-auth-failed');
        const kept = await h.call<Body>('GET', `/api/v1/connections/${made.body.id}`);
        for (const text of [tested.text, kept.text]) {
          expect(text, password).to.contain('Authentication failed for [credential]');
          expect(text, password).not.to.contain(Buffer.from(password).toString('base64').replace(/=+$/, ''));
        }
      }
    } finally {
      echoing.close();
    }
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
    // Slack's 429 with no Retry-After, or one given as an HTTP date: tried again too (the SDK threw an error of no code)
    for (const headers of [{}, { 'retry-after': new Date(Date.now() + 1500).toUTCString() }] as Record<string, string>[]) {
      fake.failNext('slack', 429, 1, undefined, headers);
      const tested = await h.call<Body>('POST', `/api/v1/connections/${slack.id}/test`);
      expect(tested.body.ok, JSON.stringify(headers) + tested.text).to.equal(true);
    }
    fake.failNext('slack', 429, 5, undefined);
    const limited = await h.call<Body>('POST', `/api/v1/connections/${slack.id}/test`);
    expect(limited.body.error, limited.text).to.deep.include({ code: 'provider-rate-limited' });
    expect(limited.text).not.to.contain('Retry header');
    const counted = fake.requests.length;
    fake.failNext('slack', 429, 0);
    // a provider that keeps failing: three calls, then the failure
    fake.failNext('github', 500, 5, 0);
    const failed = await h.call<Body>('POST', `/api/v1/connections/${gh.id}/test`);
    expect(failed.body.error.code).to.equal('provider-error');
    expect(fake.requests.length - counted).to.equal(3);
    fake.failNext('github', 500, 0);
  });

  it('asks the pager once per try: a 429 with Retry-After: 1 is three requests a second apart, not a burst of twelve', async () => {
    const pager = (await h.call<Body>('GET', '/api/v1/connections?provider=pager')).body.data.find((c: Body) => c.name === 'pagerduty');
    const before = fake.requests.length;
    fake.failNext('pager', 429, 20, 1);
    try {
      const tested = await h.call<Body>('POST', `/api/v1/connections/${pager.id}/test`);
      expect(tested.body.error?.code, tested.text).to.equal('provider-rate-limited');
    } finally {
      fake.failNext('pager', 429, 0);
    }
    const sent = fake.requests.slice(before).filter((r) => r.provider === 'pager');
    expect(sent.map((r) => r.path)).to.deep.equal(['/pager/abilities', '/pager/abilities', '/pager/abilities']);
    for (let i = 1; i < sent.length; i++) expect(sent[i]!.at - sent[i - 1]!.at, `the wait before request ${i + 1}`).to.be.at.least(950);
  });

  /** Tests the code host connection `github`: its answer, how long it took, and the paths it asked for. */
  const testGithub = async () => {
    const gh = (await h.call<Body>('GET', '/api/v1/connections?provider=codehost')).body.data.find((c: Body) => c.name === 'github');
    const before = fake.requests.length;
    const started = Date.now();
    const tested = await h.call<Body>('POST', `/api/v1/connections/${gh.id}/test`);
    return { tested: tested.body, took: Date.now() - started, paths: fake.requests.slice(before).map((r) => r.path) };
  };

  it('takes a GitHub 403 that names a wait (Retry-After, or no request left until x-ratelimit-reset) for a rate limit, and asks again when it says', async () => {
    // no request left until x-ratelimit-reset (seconds since the epoch), a second from now at most
    const reset = Math.floor(Date.now() / 1000) + 1;
    fake.failNext('github', 403, 1, undefined, { 'x-ratelimit-remaining': '0', 'x-ratelimit-reset': String(reset) });
    let { tested, paths, took } = await testGithub();
    expect(tested, 'not taken for a refused credential (nor for an installation token)').to.deep.include({ ok: true, identity: 'acme-bot' });
    expect(paths).to.deep.equal(['/github/user', '/github/user']);
    expect(fake.requests.at(-1)!.at, 'asked again once the limit was reset').to.be.at.least(reset * 1000 - 50);
    // a secondary rate limit: Retry-After
    fake.failNext('github', 403, 1, 1);
    ({ tested, paths, took } = await testGithub());
    expect(tested).to.deep.include({ ok: true, identity: 'acme-bot' });
    expect(paths).to.deep.equal(['/github/user', '/github/user']);
    expect(took).to.be.at.least(950);
  });

  it('fails a call at once, saying the wait, when the provider asks to wait longer than 10 s: never asked again before the time it named', async () => {
    fake.failNext('github', 429, 3, 60);
    let { tested, paths, took } = await testGithub();
    expect(tested.error.code, tested.error.message).to.equal('provider-rate-limited');
    expect(tested.error.message).to.contain('retry after 60 s');
    expect(paths).to.have.length(1);
    expect(took).to.be.below(5000);
    // GitHub's limit reset in an hour
    fake.failNext('github', 403, 3, undefined, { 'x-ratelimit-remaining': '0', 'x-ratelimit-reset': String(Math.floor(Date.now() / 1000) + 3600) });
    ({ tested, paths, took } = await testGithub());
    expect(tested.error.code, tested.error.message).to.equal('provider-rate-limited');
    expect(tested.error.message).to.match(/retry after 3\d{3} s/);
    expect(paths).to.have.length(1);
    expect(took).to.be.below(5000);
    fake.failNext('github', 403, 0);
  });

  it('holds each call to a provider that takes the connection and never answers to the provider timeout: provider-unreachable, saying so, not asked again', async () => {
    // takes every connection and request, never says a word
    const held = new Set<net.Socket>();
    let asked = 0;
    const silent = net.createServer((socket) => {
      held.add(socket);
      socket.on('data', (chunk) => (asked += chunk.toString('latin1').match(/^(GET|POST|PUT) \S+ HTTP\/1\.1\r$/gm)?.length ?? 0));
      socket.on('error', () => undefined);
      socket.on('close', () => held.delete(socket));
    });
    await new Promise<void>((r) => silent.listen(0, '127.0.0.1', r));
    const base = `http://127.0.0.1:${(silent.address() as AddressInfo).port}`;
    // the connections capability over the same store, its timeout made short (no variable of the environment sets it)
    const quick = connectionsCapability(
      { store: h.rt.store, clock: h.rt.clock, log: h.rt.log, secretBox: createSecretBox(randomBytes(32)) },
      { httpAllowPrivate: true, providerTimeoutMs: 300 },
    );
    const tenant = 'tenant-silent';
    const cases = [
      ['codehost', { base_url: `${base}/api/v3` }, 'comment', { repository: 'acme/app', number: 1, body: 'x' }],
      ['chat', { base_url: `${base}/api/` }, 'post', { channel: 'C1', text: 'x' }],
      ['tracker', { base_url: `${base}/graphql` }, 'set_priority', { issue_id: 'ISS-1', priority: 1 }],
      ['pager', { base_url: base, settings: { from: 'a@b.test' } }, 'acknowledge', { incident_id: 'P1' }],
      [
        'email',
        { base_url: base.replace(/^http/, 'smtp'), settings: { username: 'u', from: 'a@b.test' } },
        'reply',
        { to: 'a@example.com', subject: 's', text: 't' },
      ],
    ] as const;
    try {
      for (const [provider, where, action, args] of cases) {
        const made = await quick.create(tenant, { provider, name: provider, credential: FAKE_TOKEN, ...where });
        const before = asked;
        const started = Date.now();
        const err = await quick.act(tenant, provider, provider, action, args).then(
          () => null,
          (e: unknown) => e as Error & { code?: string },
        );
        expect(Date.now() - started, provider).to.be.below(3000);
        expect(err?.code, `${provider}: ${err?.message}`).to.equal('provider-unreachable');
        expect(err!.message).to.equal(`the ${provider} provider did not answer within 0.3 s`);
        // (an SMTP client says nothing before the server's greeting)
        if (provider !== 'email') expect(asked - before, `${provider}: one request, not asked again`).to.equal(1);
        const tested = await quick.test(tenant, made.id);
        expect(tested, provider).to.deep.include({
          ok: false,
          error: { code: 'provider-unreachable', message: `the ${provider} provider did not answer within 0.3 s` },
        });
      }
    } finally {
      for (const c of await h.rt.store.connections.list(tenant)) await quick.remove(tenant, c.id);
      for (const socket of held) socket.destroy();
      silent.close();
    }
  });

  it('renames, rotates (dropping the last test), refuses a taken name, a bad base_url or settings, and removes', async () => {
    const made = (await create({ provider: 'codehost', name: 'ghe', base_url: fake.github, credential: 'old-token-aaaaaaaaaaaaaaaaaaaaaa' })).body;
    expect((await h.call<Body>('POST', `/api/v1/connections/${made.id}/test`)).body.ok).to.equal(false);
    const rotated = await h.call<Body>('PATCH', `/api/v1/connections/${made.id}`, { body: { credential: FAKE_TOKEN, name: 'ghe-2' } });
    expect(rotated.status, rotated.text).to.equal(200);
    expect(rotated.body).to.deep.include({ name: 'ghe-2', last_test: null });
    expect((await h.call<Body>('POST', `/api/v1/connections/${made.id}/test`)).body.ok, 'the new credential is used').to.equal(true);
    // its settings are part of what was tried too
    const resettled = await h.call<Body>('PATCH', `/api/v1/connections/${made.id}`, { body: { settings: {} } });
    expect(resettled.status, resettled.text).to.equal(200);
    expect(resettled.body.last_test).to.equal(null);
    expect((await h.call<Body>('POST', `/api/v1/connections/${made.id}/test`)).body.ok).to.equal(true);

    expect((await h.call<Body>('PATCH', `/api/v1/connections/${made.id}`, { body: { name: 'github' } })).status, 'taken').to.equal(409);
    expect((await create({ provider: 'chat', name: 'github', credential: 'x' })).status, 'taken').to.equal(409);
    expect((await h.call<Body>('PATCH', `/api/v1/connections/${made.id}`, { body: { provider: 'chat' } })).status, 'the provider stays').to.equal(400);
    expect((await h.call<Body>('PATCH', `/api/v1/connections/${made.id}`, { body: {} })).status).to.equal(400);
    // the stored credential never goes to a new place: a new base_url needs the credential again
    const moved = await h.call<Body>('PATCH', `/api/v1/connections/${made.id}`, { body: { base_url: 'https://attacker.example/api/v3' } });
    expect(moved.status).to.equal(400);
    expect(moved.body.errors).to.deep.equal([{ path: '/body/credential', message: 'required when base_url changes' }]);
    expect((await h.call<Body>('GET', `/api/v1/connections/${made.id}`)).body.base_url).to.equal(fake.github);

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
    expect(named.body.detail, 'without the address it resolves to').to.equal('localhost resolves to a private or loopback address');
    // no host: nodemailer would take it as localhost
    for (const base_url of ['smtp://', 'smtps:', 'smtp:127.0.0.1']) {
      const hostless = await strict.call<Body>('POST', '/api/v1/connections', {
        body: { provider: 'email', name: 'hostless', base_url, credential: 'x', settings: { username: 'u', from: 'a@b.test' } },
      });
      expect(hostless.status, base_url).to.equal(400);
      expect(hostless.body.errors, base_url).to.deep.include({ path: '/body/base_url', message: 'the URL names no host' });
    }
    const unresolved = await strict.call<Body>('POST', '/api/v1/connections', {
      body: { provider: 'codehost', name: 'nowhere', base_url: 'https://ghe.nowhere.invalid/api/v3', credential: 'x' },
    });
    expect(unresolved.status, 'a name that resolves to nothing cannot be checked').to.equal(422);
    expect(unresolved.body.code).to.equal('address-not-allowed');
    expect(unresolved.body.detail).to.contain('does not resolve');
    expect((await strict.call<Body>('GET', '/api/v1/connections')).body.data.map((c: Body) => c.name)).not.to.include('nowhere');
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

  it('holds a tenant to SERVICE_TENANT_MAX_CONNECTIONS with 409, and lists its connections a page at a time', async () => {
    const capped = await startHarness({ workers: false, env: { SERVICE_HTTP_ALLOW_PRIVATE: '1', SERVICE_TENANT_MAX_CONNECTIONS: '3' } });
    try {
      const add = (name: string, provider = 'codehost') =>
        capped.call<Body>('POST', '/api/v1/connections', { body: { provider, name, base_url: fake.github, credential: FAKE_TOKEN } });
      for (const name of ['one', 'two', 'three']) expect((await add(name, name === 'two' ? 'chat' : 'codehost')).status).to.equal(201);
      const over = await add('four');
      expect(over.status, over.text).to.equal(409);
      expect(over.body.code).to.equal('conflict');
      expect(over.body.detail).to.contain('SERVICE_TENANT_MAX_CONNECTIONS');
      expect(
        (await capped.call<Body>('POST', '/api/v1/connections', { key: KEYS.b, body: { provider: 'codehost', name: 'four', credential: FAKE_TOKEN } })).status,
        'another tenant has its own count',
      ).to.equal(201);
      const first = await capped.call<Body>('GET', '/api/v1/connections?limit=2');
      expect(first.status, first.text).to.equal(200);
      expect(first.body.data.map((c: Body) => c.name)).to.deep.equal(['one', 'two']);
      const second = await capped.call<Body>('GET', `/api/v1/connections?limit=2&cursor=${first.body.next_cursor}`);
      expect(second.body).to.deep.include({ next_cursor: null });
      expect(second.body.data.map((c: Body) => c.name)).to.deep.equal(['three']);
      const codehost = await capped.call<Body>('GET', '/api/v1/connections?provider=codehost&limit=1');
      expect(codehost.body.data.map((c: Body) => c.name)).to.deep.equal(['one']);
      expect(
        (await capped.call<Body>('GET', `/api/v1/connections?provider=codehost&limit=1&cursor=${codehost.body.next_cursor}`)).body.data.map(
          (c: Body) => c.name,
        ),
      ).to.deep.equal(['three']);
      expect((await capped.call<Body>('GET', '/api/v1/connections?limit=101')).status, 'at most 100 a page').to.equal(400);
      // a removed one is not held
      expect((await capped.call('DELETE', `/api/v1/connections/${first.body.data[0].id}`)).status).to.equal(204);
      expect((await add('four')).status).to.equal(201);
    } finally {
      await capped.close();
    }
  });

  it('says a credential sealed under another SERVICE_SECRET_KEY is unreadable, not the provider’s fault, and asks no provider', async () => {
    const made = await create({ ...connectionsOf(fake)[0]!, name: 'rekeyed' });
    expect(made.status, made.text).to.equal(201);
    const record = (await h.rt.store.connections.get('tenant-a', made.body.id))!;
    const sealed = createSecretBox(randomBytes(32)).seal('stale-token', `connection:tenant-a:${made.body.id}`);
    await h.rt.store.connections.update('tenant-a', made.body.id, { sealed });
    const asked = fake.requests.length;
    const tested = await h.call<Body>('POST', `/api/v1/connections/${made.body.id}/test`);
    expect(tested.status, tested.text).to.equal(200);
    expect(tested.body).to.deep.include({ ok: false });
    expect(tested.body.error.code).to.equal('credential-unreadable');
    expect(tested.body.error.message).to.contain('SERVICE_SECRET_KEY');
    expect(fake.requests.length, 'no provider was asked').to.equal(asked);
    expect(h.logs.join('')).to.contain(record.id);
    await h.call('DELETE', `/api/v1/connections/${made.body.id}`);
  });

  it('keeps no verdict of a test that a change of credential overtook', async () => {
    // a code host that holds the identity call until told to answer
    let asked!: () => void;
    const reached = new Promise<void>((resolve) => (asked = resolve));
    let answer!: () => void;
    const released = new Promise<void>((resolve) => (answer = resolve));
    const slow = http.createServer((_req, res) => {
      asked();
      void released.then(() => {
        res.writeHead(200, { 'content-type': 'application/json', 'x-oauth-scopes': 'repo' });
        res.end(JSON.stringify({ login: 'old-bot', id: 2 }));
      });
    });
    await new Promise<void>((resolve) => slow.listen(0, '127.0.0.1', resolve));
    try {
      const base = `http://127.0.0.1:${(slow.address() as AddressInfo).port}`;
      const made = await create({ provider: 'codehost', name: 'overtaken', base_url: base, credential: 'old-token' });
      expect(made.status, made.text).to.equal(201);
      const testing = h.call<Body>('POST', `/api/v1/connections/${made.body.id}/test`);
      await reached;
      const patched = await h.call<Body>('PATCH', `/api/v1/connections/${made.body.id}`, { body: { credential: 'new-token' } });
      expect(patched.status, patched.text).to.equal(200);
      answer();
      const tested = await testing;
      // the answer is what was asked of the old credential; the connection keeps no verdict on the new one
      expect(tested.body).to.deep.include({ ok: true, identity: 'old-bot' });
      expect((await h.call<Body>('GET', `/api/v1/connections/${made.body.id}`)).body.last_test).to.equal(null);
    } finally {
      slow.closeAllConnections();
      slow.close();
    }
  });
});

describe('GitHub App connections', function () {
  let h: Harness;
  let fake: FakeProviders;
  const keys = generateKeyPairSync('rsa', { modulusLength: 2048 });
  const privateKey = keys.privateKey.export({ type: 'pkcs1', format: 'pem' }).toString();
  const app = { id: '123456', installationId: '987654', publicKey: keys.publicKey };

  before(async () => {
    fake = await startFakeProviders({ app });
    h = await startHarness({ env: { SERVICE_HTTP_ALLOW_PRIVATE: '1', SERVICE_SANDBOX_ALLOW_NETWORK: '1' } });
  });
  after(async () => {
    await h?.close();
    await fake?.close();
  });

  const create = (body: Body) => h.call<Body>('POST', '/api/v1/connections', { body });
  const appConnection = (name: string, credential = privateKey, settings: Body = { app_id: app.id, installation_id: app.installationId }) => ({
    provider: 'codehost',
    name,
    base_url: fake.github,
    credential,
    settings,
  });

  it('takes an App’s private key (the PEM as it is) with app_id and installation_id, and refuses (400) what does not make one', async () => {
    const made = await create(appConnection('app'));
    expect(made.status, made.text).to.equal(201);
    expect(made.body.settings).to.deep.equal({ app_id: app.id, installation_id: app.installationId });
    expect(made.text).to.not.contain('PRIVATE KEY');
    const refused: [Body, string][] = [
      [appConnection('no-installation', privateKey, { app_id: app.id }), '/body/settings/installation_id'],
      [appConnection('a-token', FAKE_TOKEN), '/body/credential'],
      [appConnection('a-public-key', keys.publicKey.export({ type: 'spki', format: 'pem' }).toString()), '/body/credential'],
      [{ ...appConnection('a-pem-alone'), settings: {} }, '/body/credential'],
      [{ ...appConnection('on-chat'), provider: 'chat', base_url: fake.slack }, '/body/settings/app_id'],
    ];
    for (const [body, at] of refused) {
      const res = await create(body);
      expect(res.status, `${body.name}: ${res.text}`).to.equal(400);
      expect(
        res.body.errors.map((e: Body) => e.path),
        body.name,
      ).to.include(at);
      expect(res.text).to.not.contain('PRIVATE KEY');
    }
    // a token connection that becomes an App's takes the private key with it, and only then
    const token = (await create({ provider: 'codehost', name: 'becomes-app', base_url: fake.github, credential: FAKE_TOKEN })).body.id;
    const patch = (body: Body) => h.call<Body>('PATCH', `/api/v1/connections/${token}`, { body });
    expect((await patch({ settings: { app_id: app.id, installation_id: app.installationId } })).status).to.equal(400);
    expect((await patch({ settings: { app_id: app.id, installation_id: app.installationId }, credential: privateKey })).status).to.equal(200);
    expect((await patch({ settings: {} })).status, 'and back: the token again').to.equal(400);
    // a control character outside a PEM block is still refused
    expect((await create({ provider: 'codehost', name: 'newline', base_url: fake.github, credential: `${FAKE_TOKEN}\n` })).status).to.equal(400);
  });

  it('tests, acts and checks out as the App’s installation: one token made and kept for every call, never shown', async () => {
    const minted = fake.appTokens.length;
    const id = (await create(appConnection('github'))).body.id;
    const tested = await h.call<Body>('POST', `/api/v1/connections/${id}/test`);
    expect(tested.body, tested.text).to.deep.include({ ok: true, identity: 'installation (2 repositories)', capabilities: ['installation'] });
    expect(fake.appTokens.length).to.equal(minted + 1);
    const installationToken = fake.appTokens.at(-1)!;
    const repo = makePullRequestRepo(h.config.dataDir, 7, { path: 'src/app.ts', content: 'export const x = 1;\n' });
    fake.serveRepo('acme/app', repo.bare);
    fs.mkdirSync(path.join(h.tenantDir(), 'app-checkout'), { recursive: true });
    const res = await h.call<Body>('POST', '/api/v1/autonomy/run', {
      body: {
        tools: ['codehost', 'shell'],
        workspace: 'app-checkout',
        connections: { codehost: 'github' },
        steps: [
          {
            tool: 'codehost',
            args: { action: 'create_check_run', repository: 'acme/app', head_sha: repo.head, name: 'gates', status: 'completed', conclusion: 'success' },
          },
          { tool: 'codehost', args: { action: 'comment', repository: 'acme/app', number: 7, body: 'Gates passed.' } },
          { tool: 'codehost', args: { action: 'checkout', repository: 'acme/app', ref: 'refs/pull/7/head' } },
          { tool: 'shell', args: { command: 'cat src/app.ts' } },
        ],
      },
    });
    expect(res.status, res.text).to.equal(202);
    const run = await finishedRun(h, res.body.run_id);
    expect(run.status, JSON.stringify(run.steps)).to.equal('succeeded');
    expect(run.steps[3].output.stdout).to.equal('export const x = 1;\n');
    // the token of the test is the one the run's calls and git used: made once, kept
    expect(fake.appTokens.length).to.equal(minted + 1);
    const calls = fake.requests.filter((r) => r.provider === 'github' && /check-runs|comments/.test(r.path));
    expect(calls.map((r) => r.authorization)).to.deep.equal([`token ${installationToken}`, `token ${installationToken}`]);
    const gitRequests = fake.requests.filter((r) => r.path.startsWith('/github/acme/app.git/'));
    expect(gitRequests.length).to.be.greaterThan(0);
    expect(gitRequests.every((r) => r.authorization === `Basic ${Buffer.from(`x-access-token:${installationToken}`).toString('base64')}`)).to.equal(true);
    // a code host that echoes what it was sent: the token made is masked in what the run keeps, as a token given is
    fake.echoCredential(true);
    try {
      const echoed = await h.call<Body>('POST', '/api/v1/autonomy/run', {
        body: {
          tools: ['codehost'],
          connections: { codehost: 'github' },
          steps: [{ tool: 'codehost', args: { action: 'comment', repository: 'acme/app', number: 7, body: 'again' } }],
        },
      });
      const done = await finishedRun(h, echoed.body.run_id);
      expect(done.status, JSON.stringify(done.steps)).to.equal('succeeded');
      expect(JSON.stringify(done.steps[0].output)).to.contain('token [credential]').and.not.contain(installationToken);
    } finally {
      fake.echoCredential(false);
    }
    // neither the key nor the token it made is in what the run kept or told
    const kept = JSON.stringify([run, await h.rt.events.after(`session:${run.session_id}`, '0-0')]);
    expect(kept).to.not.contain(installationToken).and.not.contain('PRIVATE KEY');
    expect(h.logs.join('')).to.not.contain(installationToken).and.not.contain('PRIVATE KEY');
  });

  it('never hands one connection the token another made: the same installation id on another host, its token still being made, gets its own', async () => {
    // another code host, slow to make its token, whose installation has the same id (ids are small numbers on each host)
    const seen: string[] = [];
    const slow = http.createServer((req, res) => {
      seen.push(`${req.method} ${req.url} ${req.headers.authorization}`);
      const send = (status: number, body: unknown) => res.writeHead(status, { 'content-type': 'application/json' }).end(JSON.stringify(body));
      if (req.method === 'POST' && req.url === `/app/installations/${app.installationId}/access_tokens`)
        return void setTimeout(() => send(201, { token: 'ghs_made_by_the_other_host', expires_at: new Date(Date.now() + 3_600_000).toISOString() }), 400);
      if (req.url === '/user') return send(403, { message: 'Resource not accessible by integration' });
      send(200, { total_count: 1, repositories: [] });
    });
    await new Promise<void>((r) => slow.listen(0, '127.0.0.1', r));
    try {
      const other = generateKeyPairSync('rsa', { modulusLength: 2048 }).privateKey.export({ type: 'pkcs1', format: 'pem' }).toString();
      const b = await h.call<Body>('POST', '/api/v1/connections', {
        key: KEYS.b,
        body: {
          ...appConnection('b-app', other, { app_id: '42', installation_id: app.installationId }),
          base_url: `http://127.0.0.1:${(slow.address() as AddressInfo).port}`,
        },
      });
      expect(b.status, b.text).to.equal(201);
      const a = (await create(appConnection('a-app'))).body.id;
      const ofB = h.call<Body>('POST', `/api/v1/connections/${b.body.id}/test`, { key: KEYS.b });
      await new Promise((r) => setTimeout(r, 100));
      const ofA = await h.call<Body>('POST', `/api/v1/connections/${a}/test`);
      expect(ofA.body, ofA.text).to.deep.include({ ok: true, identity: 'installation (2 repositories)' });
      expect((await ofB).body).to.deep.include({ ok: true, identity: 'installation (1 repositories)' });
      const mine = new Set(fake.appTokens);
      expect(
        seen.filter((l) => /ghs_/.test(l) && !l.includes('ghs_made_by_the_other_host')),
        'a token of the other host sent here',
      ).to.deep.equal([]);
      expect(seen.some((l) => [...mine].some((t) => l.includes(t)))).to.equal(false);
      expect(fake.requests.filter((r) => r.authorization.includes('ghs_made_by_the_other_host'))).to.deep.equal([]);
    } finally {
      await new Promise<void>((r) => slow.close(() => r()));
    }
  });

  it('makes an installation token shared by the calls that wait for it under none of theirs: one call canceled fails no other', async () => {
    const seen: string[] = [];
    const slow = http.createServer((req, res) => {
      seen.push(`${req.method} ${req.url}`);
      const send = (status: number, body: unknown) => res.writeHead(status, { 'content-type': 'application/json' }).end(JSON.stringify(body));
      if (req.method === 'POST' && req.url === `/app/installations/${app.installationId}/access_tokens`)
        return void setTimeout(() => send(201, { token: 'ghs_shared_by_two', expires_at: new Date(Date.now() + 3_600_000).toISOString() }), 800);
      if (req.method === 'POST' && req.url === '/repos/acme/app/issues/7/comments') return send(201, { id: 77, html_url: 'http://x/77' });
      send(404, { message: 'Not Found' });
    });
    await new Promise<void>((r) => slow.listen(0, '127.0.0.1', r));
    try {
      const key = generateKeyPairSync('rsa', { modulusLength: 2048 }).privateKey.export({ type: 'pkcs1', format: 'pem' }).toString();
      const made = await h.call<Body>('POST', '/api/v1/connections', {
        key: KEYS.b,
        body: {
          ...appConnection('shared-token', key, { app_id: '77', installation_id: app.installationId }),
          base_url: `http://127.0.0.1:${(slow.address() as AddressInfo).port}`,
        },
      });
      expect(made.status, made.text).to.equal(201);
      const comment = (signal?: AbortSignal) =>
        h.rt.engine.connections.act('tenant-b', 'codehost', 'shared-token', 'comment', { repository: 'acme/app', number: 7, body: 'hi' }, signal);
      const canceled = new AbortController();
      const first = comment(canceled.signal).then(
        () => 'done',
        () => 'canceled',
      );
      await new Promise((r) => setTimeout(r, 200));
      const second = comment();
      canceled.abort(new Error('its run was canceled'));
      expect(await first).to.equal('canceled');
      expect((await second).answer, 'the call that was not canceled').to.deep.include({ comment_id: 77 });
      expect(
        seen.filter((l) => l.includes('access_tokens')),
        'one token made',
      ).to.have.length(1);
    } finally {
      await new Promise<void>((r) => slow.close(() => r()));
    }
  });

  it('makes a new installation token when the host refuses the one kept, and waits out a refusal of one just made (its replicas)', async function () {
    this.timeout(30_000);
    const id = (await create(appConnection('refused'))).body.id;
    const test = async () => (await h.call<Body>('POST', `/api/v1/connections/${id}/test`)).body;
    expect(await test()).to.deep.include({ ok: true });
    const kept = fake.appTokens.at(-1)!;
    // revoked at the host (an installation suspended and resumed): once it is older than a moment, it is dropped
    fake.appTokens.splice(fake.appTokens.indexOf(kept), 1);
    await new Promise((r) => setTimeout(r, 5200));
    expect(await test()).to.deep.include({ ok: true });
    const made = fake.appTokens.at(-1)!;
    expect(made).to.not.equal(kept);
    // the host does not know a token it has just made yet: the same token, asked again a moment later
    fake.appTokens.splice(fake.appTokens.indexOf(made), 1);
    setTimeout(() => fake.appTokens.push(made), 800);
    const count = fake.appTokens.length;
    expect(await test()).to.deep.include({ ok: true });
    expect(fake.appTokens.length, 'no other token made').to.equal(count + 1);
    expect(fake.appTokens.at(-1)).to.equal(made);
  });

  it('says another App’s key is refused by the code host, with the provider’s code and no key in it', async () => {
    const other = generateKeyPairSync('rsa', { modulusLength: 2048 }).privateKey.export({ type: 'pkcs1', format: 'pem' }).toString();
    const id = (await create(appConnection('other-app', other))).body.id;
    const tested = await h.call<Body>('POST', `/api/v1/connections/${id}/test`);
    expect(tested.body).to.deep.include({ ok: false, identity: null });
    expect(tested.body.error.code, tested.body.error.message).to.equal('provider-auth-failed');
    expect(tested.text).to.not.contain('PRIVATE KEY');
  });
});

describe('action tools', function () {
  let h: Harness;
  let fake: FakeProviders;
  let model: ScriptedModel;

  before(async () => {
    fake = await startFakeProviders();
    // the one agent run below: it comments on the pull request, then ends
    model = await startScriptedModel([
      { tool_calls: [{ name: 'codehost', args: { action: 'comment', repository: 'acme/app', number: 9, body: 'LGTM once CI passes.' } }] },
      { content: 'Commented on #9.' },
    ]);
    h = await startHarness({
      env: { SERVICE_HTTP_ALLOW_PRIVATE: '1', SERVICE_SANDBOX_ALLOW_NETWORK: '1', SERVICE_AGENT_BASE_URL: model.url, SERVICE_AGENT_MODEL: 'scripted-1' },
    });
    const add = async (body: Body) => expect((await h.call<Body>('POST', '/api/v1/connections', { body })).status).to.equal(201);
    await add({ provider: 'codehost', name: 'github', base_url: fake.github, credential: FAKE_TOKEN });
    await add({ provider: 'chat', name: 'slack', base_url: fake.slack, credential: FAKE_TOKEN });
    await add({ provider: 'chat', name: 'slack-other', base_url: fake.slack, credential: 'another-token-0123456789' });
    await add({ provider: 'tracker', name: 'linear', base_url: fake.linear, credential: FAKE_TOKEN });
    await add({ provider: 'pager', name: 'pagerduty', base_url: fake.pager, credential: FAKE_TOKEN, settings: { from: 'oncall@acme.test' } });
    await add({ provider: 'email', name: 'smtp', base_url: fake.smtp, credential: FAKE_TOKEN, settings: { username: SMTP_USER, from: 'bot@acme.test' } });
  });
  after(async () => {
    await h?.close();
    await fake?.close();
    await model?.close();
  });

  const start = async (body: Body, key = KEYS.a) => {
    const res = await h.call<Body>('POST', '/api/v1/autonomy/run', { body, key });
    expect(res.status, res.text).to.equal(202);
    return finishedRun(h, res.body.run_id, key);
  };

  it('acts on every provider through its SDK as explicit steps: a review with line comments, a check run, a threaded reply, labels and priority, a note and an acknowledgement, an emailed reply', async () => {
    const run = await start({
      tools: ['codehost', 'chat', 'tracker', 'pager', 'email'],
      connections: { chat: 'slack' },
      steps: [
        {
          tool: 'codehost',
          args: {
            action: 'review',
            repository: 'acme/app',
            number: 7,
            body: 'Two things to fix.',
            event: 'REQUEST_CHANGES',
            comments: [
              { path: 'src/a.ts', line: 3, body: 'This can be null.' },
              { path: 'src/b.ts', line: 10, body: 'Missing test.' },
            ],
          },
        },
        {
          tool: 'codehost',
          args: {
            action: 'create_check_run',
            repository: 'acme/app',
            name: 'gate: unit-tests',
            head_sha: 'abc123',
            conclusion: 'failure',
            output: {
              title: '1 test failed',
              summary: 'see the annotation',
              annotations: [{ path: 'src/a.ts', start_line: 3, message: 'expected 1 to equal 2' }],
            },
          },
        },
        { tool: 'chat', args: { action: 'reply', channel: 'C42', thread_ts: '1700000000.000100', text: 'Done: 2 comments on #7.' } },
        { tool: 'tracker', args: { action: 'set_labels', issue_id: 'ISS-1', labels: ['bug', 'no-such-label'] } },
        { tool: 'tracker', args: { action: 'set_priority', issue_id: 'ISS-1', priority: 2 } },
        { tool: 'tracker', args: { action: 'comment', issue_id: 'ISS-1', body: 'Triaged as a bug.' } },
        { tool: 'pager', args: { action: 'add_note', incident_id: 'P123', content: 'Likely the deploy at 10:02.' } },
        { tool: 'pager', args: { action: 'acknowledge', incident_id: 'P123' } },
        {
          tool: 'email',
          args: { action: 'reply', to: 'alice@example.com', subject: 'Broken login', in_reply_to: '<m1@example.com>', text: 'Filed as tsk_1.' },
        },
      ],
    });
    expect(run.status, JSON.stringify(run.error)).to.equal('succeeded');
    expect(run.steps.map((s: Body) => s.status)).to.deep.equal(Array(9).fill('succeeded'));

    const review = fake.requests.find((r) => r.path === '/github/repos/acme/app/pulls/7/reviews')!;
    expect(review.body).to.deep.include({ body: 'Two things to fix.', event: 'REQUEST_CHANGES' });
    expect(review.body.comments).to.deep.equal([
      { path: 'src/a.ts', line: 3, side: 'RIGHT', body: 'This can be null.' },
      { path: 'src/b.ts', line: 10, side: 'RIGHT', body: 'Missing test.' },
    ]);
    expect(run.steps[0].output).to.deep.include({ comments: 2 });
    expect(run.steps[0].output.review_id).to.be.a('number');
    const check = fake.requests.find((r) => r.path === '/github/repos/acme/app/check-runs')!;
    expect(check.body).to.deep.include({ name: 'gate: unit-tests', head_sha: 'abc123', status: 'completed', conclusion: 'failure' });
    expect(check.body.output.annotations[0]).to.deep.include({ path: 'src/a.ts', start_line: 3, end_line: 3, annotation_level: 'failure' });

    const slack = fake.requests.find((r) => r.path === '/slack/api/chat.postMessage')!;
    expect(slack.body).to.deep.include({ channel: 'C42', thread_ts: '1700000000.000100', text: 'Done: 2 comments on #7.' });
    expect(slack.authorization, 'the connection the run named').to.equal(`Bearer ${FAKE_TOKEN}`);

    const linear = fake.requests.filter((r) => r.provider === 'linear').map((r) => r.body.variables);
    expect(linear.find((v) => v.input?.addedLabelIds)).to.deep.equal({ id: 'ISS-1', input: { addedLabelIds: ['label-bug'] } });
    expect(linear.find((v) => v.input?.priority)).to.deep.equal({ id: 'ISS-1', input: { priority: 2 } });
    expect(run.steps[3].output).to.deep.include({ labels: ['bug'], unknown_labels: ['no-such-label'] });
    expect(run.steps[5].output.comment_id).to.match(/^comment-/);

    const note = fake.requests.find((r) => r.path === '/pager/incidents/P123/notes')!;
    expect(note.body).to.deep.equal({ note: { content: 'Likely the deploy at 10:02.' } });
    expect(note.headers.from).to.equal('oncall@acme.test');
    expect(fake.requests.find((r) => r.method === 'PUT' && r.path === '/pager/incidents/P123')!.body.incident.status).to.equal('acknowledged');

    expect(fake.mails).to.have.length(1);
    expect(fake.mails[0]).to.deep.include({ from: 'bot@acme.test', to: ['alice@example.com'] });
    expect(fake.mails[0]!.data)
      .to.match(/^In-Reply-To: <m1@example.com>/m)
      .and.match(/^Subject: Re: Broken login/m);

    // each call and its answer are events of the run, and no event carries the credential
    const events = await h.rt.events.after(`session:${run.session_id}`, '0-0');
    const answers = events.filter((e) => e.type === 'provider.answer').map((e) => e.data as Body);
    expect(answers.map((a) => `${a.provider}.${a.action}`)).to.deep.equal([
      'codehost.review',
      'codehost.create_check_run',
      'chat.reply',
      'tracker.set_labels',
      'tracker.set_priority',
      'tracker.comment',
      'pager.add_note',
      'pager.acknowledge',
      'email.reply',
    ]);
    expect(answers.every((a) => a.ok && typeof a.connection_id === 'string')).to.equal(true);
    expect(answers[0]!.answer.url).to.match(/^https:\/\/github\.example\//);
    expect(events.filter((e) => e.type === 'provider.request')).to.have.length(9);
    expect(JSON.stringify(events)).not.to.contain(FAKE_TOKEN);
    expect(h.logs.join('')).not.to.contain(FAKE_TOKEN);
  });

  it('masks the credential a provider echoes in its answer: in no step output, event, test answer or connection kept', async () => {
    const slack = (await h.call<Body>('GET', '/api/v1/connections?provider=chat')).body.data.find((c: Body) => c.name === 'slack');
    fake.echoCredential(true);
    try {
      const run = await start({
        tools: ['chat'],
        connections: { chat: 'slack' },
        steps: [{ tool: 'chat', args: { action: 'post', channel: 'C1', text: 'hi' } }],
      });
      expect(run.status, JSON.stringify(run.steps[0])).to.equal('succeeded');
      expect(run.steps[0].output).to.deep.include({ channel: 'Bearer [credential]', ts: '[credential]' });
      const events = await h.rt.events.after(`session:${run.session_id}`, '0-0');
      expect(events.find((e) => e.type === 'provider.answer')!.data).to.deep.include({
        answer: { channel: 'Bearer [credential]', ts: '[credential]', thread_ts: null },
      });
      const tested = await h.call<Body>('POST', `/api/v1/connections/${slack.id}/test`);
      expect(tested.body).to.deep.include({ ok: true, identity: 'Bearer [credential] in [credential]', capabilities: ['chat:write', '[credential]'] });
      const kept = await h.call<Body>('GET', `/api/v1/connections/${slack.id}`);
      expect(kept.body.last_test).to.deep.include({ identity: 'Bearer [credential] in [credential]' });
      for (const text of [JSON.stringify(run), JSON.stringify(events), tested.text, kept.text]) expect(text).not.to.contain(FAKE_TOKEN.slice(0, 12));
    } finally {
      fake.echoCredential(false);
    }
  });

  it('masks a credential stored before credentials were checked from a step whose library quotes it in its error', async () => {
    const secret = 'SECRETPART_abcdefgh\nX-Evil: 1';
    await storedBefore(h, { provider: 'pager', name: 'stored-nl', base_url: fake.pager, settings: { from: 'a@b.test' } }, secret);
    const ended = await start({
      tools: ['pager'],
      steps: [{ tool: 'pager', args: { action: 'add_note', connection: 'stored-nl', incident_id: 'P1', content: 'hi' } }],
    });
    expect(ended.status).to.equal('failed');
    const events = await h.rt.events.after(`session:${ended.session_id}`, '0-0');
    for (const text of [JSON.stringify(ended), JSON.stringify(events), h.logs.join('')]) expect(text).not.to.contain('abcdefgh');
    expect(JSON.stringify(ended)).to.contain('[credential]');
  });

  it('fails a run at once, before any step, when a provider it acts on has no connection, naming the provider', async () => {
    const before = fake.requests.length;
    const ambiguous = await start({ tools: ['chat'], steps: [{ tool: 'chat', args: { action: 'post', channel: 'C1', text: 'hi' } }] });
    expect(ambiguous.status).to.equal('failed');
    expect(ambiguous.error.code).to.equal('connection-missing');
    expect(ambiguous.error.message).to.contain('chat').and.contain('2 chat connections');
    expect(
      ambiguous.steps.map((s: Body) => s.status),
      'no step ran',
    ).to.deep.equal(['skipped']);
    const named = await start({
      tools: ['tracker'],
      connections: { tracker: 'gone' },
      steps: [{ tool: 'tracker', args: { action: 'comment', issue_id: 'X', body: 'b' } }],
    });
    expect(named.error).to.deep.include({ code: 'connection-missing' });
    expect(named.error.message).to.contain('no tracker connection named gone');
    // tenant B has none: A's are not B's
    const other = await start(
      { tools: ['codehost'], steps: [{ tool: 'codehost', args: { action: 'comment', repository: 'a/b', number: 1, body: 'x' } }] },
      KEYS.b,
    );
    expect(other.error.code).to.equal('connection-missing');
    // not even named by their id or name, in the run or in the step
    const aGithub = (await h.call<Body>('GET', '/api/v1/connections?provider=codehost')).body.data[0];
    const comment = { action: 'comment', repository: 'a/b', number: 1, body: 'x' };
    for (const named of [aGithub.id, aGithub.name]) {
      const inRun = await start({ tools: ['codehost'], connections: { codehost: named }, steps: [{ tool: 'codehost', args: comment }] }, KEYS.b);
      expect(inRun.error.code, named).to.equal('connection-missing');
      const inStep = await start({ tools: ['codehost'], steps: [{ tool: 'codehost', args: { ...comment, connection: named } }] }, KEYS.b);
      expect(inStep.steps[0].error?.code ?? inStep.error.code, named).to.equal('connection-missing');
    }
    expect(fake.requests.length, 'nothing reached a provider').to.equal(before);
    // a step that names its own connection is not ambiguous: the check before the first step reads it too
    const stepNamed = await start({
      tools: ['chat'],
      steps: [{ tool: 'chat', args: { action: 'post', channel: 'C1', text: 'hi', connection: 'slack-other' } }],
    });
    expect(stepNamed.error?.code, JSON.stringify(stepNamed.error)).to.not.equal('connection-missing');
    expect(stepNamed.steps[0].status, 'the step ran').to.not.equal('skipped');
    // the check reads what each step acts through, as the step does: its own name over the run's
    const ownOverRun = await start({
      tools: ['chat'],
      connections: { chat: 'gone' },
      steps: [{ tool: 'chat', args: { action: 'post', channel: 'C1', text: 'hi', connection: 'slack-other' } }],
    });
    expect(ownOverRun.error?.code, JSON.stringify(ownOverRun.error)).to.not.equal('connection-missing');
    expect(ownOverRun.steps[0].status, 'the step ran').to.not.equal('skipped');
    const before2 = fake.requests.length;
    const goneInStep = await start({
      tools: ['chat'],
      connections: { chat: 'slack-other' },
      steps: [
        { tool: 'chat', args: { action: 'post', channel: 'C1', text: 'first' } },
        { tool: 'chat', args: { action: 'post', channel: 'C1', text: 'second', connection: 'gone' } },
      ],
    });
    expect(goneInStep.error).to.deep.include({ code: 'connection-missing' });
    expect(goneInStep.error.message).to.contain('no chat connection named gone');
    expect(
      goneInStep.steps.map((s: Body) => s.status),
      'no step ran, not even the first, whose connection is there',
    ).to.deep.equal(['skipped', 'skipped']);
    expect(fake.requests.length, 'nothing reached the provider').to.equal(before2);
  });

  it('finds a connection by its name when that name is the id of another provider’s connection of the tenant', async () => {
    const create = (body: Body) => h.call<Body>('POST', '/api/v1/connections', { body });
    const codehost = await create({ provider: 'codehost', name: 'by-id-host', base_url: fake.github, credential: FAKE_TOKEN });
    expect(codehost.status, codehost.text).to.equal(201);
    const chat = await create({ provider: 'chat', name: codehost.body.id, base_url: fake.slack, credential: 'chat-token-named-like-an-id' });
    expect(chat.status, chat.text).to.equal(201);
    try {
      expect((await h.rt.engine.connections.resolve('tenant-a', 'chat', codehost.body.id)).id).to.equal(chat.body.id);
      expect((await h.rt.engine.connections.resolve('tenant-a', 'codehost', codehost.body.id)).id).to.equal(codehost.body.id);
    } finally {
      for (const id of [chat.body.id, codehost.body.id]) await h.call('DELETE', `/api/v1/connections/${id}`);
    }
  });

  it('acts through the connection an automation names, kept on the automation and on each of its runs', async () => {
    const made = await h.call<Body>('POST', '/api/v1/automations', {
      body: {
        name: 'announce',
        tool_allowlist: ['chat'],
        connections: { chat: 'slack-other' },
        steps: [{ tool: 'chat', args: { action: 'post', channel: 'C7', text: 'deployed' } }],
      },
    });
    expect(made.status, made.text).to.equal(201);
    expect(made.body.connections).to.deep.equal({ chat: 'slack-other' });
    const fired = await h.call<Body>('POST', '/api/v1/automations/run', { body: { automation_id: made.body.id } });
    expect(fired.status, fired.text).to.equal(202);
    const run = await finishedRun(h, fired.body.run_id);
    expect(run.connections).to.deep.equal({ chat: 'slack-other' });
    // the fake refuses that token: the run went through the named connection, and says the provider refused it
    expect(run.steps[0].error.code).to.equal('provider-auth-failed');
    expect(fake.requests.at(-1)!.authorization).to.equal('Bearer another-token-0123456789');
    const patched = await h.call<Body>('PATCH', `/api/v1/automations/${made.body.id}`, { body: { connections: { chat: 'slack' } } });
    expect(patched.body.connections).to.deep.equal({ chat: 'slack' });
    const again = await finishedRun(h, (await h.call<Body>('POST', '/api/v1/automations/run', { body: { automation_id: made.body.id } })).body.run_id);
    expect(again.status).to.equal('succeeded');
  });

  it('offers the action tools to the agent with their schemas, and the agent’s call acts on the provider', async () => {
    const run = await start({ goal: 'Review pull request 9 of acme/app.', tools: ['codehost', 'read_file'] });
    expect(run.status, JSON.stringify(run.error)).to.equal('succeeded');
    const offered = model.requests[0]!.body.tools.map((t: Body) => t.function);
    const codehost = offered.find((f: Body) => f.name === 'codehost');
    expect(codehost.parameters.properties.action.enum).to.deep.equal([
      'checkout',
      'comment',
      'review',
      'create_check_run',
      'update_check_run',
      'open_pull_request',
    ]);
    expect(offered.map((f: Body) => f.name)).not.to.include('chat');
    const comment = fake.requests.find((r) => r.path === '/github/repos/acme/app/issues/9/comments')!;
    expect(comment.body).to.deep.equal({ body: 'LGTM once CI passes.' });
    expect(run.steps[0]).to.deep.include({ tool: 'codehost', source: 'agent', status: 'succeeded' });
  });

  it('checks out a pull request’s head into the workspace in the sandbox, the token sent to the code host only in git’s environment', async () => {
    const repo = makePullRequestRepo(h.config.dataDir, 7, { path: 'src/app.ts', content: 'export const x = 1;\n' });
    fake.serveRepo('acme/app', repo.bare);
    fs.mkdirSync(path.join(h.tenantDir(), 'checkout'));
    const run = await start({
      tools: ['codehost', 'shell'],
      workspace: 'checkout',
      steps: [
        { tool: 'codehost', args: { action: 'checkout', repository: 'acme/app', ref: 'refs/pull/7/head' } },
        { tool: 'shell', args: { command: 'cat src/app.ts && git log --format=%s -1' } },
      ],
    });
    expect(run.status, JSON.stringify(run.steps?.[0])).to.equal('succeeded');
    expect(run.steps[0].output).to.deep.include({ head_sha: repo.head, repository: 'acme/app', ref: 'refs/pull/7/head' });
    expect(run.steps[1].output.stdout).to.equal('export const x = 1;\npull request 7\n');
    const gitRequests = fake.requests.filter((r) => r.path.startsWith('/github/acme/app.git/'));
    expect(gitRequests.length).to.be.greaterThan(0);
    expect(gitRequests.every((r) => r.authorization === `Basic ${Buffer.from(`x-access-token:${FAKE_TOKEN}`).toString('base64')}`)).to.equal(true);
    const events = await h.rt.events.after(`session:${run.session_id}`, '0-0');
    expect(JSON.stringify(events))
      .not.to.contain(FAKE_TOKEN)
      .and.not.to.contain(Buffer.from(`x-access-token:${FAKE_TOKEN}`).toString('base64'));
    // the checkout was the run's own folder, removed at its end; the workspace it named is as it was
    expect(fs.existsSync(path.join(h.tenantDir(), '.checkouts', run.id))).to.equal(false);
    expect(fs.readdirSync(path.join(h.tenantDir(), 'checkout'))).to.deep.equal([]);
    expect(JSON.stringify(run.steps), 'no step output carries the token').not.to.contain(FAKE_TOKEN);

    // a redirect is never followed: only the code host's own address was checked
    fake.redirectRepo('acme/moved', 'acme/app');
    const before = fake.requests.length;
    const moved = await start({
      tools: ['codehost'],
      workspace: 'checkout',
      steps: [{ tool: 'codehost', args: { action: 'checkout', repository: 'acme/moved', ref: 'refs/pull/7/head' } }],
    });
    expect(moved.status).to.equal('failed');
    expect(moved.steps[0].error.code).to.equal('checkout-failed');
    const after = fake.requests.slice(before).map((r) => r.path);
    expect(after.some((p) => p.startsWith('/github/acme/moved.git/'))).to.equal(true);
    expect(after.filter((p) => p.startsWith('/github/acme/app.git/'))).to.deep.equal([]);

    // a host whose error quotes what it was sent gives the token back, in clear and in base64: git's output is
    // masked where it is kept (the step's output) and where it is streamed (the run's events)
    fake.echoAuthRepo('acme/echo');
    const echoed = await start({
      tools: ['codehost'],
      workspace: 'checkout',
      steps: [{ tool: 'codehost', args: { action: 'checkout', repository: 'acme/echo', ref: 'refs/pull/7/head' } }],
    });
    expect(echoed.steps[0].error.code).to.equal('checkout-failed');
    expect(echoed.steps[0].output.stderr).to.contain('access denied for x-access-token:[credential] ([credential])');
    const basic = Buffer.from(`x-access-token:${FAKE_TOKEN}`).toString('base64');
    const kept = JSON.stringify([echoed.steps, await h.rt.events.after(`session:${echoed.session_id}`, '0-0')]);
    expect(kept).to.not.contain(FAKE_TOKEN.slice(0, 12)).and.not.contain(basic.slice(0, 16));
  });

  it('checks out again over what a step left read-only, in the run’s folder and in the checkout area', async () => {
    const repo = makePullRequestRepo(fs.mkdtempSync(path.join(h.config.dataDir, 'readonly-')), 10, { path: 'src/d.ts', content: 'export const d = 4;\n' });
    fake.serveRepo('acme/readonly', repo.bare);
    const checkout = { tool: 'codehost', args: { action: 'checkout', repository: 'acme/readonly', ref: 'refs/pull/10/head' } };
    // a build's read-only output in the checkout, then the same checkout again (the sandbox's user, unlike the
    // service's, has no power over permissions: the folder could not be made again)
    const run = await start({
      tools: ['codehost', 'shell'],
      steps: [checkout, { tool: 'shell', args: { command: 'mkdir -p build/out && touch build/out/a && chmod -R a-w build' } }, checkout],
    });
    expect(run.status, JSON.stringify(run.steps.map((s: Body) => [s.status, s.error]))).to.equal('succeeded');
    // the checkout area itself made read-only by a step of another run
    const locked = await start({ tools: ['shell'], steps: [{ tool: 'shell', args: { command: 'mkdir -p .checkouts && chmod a-w .checkouts' } }] });
    expect(locked.status).to.equal('succeeded');
    const after = await start({ tools: ['codehost'], steps: [checkout] });
    expect(after.status, JSON.stringify(after.steps)).to.equal('succeeded');
  });

  it('removes a run’s checkout at its end in the sandbox, its tenant’s root bound (by path, as the service, a folder swapped for a link mid-removal led it elsewhere)', async () => {
    const repo = makePullRequestRepo(fs.mkdtempSync(path.join(h.config.dataDir, 'cleanup-')), 11, { path: 'src/e.ts', content: 'export const e = 5;\n' });
    fake.serveRepo('acme/cleanup', repo.bare);
    const spawn = h.rt.sandbox.spawn.bind(h.rt.sandbox);
    const removals: { argv: string[]; workspace: string }[] = [];
    h.rt.sandbox.spawn = (argv, o) => {
      if (argv.includes('remove-in-sandbox')) removals.push({ argv, workspace: o.workspace });
      return spawn(argv, o);
    };
    try {
      const run = await start({
        tools: ['codehost', 'shell'],
        steps: [
          { tool: 'codehost', args: { action: 'checkout', repository: 'acme/cleanup', ref: 'refs/pull/11/head' } },
          // what a build leaves read-only is removed too
          { tool: 'shell', args: { command: 'mkdir -p build/out && touch build/out/a && chmod -R a-w build' } },
        ],
      });
      expect(run.status, JSON.stringify(run.steps.map((s: Body) => [s.status, s.error]))).to.equal('succeeded');
      expect(fs.existsSync(path.join(h.tenantDir(), '.checkouts', run.id)), 'the checkout is gone').to.equal(false);
      expect(removals.map((r) => [r.workspace, r.argv.at(-1)])).to.deep.equal([[fs.realpathSync(h.tenantDir()), run.id]]);
    } finally {
      h.rt.sandbox.spawn = spawn;
    }
  });

  it('puts a checkout’s git folder in place only in its own folder: one another step swapped for a link to another tenant’s repository is refused, and that repository left as it was', async () => {
    const repo = makePullRequestRepo(fs.mkdtempSync(path.join(h.config.dataDir, 'swapped-')), 9, { path: 'src/c.ts', content: 'export const c = 3;\n' });
    fake.serveRepo('acme/swapped', repo.bare);
    // tenant-b's repository, with a mark of its own in its .git
    const victim = path.join(h.tenantDir('tenant-b'), 'repo');
    fs.mkdirSync(victim, { recursive: true });
    execFileSync('sh', ['-c', 'git init -q && git -c user.name=b -c user.email=b@b commit -q --allow-empty -m mine && touch .git/MARK'], { cwd: victim });
    const head = execFileSync('git', ['rev-parse', 'HEAD'], { cwd: victim, encoding: 'utf8' });
    // another step of tenant-a swaps the checkout folder for a link to it the moment its git is done (the race, won every time)
    const spawn = h.rt.sandbox.spawn.bind(h.rt.sandbox);
    let swapped = false;
    h.rt.sandbox.spawn = (argv, o) => {
      const proc = spawn(argv, o);
      if (argv.some((a) => a.includes('git fetch')))
        proc.child.once('exit', () => {
          fs.renameSync(o.workspace, `${o.workspace}.real`);
          fs.symlinkSync(path.relative(path.dirname(o.workspace), victim), o.workspace);
          swapped = true;
        });
      return proc;
    };
    try {
      const run = await start({
        tools: ['codehost'],
        steps: [{ tool: 'codehost', args: { action: 'checkout', repository: 'acme/swapped', ref: 'refs/pull/9/head' } }],
      });
      expect(swapped).to.equal(true);
      expect(run.status, JSON.stringify(run.steps)).to.equal('failed');
    } finally {
      h.rt.sandbox.spawn = spawn;
    }
    expect(fs.existsSync(path.join(victim, '.git', 'MARK')), 'tenant-b’s .git is its own').to.equal(true);
    expect(execFileSync('git', ['rev-parse', 'HEAD'], { cwd: victim, encoding: 'utf8' })).to.equal(head);
  });

  it('runs the networked, token-bearing git of a checkout on a git folder of its own: config another run put in the checkout folder is not obeyed', async () => {
    const repo = makePullRequestRepo(fs.mkdtempSync(path.join(h.config.dataDir, 'planted-')), 8, { path: 'src/b.ts', content: 'export const b = 2;\n' });
    fake.serveRepo('acme/planted', repo.bare);
    // another run of the tenant plants a hook the moment the checkout folder appears (as a step looping over .checkouts/ would)
    const area = path.join(h.tenantDir(), '.checkouts');
    fs.mkdirSync(area, { recursive: true });
    let planted = 0;
    const plant = (dir: string) => {
      try {
        fs.mkdirSync(path.join(dir, '.git', 'h'), { recursive: true });
        fs.writeFileSync(path.join(dir, '.git', 'h', 'post-checkout'), `#!/bin/sh\ntouch /workspace/HOOK_RAN\n`, { mode: 0o755 });
        fs.writeFileSync(path.join(dir, '.git', 'config'), '[core]\n\thooksPath = /workspace/.git/h\n');
        planted++;
      } catch {
        // the folder was made again meanwhile: the next event plants anew
      }
    };
    const watcher = fs.watch(area, (_event, name) => name && !name.startsWith('.') && plant(path.join(area, name)));
    try {
      const run = await start({
        tools: ['codehost', 'shell'],
        steps: [
          { tool: 'codehost', args: { action: 'checkout', repository: 'acme/planted', ref: 'refs/pull/8/head' } },
          { tool: 'shell', args: { command: 'ls -a; git log --format=%s -1' } },
        ],
      });
      expect(run.status, JSON.stringify(run.steps)).to.equal('succeeded');
      expect(planted, 'the plant was made').to.be.greaterThan(0);
      expect(run.steps[1].output.stdout).to.contain('pull request 8');
      expect(run.steps[1].output.stdout, 'the planted hook did not run').to.not.contain('HOOK_RAN');
    } finally {
      watcher.close();
    }
  });

  it('fetches a checkout only from the addresses its check found: a name whose DNS answer changes after the check (rebinding) takes neither git nor the token to loopback', async function () {
    this.timeout(60_000);
    // the code host's git server, on loopback only
    const reached: { path: string; authorization: string }[] = [];
    const internal = http.createServer((req, res) => {
      reached.push({ path: req.url ?? '', authorization: String(req.headers.authorization ?? '') });
      res.writeHead(404).end();
    });
    await new Promise<void>((r) => internal.listen(0, '127.0.0.1', r));
    const port = (internal.address() as AddressInfo).port;
    // the check is answered a public address for the name; git's own lookup (the system's, in the sandbox) says loopback
    const checked = dns.promises.lookup;
    dns.promises.lookup = (async (host: string, options: object) =>
      host === 'localhost' ? [{ address: '93.184.216.34', family: 4 }] : checked(host, options as never)) as typeof checked;
    // the operator's rule: network for checkouts, private addresses out
    const strict = await startHarness({ env: { SERVICE_SANDBOX_ALLOW_NETWORK: '1' } });
    try {
      const made = await strict.call<Body>('POST', '/api/v1/connections', {
        body: { provider: 'codehost', name: 'rebound', base_url: `http://localhost:${port}/api/v3`, credential: FAKE_TOKEN },
      });
      expect(made.status, made.text).to.equal(201);
      const started = await strict.call<Body>('POST', '/api/v1/autonomy/run', {
        body: { tools: ['codehost'], steps: [{ tool: 'codehost', args: { action: 'checkout', repository: 'acme/shop', ref: 'main' } }] },
      });
      expect(started.status, started.text).to.equal(202);
      const id = started.body.run_id;
      // the public address may not answer where this runs (a dropped SYN): the run is stopped once git had the time to reach loopback
      const run = await finishedRun(strict, id).catch(async () => {
        await strict.call('POST', `/api/v1/runs/${id}/cancel`);
        return finishedRun(strict, id);
      });
      expect(run.status, JSON.stringify(run.steps)).to.not.equal('succeeded');
      expect(reached, 'git reached the loopback server').to.deep.equal([]);
    } finally {
      dns.promises.lookup = checked;
      await strict.close();
      internal.closeAllConnections();
      internal.close();
    }
  });

  it('opens a pull request from a vibe run’s diff: the base files patched, committed on a new branch, the pull request opened', async () => {
    const repo = path.join(h.tenantDir(), 'vibe');
    fs.mkdirSync(path.join(repo, 'src'), { recursive: true });
    const base = { 'src/app.mjs': 'export const answer = 41;\nexport const name = "app";\n', 'README.md': '# app\n', 'run.sh': '#!/bin/sh\necho 41\n' };
    for (const [file, content] of Object.entries(base)) fs.writeFileSync(path.join(repo, file), content);
    execFileSync('sh', ['-c', 'git init -q && git add -A && git -c user.name=t -c user.email=t@t commit -qm init'], { cwd: repo });
    fake.setFiles('acme/app', base);
    const res = await h.call<Body>('POST', '/api/v1/autonomy/vibe/run', {
      body: {
        workspace: 'vibe',
        steps: [
          { tool: 'write_file', args: { path: 'src/app.mjs', content: 'export const answer = 42;\nexport const name = "app";\n' } },
          { tool: 'write_file', args: { path: 'docs/answer.md', content: 'The answer is 42.\n' } },
          { tool: 'write_file', args: { path: 'run.sh', content: '#!/bin/sh\necho 42\n' } },
          // an empty file made, a file renamed as it was, a new script made executable
          {
            tool: 'shell',
            args: {
              command: "mkdir pkg && touch pkg/__init__.py && git mv README.md README.txt && printf '#!/bin/sh\\necho hi\\n' > deploy.sh && chmod +x deploy.sh",
            },
          },
        ],
      },
    });
    const vibe = await finishedRun(h, res.body.run_id);
    expect(vibe.status, JSON.stringify([vibe.error, vibe.steps])).to.equal('succeeded');
    // the base files read a few at once, not one after another (300 of them at 100 ms each were past the action's 30 s)
    fake.contents.delayMs = 300;
    fake.contents.mostAtOnce = 0;
    const run = await start({
      tools: ['codehost'],
      steps: [
        {
          tool: 'codehost',
          args: {
            action: 'open_pull_request',
            repository: 'acme/app',
            run_id: vibe.id,
            head: 'answer-42',
            title: 'The answer is 42',
            body: 'From a vibe run.',
          },
        },
      ],
    });
    fake.contents.delayMs = 0;
    expect(run.status, JSON.stringify([run.error, run.steps[0]])).to.equal('succeeded');
    expect(fake.contents.mostAtOnce, 'the base files read at once (src/app.mjs, run.sh, README.md)').to.equal(3);
    const tree = fake.requests.find((r) => r.path === '/github/repos/acme/app/git/trees')!.body;
    expect(tree.base_tree).to.equal('base-tree');
    expect(tree.tree).to.deep.include.members([
      { path: 'src/app.mjs', mode: '100644', type: 'blob', content: 'export const answer = 42;\nexport const name = "app";\n' },
      { path: 'docs/answer.md', mode: '100644', type: 'blob', content: 'The answer is 42.\n' },
      { path: 'run.sh', mode: '100755', type: 'blob', content: '#!/bin/sh\necho 42\n' },
      { path: 'pkg/__init__.py', mode: '100644', type: 'blob', content: '' },
      { path: 'README.txt', mode: '100644', type: 'blob', content: '# app\n' },
      { path: 'README.md', mode: '100644', type: 'blob', sha: null },
      { path: 'deploy.sh', mode: '100755', type: 'blob', content: '#!/bin/sh\necho hi\n' },
    ]);
    const commit = fake.requests.find((r) => r.path === '/github/repos/acme/app/git/commits' && r.method === 'POST')!.body;
    expect(commit).to.deep.include({ message: 'The answer is 42', parents: ['base-commit'] });
    expect(fake.requests.find((r) => r.path === '/github/repos/acme/app/git/refs')!.body.ref).to.equal('refs/heads/answer-42');
    const pr = fake.requests.find((r) => r.path === '/github/repos/acme/app/pulls' && r.method === 'POST')!.body;
    expect(pr).to.deep.include({ title: 'The answer is 42', head: 'answer-42', base: 'main', body: 'From a vibe run.' });
    expect(run.steps[0].output).to.deep.include({ head: 'answer-42', base: 'main', files: 7 });
    // the base's modes read folder by folder, of the changed files only: never the whole tree at once
    expect(fake.requests.filter((r) => r.path.includes('/git/trees/') && r.path.includes('recursive'))).to.deep.equal([]);
    expect(fake.treesListed.slice(-2), 'the root and src/, once each').to.deep.equal(['', 'src']);
    // another tenant's vibe run is not there for it; a run of another kind neither
    const foreign = await start(
      {
        tools: ['codehost'],
        steps: [{ tool: 'codehost', args: { action: 'open_pull_request', repository: 'acme/app', run_id: vibe.id, head: 'x', title: 'x' } }],
      },
      KEYS.b,
    );
    expect(foreign.error.code).to.equal('connection-missing');
    const notVibe = await start({
      tools: ['codehost'],
      steps: [{ tool: 'codehost', args: { action: 'open_pull_request', repository: 'acme/app', run_id: run.id, head: 'x', title: 'x' } }],
    });
    expect(notVibe.steps[0].error).to.deep.include({ code: 'invalid-args' });
    expect(notVibe.steps[0].error.message).to.contain(`no vibe run ${run.id}`);
  });

  it('refuses a pull request whose binary files hold over 64 MB together once applied (a diff of 1 MB may inflate to 100 MB a file)', async () => {
    fake.setFiles('acme/zeros', { 'README.md': 'zeros\n' });
    const zeros = Buffer.alloc(40 * 1024 * 1024);
    const part = (name: string) =>
      `diff --git a/${name} b/${name}\nnew file mode 100644\nindex ${'0'.repeat(40)}..${gitBlobSha(zeros)}\n${binaryPatch(Buffer.alloc(0), zeros)}`;
    const diff = part('a.bin') + part('b.bin');
    expect(diff.length, 'the diff itself is small').to.be.below(200 * 1024);
    const access = { token: FAKE_TOKEN, baseUrl: fake.github, settings: {}, allowPrivate: true };
    const opened = ACTIONS.codehost.open_pull_request!(
      access,
      { repository: 'acme/zeros', base: 'main', head: 'zeros', title: 'zeros', run_id: 'run_x' },
      {
        vibeDiff: async () => diff,
      },
    );
    await opened.then(
      () => expect.fail('opened'),
      (err: Error) => expect(err.message).to.contain('hold over 64 MB together'),
    );
  });

  it('carries files that are not UTF-8 text byte for byte: git’s binary patch in the vibe run’s diff, blobs of their exact bytes in the pull request', async () => {
    const repo = path.join(h.tenantDir(), 'vibe-bytes');
    fs.mkdirSync(repo, { recursive: true });
    // a binary file big enough that git sends its change as a delta against the base, and a Latin-1 text
    let seed = 7;
    const noise = Buffer.from(Array.from({ length: 4096 }, () => (seed = (seed * 1103515245 + 12345) % 2 ** 31) >> 23));
    const base = { 'blob.bin': noise, 'old.txt': Buffer.from('caf\xe9\n', 'latin1'), 'app.txt': 'one\n' };
    for (const [file, content] of Object.entries(base)) fs.writeFileSync(path.join(repo, file), content);
    execFileSync('sh', ['-c', 'git init -q && git add -A && git -c user.name=t -c user.email=t@t commit -qm init'], { cwd: repo });
    fake.setFiles('acme/bytes', base);
    const expected: Record<string, Buffer> = {
      'logo.png': Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x00, 0xff, 0xfe, 0x0d, 0x0a]),
      'latin1.txt': Buffer.from([0xe9, 0x74, 0xe9]),
      'old.txt': Buffer.from('caf\xe9 cr\xe8me\n', 'latin1'),
      'blob.bin': Buffer.concat([noise.subarray(0, 100), Buffer.from('XYZ'), noise.subarray(103)]),
    };
    const res = await h.call<Body>('POST', '/api/v1/autonomy/vibe/run', {
      body: {
        workspace: 'vibe-bytes',
        steps: [
          {
            tool: 'shell',
            args: {
              command: [
                "printf '\\211PNG\\000\\377\\376\\r\\n' > logo.png",
                "printf '\\351t\\351' > latin1.txt",
                "printf 'caf\\351 cr\\350me\\n' > old.txt",
                "printf 'XYZ' | dd of=blob.bin bs=1 seek=100 conv=notrunc 2>/dev/null",
                "printf 'two\\n' >> app.txt",
              ].join(' && '),
            },
          },
        ],
      },
    });
    const vibe = await finishedRun(h, res.body.run_id);
    expect(vibe.status, JSON.stringify([vibe.error, vibe.steps])).to.equal('succeeded');
    const diff: string = vibe.result.diff;
    expect(diff, 'no byte decoded into a replacement character').not.to.contain('\ufffd');
    expect(diff).to.contain('+two');
    // each file that is not UTF-8 text is git's binary patch, which git applies to the base byte for byte
    for (const file of Object.keys(expected))
      expect(diff).to.match(new RegExp(`^diff --git a/${file.replace('.', '\\.')} b/${file.replace('.', '\\.')}\\n(?:.+\\n)*?GIT binary patch\\n`, 'm'));
    expect(diff, 'the binary file’s change is a delta against its base').to.match(/^index [0-9a-f]{40}\.\.[0-9a-f]{40} 100644\nGIT binary patch\ndelta \d+\n/m);
    const applied = path.join(h.tenantDir(), 'vibe-bytes-applied');
    execFileSync('git', ['clone', '-q', repo, applied]);
    execFileSync('git', ['apply', '--binary', '-'], { cwd: applied, input: Buffer.from(diff, 'utf8') });
    for (const [file, bytes] of Object.entries(expected)) expect(fs.readFileSync(path.join(applied, file)).equals(bytes), `git apply: ${file}`).to.equal(true);
    fs.rmSync(applied, { recursive: true, force: true });

    const before = fake.requests.length;
    const run = await start({
      tools: ['codehost'],
      steps: [{ tool: 'codehost', args: { action: 'open_pull_request', repository: 'acme/bytes', run_id: vibe.id, head: 'bytes', title: 'Bytes' } }],
    });
    expect(run.status, JSON.stringify([run.error, run.steps[0]])).to.equal('succeeded');
    const sent = fake.requests.slice(before);
    const blobs = sent.filter((r) => r.method === 'POST' && r.path === '/github/repos/acme/bytes/git/blobs').map((r) => r.body);
    expect(blobs.map((b) => b.encoding)).to.deep.equal(Object.keys(expected).map(() => 'base64'));
    // each file is the blob of its exact bytes (the fake names a blob as git does), never text
    const tree = sent.find((r) => r.path === '/github/repos/acme/bytes/git/trees')!.body.tree as Body[];
    for (const [file, bytes] of Object.entries(expected))
      expect(
        tree.find((e) => e.path === file),
        file,
      ).to.deep.equal({ path: file, mode: '100644', type: 'blob', sha: gitBlobSha(bytes) });
    expect(tree.find((e) => e.path === 'app.txt')).to.deep.include({ content: 'one\ntwo\n' });
    // a base that is not the blob the binary patch was taken against: refused, as git apply refuses it, rather than patched into other bytes
    fake.setFiles('acme/bytes-other', { ...base, 'blob.bin': Buffer.concat([noise.subarray(0, 4000), Buffer.from('changed on main')]) });
    const other = await start({
      tools: ['codehost'],
      steps: [{ tool: 'codehost', args: { action: 'open_pull_request', repository: 'acme/bytes-other', run_id: vibe.id, head: 'bytes', title: 'Bytes' } }],
    });
    expect(other.steps[0].error).to.deep.include({ code: 'invalid-args' });
    expect(other.steps[0].error.message).to.contain("the run's change to blob.bin does not apply to main");
  });

  it('opens the pull request after a 429 on it from the branch the first try made, and refuses a branch that holds other changes', async () => {
    const repo = path.join(h.tenantDir(), 'vibe-retry');
    fs.mkdirSync(path.join(repo, 'src'), { recursive: true });
    const base = { 'src/app.mjs': 'export const answer = 41;\n' };
    for (const [file, content] of Object.entries(base)) fs.writeFileSync(path.join(repo, file), content);
    execFileSync('sh', ['-c', 'git init -q && git add -A && git -c user.name=t -c user.email=t@t commit -qm init'], { cwd: repo });
    fake.setFiles('acme/retry', base);
    const vibeOf = async (content: string) => {
      const res = await h.call<Body>('POST', '/api/v1/autonomy/vibe/run', {
        body: { workspace: 'vibe-retry', steps: [{ tool: 'write_file', args: { path: 'src/app.mjs', content } }] },
      });
      return finishedRun(h, res.body.run_id);
    };
    const open = (runId: string) =>
      start({
        tools: ['codehost'],
        steps: [{ tool: 'codehost', args: { action: 'open_pull_request', repository: 'acme/retry', run_id: runId, head: 'retried', title: 'Retried' } }],
      });
    const vibe = await vibeOf('export const answer = 42;\n');
    // the pull request's creation only is rate-limited once: the action is tried again whole, and finds its branch made
    fake.failNext('github', 429, 1, 0, {}, 'POST /github/repos/acme/retry/pulls');
    const before = fake.requests.length;
    const run = await open(vibe.id);
    expect(run.status, JSON.stringify([run.error, run.steps[0]])).to.equal('succeeded');
    const sent = fake.requests.slice(before).map((r) => `${r.method} ${r.path.replace('/github/repos/acme/retry', '')}`);
    expect(sent.filter((r) => r === 'POST /pulls')).to.have.length(2);
    expect(
      sent.filter((r) => r === 'POST /git/refs'),
      'asked twice: the second answered that it exists',
    ).to.have.length(2);
    const [firstCommit] = fake.requests
      .slice(before)
      .filter((r) => r.method === 'POST' && r.path.endsWith('/git/refs'))
      .map((r) => r.body.sha);
    expect(run.steps[0].output).to.deep.include({ head: 'retried', commit_sha: firstCommit });
    // another change under the same branch name: not this change's branch, said so rather than the provider's 422
    const other = await open((await vibeOf('export const answer = 43;\n')).id);
    expect(other.steps[0].error).to.deep.include({ code: 'invalid-args' });
    expect(other.steps[0].error.message).to.contain('the branch retried exists already, with other changes');
  });

  it('fails a step whose arguments an action cannot take before anything is sent, and one the provider refuses with its code', async () => {
    const before = fake.requests.length;
    const run = await start({
      tools: ['codehost'],
      steps: [{ tool: 'codehost', args: { action: 'review', repository: 'not a repo', number: 1, body: 'x' } }],
    });
    expect(run.status).to.equal('failed');
    expect(run.steps[0].error.code).to.equal('invalid-args');
    expect(fake.requests.length).to.equal(before);
    fake.failNext('github', 422, 1);
    const refused = await start({
      tools: ['codehost'],
      steps: [{ tool: 'codehost', args: { action: 'comment', repository: 'acme/app', number: 1, body: 'x' } }],
    });
    expect(refused.steps[0].error.code).to.equal('provider-refused');
    const events = await h.rt.events.after(`session:${refused.session_id}`, '0-0');
    expect(events.find((e) => e.type === 'provider.answer')!.data).to.deep.include({ ok: false, answer: null });
  });

  it('sends an action the provider answered 2xx but the service would not read (encoded) once: it fails as unreadable, not as a 502 tried three times', async () => {
    // a GitHub Enterprise and a Slack that do what they are asked, then answer gzip although asked for the answer as it is
    const posts: string[] = [];
    const encoded = http.createServer((req, res) => {
      req.resume();
      req.on('end', () => {
        posts.push(`${req.method} ${req.url}`);
        const body = req.url!.startsWith('/slack/') ? { ok: true, channel: 'C1', ts: '1.2' } : { id: 1, html_url: 'https://github.example/c/1' };
        res.writeHead(req.url!.startsWith('/slack/') ? 200 : 201, { 'content-type': 'application/json', 'content-encoding': 'gzip' });
        res.end(gzipSync(JSON.stringify(body)));
      });
    });
    await new Promise<void>((r) => encoded.listen(0, '127.0.0.1', r));
    const base = `http://127.0.0.1:${(encoded.address() as AddressInfo).port}`;
    try {
      const add = async (body: Body) => expect((await h.call<Body>('POST', '/api/v1/connections', { body })).status).to.equal(201);
      await add({ provider: 'codehost', name: 'ghe-gzip', base_url: `${base}/api/v3`, credential: FAKE_TOKEN });
      await add({ provider: 'chat', name: 'slack-gzip', base_url: `${base}/slack/api/`, credential: FAKE_TOKEN });
      const commented = await start({
        tools: ['codehost'],
        connections: { codehost: 'ghe-gzip' },
        steps: [{ tool: 'codehost', args: { action: 'comment', repository: 'acme/app', number: 1, body: 'once' } }],
      });
      expect(commented.status).to.equal('failed');
      expect(commented.steps[0].error.code, commented.steps[0].error.message).to.equal('provider-answer-unreadable');
      expect(commented.steps[0].error.message)
        .to.match(/answered 201, but its answer could not be read/)
        .and.match(/came encoded \(gzip\)/);
      expect(posts, 'one comment made, not three').to.deep.equal(['POST /api/v3/repos/acme/app/issues/1/comments']);
      const posted = await start({
        tools: ['chat'],
        connections: { chat: 'slack-gzip' },
        steps: [{ tool: 'chat', args: { action: 'post', channel: 'C1', text: 'once' } }],
      });
      expect(posted.steps[0].error.code, posted.steps[0].error.message).to.equal('provider-answer-unreadable');
      expect(
        posts.filter((p) => p.includes('chat.postMessage')),
        'one message posted, not three',
      ).to.have.length(1);
    } finally {
      encoded.closeAllConnections();
      encoded.close();
    }
  });

  it('asks a provider again after a 5xx only for an action that lands the same however often it is made; one that makes something only after a 429', async () => {
    const calls = (provider: string) => fake.requests.filter((r) => r.provider === provider).length;
    // a comment that may have been made: not made twice
    let before = calls('github');
    fake.failNext('github', 503, 3, 0);
    const comment = await start({
      tools: ['codehost'],
      connections: { codehost: 'github' },
      steps: [{ tool: 'codehost', args: { action: 'comment', repository: 'acme/app', number: 1, body: 'x' } }],
    });
    expect(comment.steps[0].error.code).to.equal('provider-error');
    expect(calls('github') - before, 'a comment after a 503: one call').to.equal(1);
    fake.failNext('github', 503, 0);
    // a comment refused with 429 (nothing made): asked again
    before = calls('github');
    fake.failNext('github', 429, 1, 0);
    const limited = await start({
      tools: ['codehost'],
      connections: { codehost: 'github' },
      steps: [{ tool: 'codehost', args: { action: 'comment', repository: 'acme/app', number: 1, body: 'x' } }],
    });
    expect(limited.status, JSON.stringify(limited.steps[0].error)).to.equal('succeeded');
    expect(calls('github') - before).to.equal(2);
    // a priority set: the same however often, asked again after a 503
    before = calls('linear');
    fake.failNext('linear', 503, 1, 0);
    const priority = await start({ tools: ['tracker'], steps: [{ tool: 'tracker', args: { action: 'set_priority', issue_id: 'ISS-1', priority: 1 } }] });
    expect(priority.status, JSON.stringify(priority.steps[0].error)).to.equal('succeeded');
    expect(calls('linear') - before).to.equal(2);
  });

  it('refuses as an action what every object inherits (constructor answered the connection’s access, its credential in clear)', async () => {
    for (const action of ['constructor', 'toString', '__proto__', 'hasOwnProperty', 'valueOf']) {
      const run = await start({ tools: ['chat'], steps: [{ tool: 'chat', args: { action, connection: 'slack' } }] });
      expect(run.status, action).to.equal('failed');
      expect(run.steps[0].error?.code, action).to.equal('invalid-args');
      expect(run.steps[0].output, action).to.deep.equal({});
      const events = await h.rt.events.after(`session:${run.session_id}`, '0-0');
      expect(JSON.stringify({ run, events }), action).to.not.contain(FAKE_TOKEN);
    }
    // and below the tool: the connections' own lookup
    let refused: unknown;
    await h.rt.engine.connections.act('tenant-a', 'chat', 'slack', 'constructor', {}).catch((err: unknown) => (refused = err));
    expect(String(refused)).to.match(/has no action constructor/);
  });
});
