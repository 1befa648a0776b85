// People's sign-in against a real OpenID Connect provider on loopback (oidc-provider): the code flow
// with PKCE, the tenant from a claim, the cookie session on every /api/v1 route, CSRF, CORS, logout,
// and the refusals (forged state, replayed callback, wrong audience, unknown tenant).
import { spawn, type ChildProcess } from 'node:child_process';
import { createHash } from 'node:crypto';
import net from 'node:net';
import { expect } from 'chai';
import { eventually, freePort, KEYS, listening, scanKeys, startHarness, type Harness } from '../support/harness.js';
import { startIdp, type Idp } from '../support/idp.js';

// eslint-disable-next-line @typescript-eslint/no-explicit-any
type Body = Record<string, any>;

const WEB_APP = 'https://app.example.com';

/** A browser in miniature: cookies per origin, redirects followed by hand, forms posted. */
class Browser {
  private readonly jar = new Map<string, Map<string, string>>();
  /** every URL visited, in order */
  readonly visited: string[] = [];
  /** every cookie value set, in order: [name, value] */
  readonly set: [string, string][] = [];

  cookie(origin: string, name: string): string | undefined {
    return this.jar.get(origin)?.get(name);
  }

  /** the names of the cookies it keeps for an origin that begin so, oldest first */
  cookieNames(origin: string, prefix: string): string[] {
    return [...(this.jar.get(origin)?.keys() ?? [])].filter((name) => name.startsWith(prefix));
  }

  async fetch(url: string, init: RequestInit = {}): Promise<Response> {
    const u = new URL(url);
    const cookies = [...(this.jar.get(u.origin) ?? new Map()).entries()].map(([k, v]) => `${k}=${v}`).join('; ');
    const res = await fetch(url, {
      ...init,
      redirect: 'manual',
      headers: { ...(init.headers as Record<string, string>), ...(cookies ? { cookie: cookies } : {}) },
    });
    this.visited.push(url);
    for (const line of res.headers.getSetCookie()) {
      const [pair, ...attrs] = line.split(';');
      const at = pair!.indexOf('=');
      const name = pair!.slice(0, at).trim();
      const value = pair!.slice(at + 1).trim();
      this.set.push([name, value]);
      const jar = this.jar.get(u.origin) ?? new Map<string, string>();
      this.jar.set(u.origin, jar);
      if (attrs.some((a) => /^\s*max-age=0\s*$/i.test(a)) || value === '') jar.delete(name);
      else jar.set(name, value);
    }
    return res;
  }

  /** Follows redirects, and posts the provider's login and consent forms, until a page that is neither. */
  async navigate(url: string, login: string): Promise<{ url: string; res: Response }> {
    let next: { url: string; init?: RequestInit } | null = { url };
    for (let hops = 0; next && hops < 20; hops++) {
      const res = await this.fetch(next.url, next.init);
      const location = res.headers.get('location');
      if (res.status >= 300 && res.status < 400 && location) {
        next = { url: new URL(location, next.url).href };
        continue;
      }
      const type = res.headers.get('content-type') ?? '';
      if (!type.includes('text/html')) return { url: next.url, res };
      const html = await res.text();
      const action = /<form[^>]*action="([^"]*\/interaction\/[^"]+)"/.exec(html)?.[1];
      if (!action) return { url: next.url, res: new Response(html, { status: res.status, headers: res.headers }) };
      // the provider's development pages: a login form, then a consent form, each with a hidden prompt
      const fields = new URLSearchParams(
        [...html.matchAll(/<input type="hidden" name="([^"]+)" value="([^"]*)"/g)].map((m): [string, string] => [m[1]!, m[2]!]),
      );
      if (fields.get('prompt') === 'login') {
        fields.set('login', login);
        fields.set('password', 'any');
      }
      next = { url: new URL(action, next.url).href, init: { method: 'POST', body: fields, headers: { 'content-type': 'application/x-www-form-urlencoded' } } };
    }
    throw new Error('too many redirects');
  }
}

