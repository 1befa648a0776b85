import { spawnSync } from 'node:child_process';
import { expect } from 'chai';
import { builtCli } from '../support/built.js';
import { spawnAsync } from '../support/spawn.js';
import { startWebServer } from '../../api/server.js';
import { KEYS, startHarness, type Harness } from '../support/harness.js';
import { bodyOfAnswer, rawExchange } from '../support/raw-http.js';

describe('authentication', () => {
  let h: Harness;
  before(async () => {
    h = await startHarness();
  });
  after(async () => {
    await h.close();
  });

  it('answers 401 problem+json with no key, a wrong key or a malformed header', async () => {
    const attempts: Record<string, string>[] = [{}, { authorization: 'Bearer not-a-key' }, { 'x-api-key': 'nope' }, { authorization: 'Basic Zm9vOmJhcg==' }];
    for (const headers of attempts) {
      const res = await h.call('GET', '/api/v1/automations', { key: null, headers });
      expect(res.status, JSON.stringify(headers)).to.equal(401);
      expect(res.headers.get('content-type')).to.contain('application/problem+json');
      expect(res.headers.get('www-authenticate')).to.contain('Bearer');
      expect(res.body).to.include({ code: 'unauthorized', status: 401 });
      expect(res.body.request_id).to.equal(res.headers.get('x-request-id'));
    }
  });

  it('takes the key as Bearer or as X-API-Key', async () => {
    expect((await h.call('GET', '/api/v1/automations', { key: null, headers: { authorization: `Bearer ${KEYS.a}` } })).status).to.equal(200);
    expect((await h.call('GET', '/api/v1/automations', { key: null, headers: { 'x-api-key': KEYS.a } })).status).to.equal(200);
  });

  it('takes X-API-Key alongside an Authorization that is not a Bearer token; a Bearer token is taken before it', async () => {
    // a browser's Basic credentials for the dashboard ride along with a script's X-API-Key
    const alongBasic = await h.call('GET', '/api/v1/me', { key: null, headers: { authorization: 'Basic dTpw', 'x-api-key': KEYS.a } });
    expect(alongBasic.status, alongBasic.text).to.equal(200);
    expect(alongBasic.body).to.include({ tenant_id: 'tenant-a', auth: 'api_key' });
    const otherScheme = await h.call('GET', '/api/v1/me', { key: null, headers: { authorization: 'Negotiate abc', 'x-api-key': KEYS.b } });
    expect(otherScheme.status, otherScheme.text).to.equal(200);
    expect(otherScheme.body.tenant_id).to.equal('tenant-b');
    // both: the Bearer token is the credential, whatever the X-API-Key says
    const bearerFirst = await h.call('GET', '/api/v1/me', { key: null, headers: { authorization: `Bearer ${KEYS.b}`, 'x-api-key': KEYS.a } });
    expect(bearerFirst.body.tenant_id).to.equal('tenant-b');
    expect((await h.call('GET', '/api/v1/me', { key: null, headers: { authorization: 'Bearer not-a-key', 'x-api-key': KEYS.a } })).status).to.equal(401);
    // a Bearer that holds no one token is no key either: not passed over for the X-API-Key
    for (const authorization of ['Bearer', 'Bearer two tokens'])
      expect((await h.call('GET', '/api/v1/me', { key: null, headers: { authorization, 'x-api-key': KEYS.a } })).status, authorization).to.equal(401);
  });

  it('checks the key before the body: no key and a bad body is still 401, and nothing is stored', async () => {
    const res = await h.call('POST', '/api/v1/automations', { key: null, raw: '{"name":', headers: { 'content-type': 'application/json' } });
    expect(res.status).to.equal(401);
    const wrong = await h.call('POST', '/api/v1/automations', { key: 'wrong-key', body: { name: 'x', steps: [{ tool: 'message', args: { text: 'x' } }] } });
    expect(wrong.status).to.equal(401);
    expect((await h.call('GET', '/api/v1/automations')).body.data).to.have.length(0);
  });

  it('stores keys hashed, never in clear', async () => {
    const all = [...(await h.rt.store.apiKeys.list('tenant-a')), ...(await h.rt.store.apiKeys.list('tenant-b'))];
    expect(all).to.have.length(2);
    for (const k of all) {
      expect(k.hash).to.match(/^[0-9a-f]{64}$/);
      expect(JSON.stringify(k)).not.to.contain(KEYS.a).and.not.to.contain(KEYS.b);
    }
  });

  it('never writes a key or an Authorization header to the logs', async () => {
    await h.call('GET', '/api/v1/automations', { key: null, headers: { authorization: `Bearer ${KEYS.a}`, 'x-request-id': 'trace-me-1' } });
    await h.call('GET', '/api/v1/automations', { key: null, headers: { 'x-api-key': KEYS.b } });
    const text = h.logs.join('');
    expect(text).to.contain('trace-me-1');
    expect(text).not.to.contain(KEYS.a);
    expect(text).not.to.contain(KEYS.b);
    // one completion line per request: its id, tenant, method, path and status, and none of its headers
    const line = h.logs.map((l) => JSON.parse(l) as Record<string, any>).find((l) => l.req_id === 'trace-me-1' && l.msg === 'request completed');
    expect(line).to.deep.include({ tenant_id: 'tenant-a', req: { method: 'GET', path: '/api/v1/automations' }, res: { status: 200 } });
    expect(line!.response_ms).to.be.a('number');
  });

  it('opens the queue dashboard only with an admin key (HTTP Basic or Bearer), never a tenant key', async () => {
    const basic = (user: string, pass: string) => `Basic ${Buffer.from(`${user}:${pass}`).toString('base64')}`;
    const none = await h.call('GET', '/admin/queues', { key: null });
    expect(none.status).to.equal(401);
    expect(none.headers.get('www-authenticate')).to.contain('Basic');
    expect((await h.call('GET', '/admin/queues', { key: null, headers: { authorization: basic('ops', KEYS.a) } })).status).to.equal(401);
    expect((await h.call('GET', '/admin/queues', { key: KEYS.a })).status).to.equal(401);
    const page = await h.call('GET', '/admin/queues', { key: null, headers: { authorization: basic('ops', KEYS.admin) } });
    expect(page.status).to.equal(200);
    expect(page.text).to.contain('<div id="root">');
    const api = await h.call('GET', '/admin/queues/api/queues', { key: KEYS.admin });
    expect(api.status).to.equal(200);
    expect(api.body.queues.map((q: { name: string }) => q.name)).to.include('runs');
    // no other site frames it, and nothing says what serves it
    expect(page.headers.get('x-frame-options')).to.equal('DENY');
    expect(page.headers.get('content-security-policy')).to.contain("frame-ancestors 'none'");
    expect(page.headers.get('x-powered-by')).to.equal(null);
    // the browser sends the cached Basic credentials with a form another site posts: such a change is refused
    const pause = (headers: Record<string, string>) =>
      h.call('PUT', '/admin/queues/api/queues/webhooks/pause', { key: null, headers: { authorization: basic('ops', KEYS.admin), ...headers } });
    const forged = await pause({ origin: 'https://evil.example', 'content-type': 'text/plain' });
    expect(forged.status).to.equal(403);
    expect(forged.body.code).to.equal('csrf-refused');
    expect((await pause({ 'sec-fetch-site': 'cross-site' })).status).to.equal(403);
    expect(await h.rt.queues.get('webhooks').isPaused()).to.equal(false);
    // from the dashboard's own page it goes through
    expect((await pause({ origin: new URL(h.url).origin, 'sec-fetch-site': 'same-origin' })).status).to.equal(200);
    expect(await h.rt.queues.get('webhooks').isPaused()).to.equal(true);
    await h.rt.queues.get('webhooks').resume();
    // the dashboard API's refusals are the service's problems, not bull-board's own JSON
    const admin = { key: null, headers: { authorization: basic('ops', KEYS.admin) } };
    const missing = await h.call('PUT', '/admin/queues/api/queues/nope/pause', admin);
    expect(missing.headers.get('content-type')).to.match(/^application\/problem\+json/);
    expect(missing.body).to.deep.include({ status: 404, code: 'not-found', detail: 'queue not found', request_id: missing.headers.get('x-request-id') });
    const malformed = await h.call('POST', '/admin/queues/api/queues/runs/add', {
      ...admin,
      raw: Buffer.from('{bad'),
      headers: { ...admin.headers, 'content-type': 'application/json', origin: new URL(h.url).origin },
    });
    expect(malformed.status).to.equal(400);
    expect(malformed.body).to.deep.include({ code: 'bad-request', request_id: malformed.headers.get('x-request-id') });
  });
});

