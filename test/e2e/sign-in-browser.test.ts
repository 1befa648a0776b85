// Sign-in as a person does it: headless Chromium (Debian's package; .ci/run installs it) goes through the
// provider's login and consent pages and back, then a web client on another origin calls the API with
// the session cookie (CORS with credentials) and follows a run's event stream with EventSource
// withCredentials. A person of another tenant sees none of it.
import http from 'node:http';
import { expect } from 'chai';
import type { Browser, Page } from 'playwright-core';
import { launchChromium } from '../support/chromium.js';
import { freePort, startHarness, type Harness } from '../support/harness.js';
import { startIdp, type Idp } from '../support/idp.js';

// eslint-disable-next-line @typescript-eslint/no-explicit-any
type Body = Record<string, any>;

describe('sign-in in a browser', function () {
  this.timeout(60_000);
  let idp: Idp;
  let h: Harness;
  let browser: Browser;
  let app: http.Server;
  let service: string;
  let appOrigin: string;

  before(async function () {
    const launched = await launchChromium();
    if (!launched) return this.skip();
    browser = launched;
    const [port, appPort] = [await freePort(), await freePort()];
    service = `http://127.0.0.1:${port}`;
    appOrigin = `http://127.0.0.1:${appPort}`;
    // the web client: another origin of the same site, as app.example.com is to api.example.com
    app = http.createServer((_req, res) => res.writeHead(200, { 'content-type': 'text/html' }).end('<!doctype html><title>web client</title><p>app</p>'));
    await new Promise<void>((r) => app.listen(appPort, '127.0.0.1', r));
    idp = await startIdp({ redirectUri: `${service}/auth/callback`, orgOf: (login) => ({ alice: 'org-acme', bob: 'org-globex' })[login] });
    h = await startHarness({
      port,
      env: {
        SERVICE_OIDC_ISSUER: idp.issuer,
        SERVICE_OIDC_CLIENT_ID: idp.clientId,
        SERVICE_OIDC_CLIENT_SECRET: idp.clientSecret,
        SERVICE_OIDC_REDIRECT_URL: `${service}/auth/callback`,
        SERVICE_OIDC_TENANT_MAP: 'org-acme:tenant-a,org-globex:tenant-b',
        SERVICE_CORS_ORIGINS: appOrigin,
      },
    });
  });
  after(async () => {
    await browser?.close();
    await h?.close();
    await idp?.close();
    await new Promise<void>((r) => (app ? app.close(() => r()) : r()));
  });

  /** Signs `login` in from a fresh browser profile and lands on the web client. */
  async function signIn(login: string): Promise<Page> {
    const page = await (await browser.newContext()).newPage();
    await page.goto(`${service}/auth/login?return_to=${encodeURIComponent(`${appOrigin}/app.html`)}`);
    await page.fill('input[name=login]', login);
    await page.fill('input[name=password]', 'any');
    await page.click('button[type=submit]');
    // the consent page, then back through the callback to the web client
    await page.click('button[type=submit]');
    await page.waitForURL(`${appOrigin}/app.html`, { timeout: 15_000 });
    return page;
  }

  it('goes through login, consent and callback, then the web client calls the API and follows a run with the cookie', async () => {
    const alice = await signIn('alice');
    const me = (await alice.evaluate(async (svc) => (await fetch(`${svc}/api/v1/me`, { credentials: 'include' })).json(), service)) as Body;
    expect(me).to.deep.include({ tenant_id: 'tenant-a', auth: 'session' });
    expect(me.user.email).to.equal('alice@example.com');

    // browser-side code as text: the test's compiler would wrap named functions in helpers the page lacks
    const followed = (await alice.evaluate(`(async (svc) => {
      const accepted = await fetch(svc + '/api/v1/autonomy/run', {
        method: 'POST',
        credentials: 'include',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ steps: [{ tool: 'message', args: { text: 'from the browser' } }] }),
      });
      const body = await accepted.json();
      const types = await new Promise((resolve, reject) => {
        const seen = [];
        const stream = new EventSource(svc + body.events_url, { withCredentials: true });
        for (const type of ['run.queued', 'run.started', 'step.started', 'step.finished', 'run.finished'])
          stream.addEventListener(type, () => {
            seen.push(type);
            if (type === 'run.finished') {
              stream.close();
              resolve(seen);
            }
          });
        stream.onerror = () => {
          if (stream.readyState === EventSource.CLOSED) reject(new Error('the event stream was refused'));
        };
        setTimeout(() => reject(new Error('no run.finished; saw ' + seen.join(', '))), 15000);
      });
      return { status: accepted.status, run: body.run_id, types };
    })(${JSON.stringify(service)})`)) as { status: number; run: string; types: string[] };
    expect(followed.status).to.equal(202);
    expect(followed.types).to.include('run.started').and.include('run.finished');

    // Swagger UI's "try it out", on the service's own origin, works with the session and no key
    const docs = await alice.context().newPage();
    await docs.goto(`${service}/docs`);
    const op = docs.locator('#operations-automations-listAutomations');
    await op.locator('.opblock-summary').click({ timeout: 20_000 });
    await op.locator('button.try-out__btn').click();
    await op.locator('button.execute').click();
    const status = op.locator('.live-responses-table tr.response .response-col_status').first();
    await status.waitFor({ timeout: 10_000 });
    expect((await status.textContent())?.trim()).to.equal('200');

    // bob, of another tenant, signed in the same way, sees nothing of alice's
    const bob = await signIn('bob');
    const seen = (await bob.evaluate(
      async ([svc, run]) => ({
        me: ((await (await fetch(`${svc}/api/v1/me`, { credentials: 'include' })).json()) as Body).tenant_id,
        run: (await fetch(`${svc}/api/v1/runs/${run}`, { credentials: 'include' })).status,
        list: ((await (await fetch(`${svc}/api/v1/runs`, { credentials: 'include' })).json()) as Body).data.map((r: Body) => r.id),
      }),
      [service, followed.run] as const,
    )) as { me: string; run: number; list: string[] };
    expect(seen.me).to.equal('tenant-b');
    expect(seen.run).to.equal(404);
    expect(seen.list).not.to.include(followed.run);
  });
});