describe('sign-in with OpenID Connect', function () {
  this.timeout(30_000);
  let idp: Idp;
  let h: Harness;
  let port: number;
  let oidcEnv: Record<string, string>;
  const orgs: Record<string, string | undefined> = { alice: 'org-acme', bob: 'org-globex', mallory: 'org-unknown', nobody: undefined };

  before(async () => {
    port = await freePort();
    const redirect = `http://127.0.0.1:${port}/auth/callback`;
    idp = await startIdp({ redirectUri: redirect, orgOf: (login) => orgs[login] });
    oidcEnv = {
      SERVICE_OIDC_ISSUER: idp.issuer,
      SERVICE_OIDC_CLIENT_ID: idp.clientId,
      SERVICE_OIDC_CLIENT_SECRET: idp.clientSecret,
      SERVICE_OIDC_REDIRECT_URL: redirect,
      SERVICE_OIDC_TENANT_CLAIM: 'org_id',
      SERVICE_OIDC_TENANT_MAP: 'org-acme:tenant-a,org-globex:tenant-b',
      SERVICE_CORS_ORIGINS: WEB_APP,
    };
    h = await startHarness({ workers: false, port, env: oidcEnv });
  });
  after(async () => {
    await h?.close();
    await idp?.close();
  });

  const service = () => `http://127.0.0.1:${port}`;

  it('signs a person in through the provider, into the tenant their claim names, and every route takes the session', async () => {
    const alice = new Browser();
    const done = await alice.navigate(`${service()}/auth/login`, 'alice');
    expect(done.url).to.equal(`${service()}/api/v1/me`);
    const me = (await done.res.json()) as Body;
    expect(me).to.deep.include({ tenant_id: 'tenant-a', auth: 'session', api_key_id: null });
    expect(me.user).to.deep.equal({ sub: 'alice', email: 'alice@example.com', name: 'User alice' });
    expect(Date.parse(me.session_expires_at)).to.be.greaterThan(Date.now());
    const session = alice.cookie(service(), '__Host-session');
    expect(session).to.be.a('string').with.length.greaterThan(30);
    expect(alice.cookieNames(service(), '__Host-sign-in'), 'the sign-in cookie is cleared').to.deep.equal([]);
    expect(alice.set.filter(([name]) => name.startsWith('__Host-sign-in-'))).to.have.length(2);

    // alice's object, seen by alice and by tenant-a's key; bob, of another tenant, sees none of it
    const made = await alice.fetch(`${service()}/api/v1/automations`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', origin: service() },
      body: JSON.stringify({ name: 'made by alice', steps: [{ tool: 'message', args: { text: 'x' } }] }),
    });
    expect(made.status, await made.clone().text()).to.equal(201);
    const id = ((await made.json()) as Body).id;
    expect((await h.call('GET', `/api/v1/automations/${id}`)).status).to.equal(200);
    const bob = new Browser();
    const bobMe = await bob.navigate(`${service()}/auth/login`, 'bob');
    expect(((await bobMe.res.json()) as Body).tenant_id).to.equal('tenant-b');
    expect((await bob.fetch(`${service()}/api/v1/automations/${id}`)).status).to.equal(404);
    const bobList = (await (await bob.fetch(`${service()}/api/v1/automations`)).json()) as Body;
    expect(bobList.data.map((a: Body) => a.id)).not.to.include(id);

    // signing in again gives a new session id; logging out ends it at once
    const again = await alice.navigate(`${service()}/auth/login`, 'alice');
    expect(again.url).to.equal(`${service()}/api/v1/me`);
    const second = alice.cookie(service(), '__Host-session');
    expect(second).not.to.equal(session);
    // and ends the session the browser had: no session is left behind that no logout reaches
    expect((await fetch(`${service()}/api/v1/me`, { headers: { cookie: `__Host-session=${session}` } })).status).to.equal(401);
    // another web process (same Redis) takes the session, and refuses it from the moment it ends
    const other = await startHarness({ workers: false, env: { ...oidcEnv, SERVICE_QUEUE_PREFIX: h.config.queuePrefix } });
    const inOther = () => fetch(`${other.url}/api/v1/me`, { headers: { cookie: `__Host-session=${second}` } });
    try {
      expect((await inOther()).status).to.equal(200);
      // a stream the session opened in the other process ends with it
      const watched = (await other.call<Body>('POST', '/api/v1/sessions', { body: { title: 'watched' } })).body;
      const stream = await fetch(`${other.url}/api/v1/sessions/${watched.id}/trace`, { headers: { cookie: `__Host-session=${second}` } });
      expect(stream.status).to.equal(200);
      const streamEnded = stream.text().then(() => true);
      // its heartbeats check the session without counting as a use: the idle clock runs on
      const sessionKey = `${h.config.queuePrefix}:sso-session:${createHash('sha256').update(second!).digest('hex')}`;
      const ttlBefore = await h.rt.redis.ttl(sessionKey);
      await new Promise((r) => setTimeout(r, 2500));
      expect(await h.rt.redis.ttl(sessionKey)).to.be.at.most(ttlBefore - 2);
      const out = await alice.fetch(`${service()}/auth/logout`, { method: 'POST', headers: { origin: service() } });
      expect(out.status).to.equal(204);
      expect((await inOther()).status).to.equal(401);
      expect(await Promise.race([streamEnded, new Promise((r) => setTimeout(() => r(false), 4000))]), 'the stream ended').to.equal(true);
    } finally {
      await other.close();
    }
    expect(alice.cookie(service(), '__Host-session')).to.equal(undefined);
    const stale = await fetch(`${service()}/api/v1/me`, { headers: { cookie: `__Host-session=${second}` } });
    expect(stale.status).to.equal(401);
    expect(h.logs.join('\n')).not.to.contain(second!);
  });

  it('leaves the session as it was when the CSRF rule refuses a request the cookie came with', async () => {
    const alice = new Browser();
    await alice.navigate(`${service()}/auth/login`, 'alice');
    const id = alice.cookie(service(), '__Host-session')!;
    const sessionKey = `${h.config.queuePrefix}:sso-session:${createHash('sha256').update(id).digest('hex')}`;
    // an idle clock well short of its 8 hours: a use would set it back to them
    await h.rt.redis.expire(sessionKey, 100);
    const stored = await h.rt.redis.get(sessionKey);
    const refused = [
      await alice.fetch(`${service()}/api/v1/automations`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', origin: 'https://evil.example' },
        body: JSON.stringify({ name: 'csrf?', steps: [{ tool: 'message', args: { text: 'x' } }] }),
      }),
      await alice.fetch(`${service()}/api/v1/autonomy/workspace-audit/stream?phases=sanity`, { headers: { 'sec-fetch-site': 'cross-site' } }),
    ];
    for (const res of refused) {
      expect(res.status).to.equal(403);
      expect(res.headers.get('content-type')).to.contain('application/problem+json');
      expect(((await res.json()) as Body).code).to.equal('csrf-refused');
    }
    expect(await h.rt.redis.ttl(sessionKey), 'the idle clock not renewed').to.be.within(1, 100);
    expect(await h.rt.redis.get(sessionKey)).to.equal(stored);
    // a request the rule admits is a use
    expect((await alice.fetch(`${service()}/api/v1/me`, { headers: { 'sec-fetch-site': 'same-origin' } })).status).to.equal(200);
    expect(await h.rt.redis.ttl(sessionKey)).to.be.greaterThan(3600);
  });

  it('refuses a malformed or unknown Authorization (or an empty X-API-Key) that comes with the cookie, as a wrong key', async () => {
    const alice = new Browser();
    await alice.navigate(`${service()}/auth/login`, 'alice');
    const cookie = `__Host-session=${alice.cookie(service(), '__Host-session')}`;
    const me = (headers: Record<string, string>) => fetch(`${service()}/api/v1/me`, { headers: { cookie, ...headers } });
    const sent: Record<string, string>[] = [
      { authorization: 'Bearer' },
      { authorization: 'Bearer   ' },
      { authorization: 'Bearer two tokens' },
      { authorization: 'Basic !!!' },
      { authorization: 'Basic dXNlcg==' }, // no `:`, no browser's
      { authorization: 'Negotiate abc' },
      { authorization: 'Token abc' },
      { authorization: '' },
      { 'x-api-key': '' },
      { 'x-api-key': '   ' },
      // what a wrong key has always had: the same
      { authorization: 'Bearer not-a-key' },
      { 'x-api-key': 'not-a-key' },
    ];
    for (const headers of sent) {
      const res = await me(headers);
      expect(res.status, JSON.stringify(headers)).to.equal(401);
      expect(res.headers.get('content-type'), JSON.stringify(headers)).to.contain('application/problem+json');
      expect(((await res.json()) as Body).code).to.equal('unauthorized');
    }
    // the cookie alone still opens; so does it with the Basic a browser keeps for the dashboard and sends by itself
    for (const headers of [{}, { authorization: 'Basic dTpw' }] as Record<string, string>[]) {
      const res = await me(headers);
      expect(res.status, JSON.stringify(headers)).to.equal(200);
      expect(((await res.json()) as Body).auth).to.equal('session');
    }
  });

  it('ends a session whose tenant the mapping no longer gives, in every process', async () => {
    const alice = new Browser();
    await alice.navigate(`${service()}/auth/login`, 'alice');
    const cookie = `__Host-session=${alice.cookie(service(), '__Host-session')}`;
    expect((await fetch(`${service()}/api/v1/me`, { headers: { cookie } })).status).to.equal(200);
    // a process started with a new mapping: org-acme is no longer one of the service's tenants
    const remapped = await startHarness({
      workers: false,
      env: { ...oidcEnv, SERVICE_OIDC_TENANT_MAP: 'org-globex:tenant-b', SERVICE_QUEUE_PREFIX: h.config.queuePrefix },
    });
    try {
      expect((await fetch(`${remapped.url}/api/v1/me`, { headers: { cookie } })).status).to.equal(401);
      expect(remapped.logs.join('\n')).to.contain('the tenant mapping changed');
    } finally {
      await remapped.close();
    }
    expect((await fetch(`${service()}/api/v1/me`, { headers: { cookie } })).status, 'ended for every process').to.equal(401);
  });

  it('ends a session whose email domain SERVICE_OIDC_ALLOWED_EMAIL_DOMAINS no longer lets in, as a changed mapping does', async () => {
    const alice = new Browser();
    await alice.navigate(`${service()}/auth/login`, 'alice');
    const cookie = `__Host-session=${alice.cookie(service(), '__Host-session')}`;
    // a process that still lets her domain in keeps her session; one that lets in example.org only ends it
    // (both open together: a harness closed cleans its prefix's keys in Redis, the session's too)
    const same = await startHarness({
      workers: false,
      env: { ...oidcEnv, SERVICE_OIDC_ALLOWED_EMAIL_DOMAINS: 'example.org,example.com', SERVICE_QUEUE_PREFIX: h.config.queuePrefix },
    });
    const narrowed = await startHarness({
      workers: false,
      env: { ...oidcEnv, SERVICE_OIDC_ALLOWED_EMAIL_DOMAINS: 'example.org', SERVICE_QUEUE_PREFIX: h.config.queuePrefix },
    });
    try {
      expect((await fetch(`${same.url}/api/v1/me`, { headers: { cookie } })).status).to.equal(200);
      expect((await fetch(`${narrowed.url}/api/v1/me`, { headers: { cookie } })).status).to.equal(401);
      const minted = await fetch(`${narrowed.url}/api/v1/api-keys`, {
        method: 'POST',
        headers: { cookie, 'content-type': 'application/json', 'sec-fetch-site': 'same-origin' },
        body: JSON.stringify({ name: 'after the list was narrowed' }),
      });
      expect(minted.status, 'no key minted by a session the list no longer lets in').to.equal(401);
      expect(narrowed.logs.join('\n')).to.contain('its email domain may no longer sign in');
      expect((await fetch(`${same.url}/api/v1/me`, { headers: { cookie } })).status, 'ended for every process').to.equal(401);
    } finally {
      await narrowed.close();
      await same.close();
    }
  });

  it('ends a session at its absolute lifetime, and lets in only the allowed email domains', async () => {
    // a process whose clock the test moves past the session's absolute end (SERVICE_SESSION_MAX_SECONDS, 7 days by default)
    let offsetMs = 0;
    const clock = { now: () => new Date(Date.now() + offsetMs) };
    const timed = await startHarness({
      workers: false,
      port: await freePort(),
      env: { ...oidcEnv, SERVICE_QUEUE_PREFIX: h.config.queuePrefix },
      runtime: { clock },
    });
    try {
      // the session is made by the main service (the redirect URL is its); both share Redis, so it opens here too
      const alice = new Browser();
      await alice.navigate(`${service()}/auth/login`, 'alice');
      const cookie = `__Host-session=${alice.cookie(service(), '__Host-session')}`;
      expect((await fetch(`${timed.url}/api/v1/me`, { headers: { cookie } })).status).to.equal(200);
      offsetMs = 7 * 86_400_000 + 1000;
      expect((await fetch(`${timed.url}/api/v1/me`, { headers: { cookie } })).status, 'past its absolute end').to.equal(401);
    } finally {
      await timed.close();
    }
    // a service that lets in example.org only refuses alice@example.com
    const domainPort = await freePort();
    const narrowIdp = await startIdp({ redirectUri: `http://127.0.0.1:${domainPort}/auth/callback`, orgOf: () => 'org-acme' });
    const narrow = await startHarness({
      workers: false,
      port: domainPort,
      env: {
        ...oidcEnv,
        SERVICE_OIDC_ISSUER: narrowIdp.issuer,
        SERVICE_OIDC_CLIENT_SECRET: narrowIdp.clientSecret,
        SERVICE_OIDC_REDIRECT_URL: `http://127.0.0.1:${domainPort}/auth/callback`,
        SERVICE_OIDC_ALLOWED_EMAIL_DOMAINS: 'example.org',
      },
    });
    try {
      const b = new Browser();
      const res = await b.navigate(`http://127.0.0.1:${domainPort}/auth/login`, 'alice');
      expect(res.res.status).to.equal(403);
      expect(((await res.res.json()) as Body).detail).to.contain('email domain');
      // x@example.org@example.com is delivered to example.com: its first `@` does not make it example.org's
      for (const login of ['x@example.org', '"x@example.org"']) {
        const tricked = await new Browser().navigate(`http://127.0.0.1:${domainPort}/auth/login`, login);
        expect(tricked.res.status, login).to.equal(403);
      }
    } finally {
      await narrow.close();
      await narrowIdp.close();
    }
  });

  it('refuses a cross-site request that carries the cookie, and answers the web client’s origin with CORS', async () => {
    const alice = new Browser();
    await alice.navigate(`${service()}/auth/login`, 'alice');
    const post = (origin?: Record<string, string>) =>
      alice.fetch(`${service()}/api/v1/automations`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', ...origin },
        body: JSON.stringify({ name: 'csrf?', steps: [{ tool: 'message', args: { text: 'x' } }] }),
      });
    const forged = await post({ origin: 'https://evil.example' });
    expect(forged.status).to.equal(403);
    expect(((await forged.json()) as Body).code).to.equal('csrf-refused');
    expect((await post()).status, 'neither Origin nor Sec-Fetch-Site').to.equal(403);
    expect((await post({ 'sec-fetch-site': 'cross-site' })).status).to.equal(403);
    expect((await post({ 'sec-fetch-site': 'same-origin' })).status).to.equal(201);
    // a cross-site navigation carries a Lax cookie: it may only land on who-am-I, never on a GET that starts work
    const navigate = (path: string) => alice.fetch(`${service()}${path}`, { headers: { 'sec-fetch-site': 'cross-site', 'sec-fetch-mode': 'navigate' } });
    expect((await navigate('/api/v1/autonomy/workspace-audit/stream')).status).to.equal(403);
    expect((await navigate('/api/v1/me')).status).to.equal(200);
    // a GET that starts work keeps to the rule of a POST: a same-site page (a sibling subdomain) or a
    // browser that sends no Fetch Metadata cannot start an audit with the cookie
    const auditStream = (headers: Record<string, string>) => alice.fetch(`${service()}/api/v1/autonomy/workspace-audit/stream?phases=sanity`, { headers });
    expect((await auditStream({ 'sec-fetch-site': 'same-site' })).status).to.equal(403);
    expect((await auditStream({})).status).to.equal(403);
    const slashed = await alice.fetch(`${service()}/api/v1/autonomy/workspace-audit/stream/?phases=sanity`, { headers: { 'sec-fetch-site': 'same-site' } });
    expect(slashed.status, 'the same route with a trailing slash').to.equal(403);
    const read = await alice.fetch(`${service()}/api/v1/automations`, { headers: { 'sec-fetch-site': 'same-site' } });
    expect(read.status, 'a GET that reads is not held').to.equal(200);
    // the web client's own fetch from another site names its Origin: not a navigation
    expect((await post({ origin: WEB_APP, 'sec-fetch-site': 'cross-site' })).status).to.equal(201);
    const fromApp = await post({ origin: WEB_APP });
    expect(fromApp.status).to.equal(201);
    expect(fromApp.headers.get('access-control-allow-origin')).to.equal(WEB_APP);
    expect(fromApp.headers.get('access-control-allow-credentials')).to.equal('true');

    const preflight = await fetch(`${service()}/api/v1/automations`, {
      method: 'OPTIONS',
      headers: { origin: WEB_APP, 'access-control-request-method': 'POST', 'access-control-request-headers': 'content-type' },
    });
    expect(preflight.status).to.be.oneOf([200, 204]);
    expect(preflight.headers.get('access-control-allow-origin')).to.equal(WEB_APP);
    const evilPreflight = await fetch(`${service()}/api/v1/automations`, {
      method: 'OPTIONS',
      headers: { origin: 'https://evil.example', 'access-control-request-method': 'POST' },
    });
    expect(evilPreflight.headers.get('access-control-allow-origin')).to.equal(null);
    // every answer says it varies with the Origin, whatever Origin it had: a cache keeps them apart
    expect(read.headers.get('vary'), 'no Origin').to.match(/\bOrigin\b/);
    expect(evilPreflight.headers.get('vary'), 'an Origin refused').to.match(/\bOrigin\b/);
    expect(fromApp.headers.get('vary'), 'the web client’s').to.match(/\bOrigin\b/);
    // an API key needs no origin: it is no ambient credential
    expect(
      (
        await h.call('POST', '/api/v1/automations', {
          body: { name: 'with a key', steps: [{ tool: 'message', args: { text: 'x' } }] },
          headers: { origin: 'https://evil.example' },
        })
      ).status,
    ).to.equal(201);
  });

  it('signs in tabs of one browser that started at once, each to its own return_to; a browser keeps 8 KB of sign-ins going at most', async () => {
    const browser = new Browser();
    const start = async (returnTo: string) => {
      const res = await browser.fetch(`${service()}/auth/login?return_to=${encodeURIComponent(returnTo)}`);
      expect(res.status).to.equal(302);
      return res.headers.get('location')!;
    };
    const first = await start('/api/v1/me');
    const second = await start('/api/v1/automations');
    expect(browser.cookieNames(service(), '__Host-sign-in-')).to.have.length(2);
    // the later tab finishes first, then the earlier one: both are signed in, each where it asked to go
    const late = await browser.navigate(second, 'alice');
    expect(late.url).to.equal(`${service()}/api/v1/automations`);
    expect(late.res.status).to.equal(200);
    const early = await browser.navigate(first, 'alice');
    expect(early.url).to.equal(`${service()}/api/v1/me`);
    expect(((await early.res.json()) as Body).tenant_id).to.equal('tenant-a');
    expect(browser.cookieNames(service(), '__Host-sign-in-')).to.deep.equal([]);
    // four started and none finished: all kept (each cookie is under a kilobyte); the first finishes
    const many = [];
    for (const path of ['/api/v1/me', '/api/v1/runs', '/api/v1/sessions', '/api/v1/automations']) many.push(await start(path));
    expect(browser.cookieNames(service(), '__Host-sign-in-')).to.have.length(4);
    expect((await browser.navigate(many[0]!, 'alice')).url).to.equal(`${service()}/api/v1/me`);
    // with the longest return_to a cookie is 4 KB: a third such sign-in clears the older ones past 8 KB, whose
    // callbacks are then refused; the newest goes on
    const long = `/api/v1/me#${'a'.repeat(1980)}`;
    const big = [await start(long), await start(long), await start(long)];
    const names = browser.cookieNames(service(), '__Host-sign-in-');
    expect(names).to.have.length(2);
    expect(names.reduce((n, name) => n + name.length + browser.cookie(service(), name)!.length, 0)).to.be.within(6000, 8192);
    const oldest = await browser.navigate(big[0]!, 'alice');
    expect(oldest.res.status).to.equal(403);
    expect(((await oldest.res.json()) as Body).detail).to.contain('not started in this browser');
    const newest = await browser.navigate(big[2]!, 'alice');
    expect(newest.res.status).to.equal(200);
  });

  it('refuses a forged state, a replayed callback, an unknown tenant, no tenant claim, and a return_to elsewhere', async () => {
    // forged: the state in the URL is not the browser's
    const forged = new Browser();
    await forged.fetch(`${service()}/auth/login`);
    const res = await forged.fetch(`${service()}/auth/callback?code=abc&state=not-the-one`);
    expect(res.status).to.equal(403);
    expect(((await res.json()) as Body).code).to.equal('sign-in-refused');
    // a request target in absolute form, with a port no URL takes: refused the same, and its query never logged
    const absolute = await new Promise<string>((resolve, reject) => {
      const socket = net.connect(port, '127.0.0.1', () =>
        socket.end('GET http://x:99999/auth/callback?code=secret-code-1&state=b HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n'),
      );
      let answer = '';
      socket.setEncoding('utf8');
      socket.on('data', (chunk: string) => (answer += chunk));
      socket.on('end', () => resolve(answer));
      socket.on('error', reject);
    });
    expect(absolute).to.match(/^HTTP\/1\.1 403 /);
    expect(h.logs.join('\n')).not.to.contain('secret-code-1');

    // replayed: the same callback URL with the same sign-in cookie, second time
    const alice = new Browser();
    await alice.navigate(`${service()}/auth/login`, 'alice');
    const callback = alice.visited.find((u) => u.startsWith(`${service()}/auth/callback?`))!;
    const [signInName, signInCookie] = alice.set.find(([name, value]) => name.startsWith('__Host-sign-in-') && value)!;
    const replay = new Browser();
    const replayed = await replay.fetch(callback, { headers: { cookie: `${signInName}=${signInCookie}` } });
    expect(replayed.status).to.equal(403);
    expect(((await replayed.json()) as Body).detail).to.contain('expired or was already used');
    // a login's state sent again with made-up codes: the first is refused by the provider, the rest unasked
    const bogus = new Browser();
    const started = await bogus.fetch(`${service()}/auth/login`);
    const bogusState = new URL(started.headers.get('location')!).searchParams.get('state')!;
    const refusedBefore = h.logs.join('\n').split('sign-in refused').length;
    for (let i = 0; i < 3; i++) {
      const tried = await bogus.fetch(`${service()}/auth/callback?code=made-up-${i}&state=${bogusState}`);
      expect(tried.status).to.equal(403);
      if (i > 0) expect(((await tried.json()) as Body).detail).to.contain('expired or was already used');
    }
    expect(h.logs.join('\n').split('sign-in refused').length - refusedBefore, 'exchanges tried with the provider').to.equal(1);
    // the state alone (what the URL shows) is no sign-in cookie: the login travels sealed
    const stateOnly = await new Browser().fetch(callback, { headers: { cookie: `${signInName}=${new URL(callback).searchParams.get('state')}` } });
    expect(((await stateOnly.json()) as Body).detail).to.contain('not started in this browser');

    // starting sign-ins writes nothing: no one can fill Redis by asking for logins
    const keysNow = async () => (await scanKeys(h.rt.redis, `${h.config.queuePrefix}:sso-*`)).length;
    const before = await keysNow();
    await Promise.all(Array.from({ length: 50 }, () => fetch(`${service()}/auth/login`, { redirect: 'manual' })));
    expect(await keysNow()).to.equal(before);

    for (const login of ['mallory', 'nobody']) {
      const b = new Browser();
      const refused = await b.navigate(`${service()}/auth/login`, login);
      expect(refused.res.status, login).to.equal(403);
      const problem = (await refused.res.json()) as Body;
      expect(problem.code).to.equal('sign-in-refused');
      expect(problem.detail).to.match(login === 'mallory' ? /not a tenant of this service/ : /no org_id claim/);
      expect(b.cookie(service(), '__Host-session')).to.equal(undefined);
    }

    const elsewhere = await fetch(`${service()}/auth/login?return_to=${encodeURIComponent('https://evil.example/steal')}`, { redirect: 'manual' });
    expect(elsewhere.status).to.equal(400);
    // over the spec's 2,000 characters: its sealed cookie would pass the 4 KB a browser keeps, and the sign-in fail as not started here
    const long = await fetch(`${service()}/auth/login?return_to=${encodeURIComponent(`/${'a'.repeat(2000)}`)}`, { redirect: 'manual' });
    expect(long.status).to.equal(400);
    expect(((await long.json()) as Body).errors[0].path).to.equal('/query/return_to');
    // within 2,000 characters, but not within the bytes the cookie holds (each é two bytes, each " escaped): refused
    // as well, where its cookie (7.6 KB) was dropped by the browser; the longest ASCII one fits in 4 KB
    for (const wide of [`/${'é'.repeat(1999)}`, `/${'"'.repeat(1999)}`]) {
      const res = await fetch(`${service()}/auth/login?return_to=${encodeURIComponent(wide)}`, { redirect: 'manual' });
      expect(res.status).to.equal(400);
      expect(((await res.json()) as Body).errors[0].path).to.equal('/query/return_to');
    }
    const longest = await fetch(`${service()}/auth/login?return_to=${encodeURIComponent(`/${'a'.repeat(1999)}`)}`, { redirect: 'manual' });
    expect(longest.status).to.equal(302);
    const cookie = longest.headers.getSetCookie().find((c) => c.startsWith('__Host-sign-in-'))!;
    expect(cookie.split(';')[0]!.length).to.be.at.most(4096);
    const ok = await fetch(`${service()}/auth/login?return_to=${encodeURIComponent(`${WEB_APP}/home`)}`, { redirect: 'manual' });
    expect(ok.status).to.equal(302);
    expect(h.logs.join('\n')).not.to.match(/eyJ[A-Za-z0-9_-]{20,}\./);
  });

  it('refuses an ID token for another audience, an expired one and one with another nonce, and logs no token', async () => {
    const cases: [string, (c: Record<string, unknown>) => Record<string, unknown>][] = [
      ['wrong audience', (c) => ({ ...c, aud: 'someone-else' })],
      ['expired', (c) => ({ ...c, iat: Math.floor(Date.now() / 1000) - 7200, exp: Math.floor(Date.now() / 1000) - 3600 })],
      ['another nonce', (c) => ({ ...c, nonce: 'not-the-one-we-sent' })],
    ];
    try {
      for (const [what, tamper] of cases) {
        idp.tamper = tamper;
        const b = new Browser();
        const refused = await b.navigate(`${service()}/auth/login`, 'alice');
        expect(refused.res.status, what).to.equal(403);
        expect(((await refused.res.json()) as Body).code, what).to.equal('sign-in-refused');
        expect(b.cookie(service(), '__Host-session'), what).to.equal(undefined);
      }
    } finally {
      idp.tamper = null;
    }
    const refusals = h.logs.filter((l) => l.includes('sign-in refused'));
    expect(refusals.length).to.be.at.least(3);
    // refused for their claims (the signature is the provider's own): audience, expiry, nonce
    const reasons = refusals.slice(-3).map((l) => JSON.parse(l).err as string);
    expect(reasons).to.deep.equal([
      'unexpected JWT claim value encountered',
      'JWT timestamp claim value failed validation',
      'unexpected JWT claim value encountered',
    ]);
    expect(h.logs.join('\n')).not.to.match(/eyJ[A-Za-z0-9_-]{20,}\./);
    // untouched, the same account signs in
    expect((await new Browser().navigate(`${service()}/auth/login`, 'alice')).url).to.equal(`${service()}/api/v1/me`);
  });
});