describe('SERVICE_AUTH=none', () => {
  it('lets local callers in without a key, as the tenant "local"', async () => {
    const h = await startHarness({ env: { SERVICE_AUTH: 'none' } });
    try {
      const res = await h.call('POST', '/api/v1/automations', { key: null, body: { name: 'local', steps: [{ tool: 'message', args: { text: 'x' } }] } });
      expect(res.status).to.equal(201);
      expect(res.body.tenant_id).to.equal('local');
    } finally {
      await h.close();
    }
  });

  it('serves this machine’s clients only: a request named to another host (DNS rebinding) or a browser’s from another site is refused, and it listens on loopback', async () => {
    const h = await startHarness({ env: { SERVICE_AUTH: 'none' } });
    try {
      const port = new URL(h.url).port;
      const body = JSON.stringify({ steps: [{ tool: 'message', args: { text: 'x' } }] });
      const post = async (path: string, headers: Record<string, string>) => {
        const head = Object.entries({ 'content-type': 'application/json', 'content-length': String(body.length), connection: 'close', ...headers })
          .map(([k, v]) => `${k}: ${v}\r\n`)
          .join('');
        const { text } = await rawExchange(h.url, [[0, `POST ${path} HTTP/1.1\r\n${head}\r\n${body}`]]);
        return { status: Number(text.split(' ')[1]), body: bodyOfAnswer(text) };
      };
      const get = async (path: string, headers: Record<string, string>) => {
        const head = Object.entries({ connection: 'close', ...headers })
          .map(([k, v]) => `${k}: ${v}\r\n`)
          .join('');
        const { text } = await rawExchange(h.url, [[0, `GET ${path} HTTP/1.1\r\n${head}\r\n`]]);
        return { status: Number(text.split(' ')[1]), text };
      };
      const refused: Record<string, string>[] = [
        { host: `rebind.attacker.example:${port}`, origin: `http://rebind.attacker.example:${port}` },
        { host: `rebind.attacker.example:${port}` },
        { host: `192.168.1.20:${port}` },
        { host: `127.0.0.1:${port}`, origin: 'https://evil.example' },
        { host: `127.0.0.1:${port}`, origin: 'null' },
        { host: `127.0.0.1:${port}`, 'sec-fetch-site': 'cross-site' },
      ];
      for (const headers of refused) {
        const r = await post('/api/v1/autonomy/run', headers);
        expect(r.status, JSON.stringify(headers)).to.equal(403);
        expect(r.body.code).to.equal('csrf-refused');
      }
      // an <img> of another site cannot start an audit; a GET that starts nothing may be read (no CORS lets it be read)
      expect(
        (await get('/api/v1/autonomy/workspace-audit/stream?phases=sanity', { host: `localhost:${port}`, 'sec-fetch-site': 'cross-site' })).status,
      ).to.equal(403);
      expect((await get('/api/v1/automations', { host: `rebind.attacker.example:${port}` })).status).to.equal(403);
      expect((await h.call<{ data: unknown[] }>('GET', '/api/v1/runs', { key: null })).body.data).to.deep.equal([]);
      // this machine's clients: curl or the CLI (no Origin), a local web page, each loopback name
      const local: Record<string, string>[] = [
        { host: `127.0.0.1:${port}` },
        { host: `localhost:${port}` },
        { host: `[::1]:${port}` },
        { host: `app.localhost:${port}`, origin: 'http://localhost:5173', 'sec-fetch-site': 'same-site' },
      ];
      for (const headers of local) expect((await post('/api/v1/autonomy/run', headers)).status, JSON.stringify(headers)).to.equal(202);
      const other = await startWebServer(h.rt, { port: 0 });
      try {
        expect(other.server.address()).to.deep.include({ address: '127.0.0.1' });
      } finally {
        await other.close();
      }
    } finally {
      await h.close();
    }
  });
});