describe('sign-in while Redis does not answer', function () {
  this.timeout(60_000);
  let idp: Idp;
  let h: Harness;
  let port: number;
  let redis: ChildProcess;
  let stopped = false;
  const resume = () => {
    redis.kill('SIGCONT');
    stopped = false;
  };

  before(async () => {
    // a private redis-server, stopped with SIGSTOP: its connections hang as on a network partition
    const redisPort = await freePort();
    redis = spawn('redis-server', ['--port', String(redisPort), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'], { stdio: 'ignore' });
    await eventually(() => listening(redisPort), 'the private redis-server to listen');
    port = await freePort();
    const redirect = `http://127.0.0.1:${port}/auth/callback`;
    idp = await startIdp({ redirectUri: redirect, orgOf: () => 'org-acme' });
    h = await startHarness({
      workers: false,
      port,
      env: {
        REDIS_URL: `redis://127.0.0.1:${redisPort}`,
        SERVICE_OIDC_ISSUER: idp.issuer,
        SERVICE_OIDC_CLIENT_ID: idp.clientId,
        SERVICE_OIDC_CLIENT_SECRET: idp.clientSecret,
        SERVICE_OIDC_REDIRECT_URL: redirect,
        SERVICE_OIDC_TENANT_MAP: 'org-acme:tenant-a',
      },
    });
  });
  after(async () => {
    if (stopped) resume();
    await h?.close();
    await idp?.close();
    redis?.kill('SIGKILL');
  });

  const service = () => `http://127.0.0.1:${port}`;
  /** The answer within 2.5 s (Redis's deadline is 1.5 s), or a failure that says it was held. */
  const timed = async (what: string, call: () => Promise<Response>, ms = 2500): Promise<Response> => {
    let timer: NodeJS.Timeout | undefined;
    const held = new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new Error(`${what}: no answer within ${ms} ms`)), ms)));
    try {
      return await Promise.race([call(), held]);
    } finally {
      clearTimeout(timer);
    }
  };

  it('answers a signed-in request, a sign-in’s callback and a logout 503 with Retry-After: 5 within 2.5 s, never the session taken unchecked; API keys go on', async () => {
    const alice = new Browser();
    expect((await alice.navigate(`${service()}/auth/login`, 'alice')).url).to.equal(`${service()}/api/v1/me`);
    const cookie = `__Host-session=${alice.cookie(service(), '__Host-session')}`;
    // each route once while Redis answers: what is timed below is the outage, not a route's first use
    expect((await fetch(`${service()}/api/v1/me`, { headers: { cookie } })).status).to.equal(200);
    expect((await fetch(`${service()}/api/v1/runs`, { headers: { cookie } })).status).to.equal(200);
    expect((await h.call('GET', '/api/v1/runs')).status).to.equal(200);

    redis.kill('SIGSTOP');
    stopped = true;
    try {
      const byKey = await timed('an API key request', () => fetch(`${service()}/api/v1/runs`, { headers: { authorization: `Bearer ${KEYS.a}` } }));
      expect(byKey.status).to.equal(200);
      for (const path of ['/api/v1/me', '/api/v1/runs']) {
        const res = await timed(`GET ${path} with the session`, () => fetch(`${service()}${path}`, { headers: { cookie } }));
        expect(res.status, path).to.equal(503);
        expect(res.headers.get('retry-after'), path).to.equal('5');
        expect(((await res.json()) as Body).code, path).to.equal('unavailable');
      }
      // the session cannot be ended without Redis: 503, and the browser keeps its cookie to log out again
      const out = await timed('a logout', () => alice.fetch(`${service()}/auth/logout`, { method: 'POST', headers: { origin: service() } }));
      expect(out.status).to.equal(503);
      expect(out.headers.get('retry-after')).to.equal('5');
      expect(alice.cookie(service(), '__Host-session')).to.equal(cookie.slice('__Host-session='.length));
      // a sign-in whose callback cannot check that its login is unused is refused for now (the provider's pages need no Redis)
      const bob = new Browser();
      const during = await timed('a sign-in', () => bob.navigate(`${service()}/auth/login`, 'alice').then((d) => d.res), 6000);
      expect(bob.visited.at(-1)).to.contain('/auth/callback');
      expect(during.status).to.equal(503);
      expect(during.headers.get('retry-after')).to.equal('5');
      expect(bob.cookie(service(), '__Host-session')).to.equal(undefined);
    } finally {
      if (stopped) resume();
    }
    // the logout asked again once Redis answers is a 204 (the first one's delete may have landed late), and the session is ended
    expect((await alice.fetch(`${service()}/auth/logout`, { method: 'POST', headers: { origin: service() } })).status).to.equal(204);
    expect((await fetch(`${service()}/api/v1/me`, { headers: { cookie } })).status).to.equal(401);
  });
});