describe('cli keys create', () => {
  it('prints a new key once; the key then works for its tenant only', async () => {
    const h = await startHarness();
    try {
      const out = await spawnAsync(process.execPath, [builtCli(), 'keys', 'create', '--tenant', 'tenant-c', '--label', 'ci'], {
        env: { ...process.env, SERVICE_DATA_DIR: h.config.dataDir, LOG_LEVEL: 'silent' },
      });
      expect(out.status, out.stderr).to.equal(0);
      const key = out.stdout.trim();
      expect(key).to.match(/^sk_[A-Za-z0-9_-]{43}$/);
      expect(out.stderr).to.contain('tenant-c');
      // where the key is: the service's own store, not a new one
      expect(out.stderr).to.contain(`in SQLite store ${h.config.dataDir}/service.sqlite.`);
      const created = await h.call('POST', '/api/v1/automations', { key, body: { name: 'from cli key', steps: [{ tool: 'message', args: { text: 'x' } }] } });
      expect(created.status).to.equal(201);
      expect(created.body.tenant_id).to.equal('tenant-c');
      expect((await h.call('GET', `/api/v1/automations/${created.body.id}`, { key: KEYS.a })).status).to.equal(404);
      const [record] = await h.rt.store.apiKeys.list('tenant-c');
      expect(record).to.include({ label: 'ci', source: 'cli' });
      expect(JSON.stringify(record)).not.to.contain(key);
    } finally {
      await h.close();
    }
  });

  it('refuses a missing or malformed tenant with usage', () => {
    const out = spawnSync(process.execPath, [builtCli(), 'keys', 'create', '--tenant', 'bad tenant!'], { encoding: 'utf8' });
    expect(out.status).to.equal(2);
    expect(out.stderr).to.contain('--tenant').and.contain('--help shows the usage');
  });
});
