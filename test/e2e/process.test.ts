// The entry points as ops run them: start, print, answer, and stop cleanly on SIGTERM; fail fast
// with one clear line when Redis is down or the environment is bad.
import { spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { expect } from 'chai';
import { deleteRedisPrefix, freePort, KEYS, testRedisUrl, uniquePrefix } from '../support/harness.js';

type Proc = { child: ChildProcess; out: () => string; exited: Promise<{ code: number | null; ms: number }> };

const start = (entry: string, env: Record<string, string>): Proc => spawnProc(process.execPath, ['--import', 'tsx', entry], env);

function spawnProc(command: string, args: string[], env: Record<string, string>): Proc {
  const started = Date.now();
  // detached: its own process group, so cleanup can kill the whole group
  const child = spawn(command, args, { env: { ...process.env, ...env }, detached: true, stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  child.stdout!.on('data', (d) => (out += d));
  child.stderr!.on('data', (d) => (out += d));
  const exited = new Promise<{ code: number | null; ms: number }>((resolve) => child.on('exit', (code) => resolve({ code, ms: Date.now() - started })));
  return { child, out: () => out, exited };
}

async function waitFor(p: Proc, pattern: RegExp, ms = 30_000): Promise<RegExpMatchArray> {
  const until = Date.now() + ms;
  for (;;) {
    const m = p.out().match(pattern);
    if (m) return m;
    if (Date.now() > until || p.child.exitCode !== null) throw new Error(`no ${pattern} in output:\n${p.out()}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

describe('processes', function () {
  this.timeout(40_000);
  const procs: Proc[] = [];
  let dataDir: string;
  let prefix: string;
  beforeEach(async () => {
    dataDir = await fs.mkdtemp(path.join(os.tmpdir(), 'svc-proc-'));
    prefix = uniquePrefix();
  });
  afterEach(async () => {
    for (const p of procs.splice(0)) {
      try {
        process.kill(-p.child.pid!, 'SIGKILL');
      } catch {
        // already gone
      }
    }
    await deleteRedisPrefix(prefix);
    await fs.rm(dataDir, { recursive: true, force: true });
  });

  const env = () => ({
    REDIS_URL: testRedisUrl(),
    SERVICE_QUEUE_PREFIX: prefix,
    SERVICE_DATA_DIR: dataDir,
    PORT: '0',
    SERVICE_API_KEYS: `acme:${KEYS.a}`,
    SERVICE_ADMIN_KEYS: KEYS.admin,
    LOG_LEVEL: 'info',
  });

  it('npm start (main.ts) serves the API and workers, prints where things are, and stops cleanly on SIGTERM', async () => {
    const p = start('main.ts', env());
    procs.push(p);
    const [, url] = await waitFor(p, /listening on (http:\/\/localhost:\d+)/);
    await waitFor(p, /API docs: +http:\/\/localhost:\d+\/docs/);
    await waitFor(p, /Queues: +http:\/\/localhost:\d+\/admin\/queues/);
    await waitFor(p, /keys create --tenant/);
    expect(p.out()).to.match(/worker process ready|workers ready/);
    const res = await fetch(`${url}/api/v1/automations`, { headers: { authorization: `Bearer ${KEYS.a}` } });
    expect(res.status).to.equal(200);
    p.child.kill('SIGTERM');
    const { code } = await p.exited;
    expect(code, p.out()).to.equal(0);
    expect(p.out()).to.contain('stopped cleanly');
    expect(p.out()).not.to.contain(KEYS.a);
  });

  it('prints readable log lines at a terminal outside production (pino-pretty), JSON lines otherwise; per-template lines are debug', async () => {
    // `script` gives the service a pseudo-terminal as its stdout
    const cmd = [process.execPath, '--import', 'tsx', 'main.ts'].map((a) => `'${a}'`).join(' ');
    const p = spawnProc('script', ['-qfec', cmd, '/dev/null'], env());
    procs.push(p);
    await waitFor(p, /listening on http:\/\/localhost:\d+/);
    await waitFor(p, /INFO\S*: \S*workers ready/);
    expect(p.out()).not.to.contain('"level":30');
    const json = start('main.ts', env());
    procs.push(json);
    await waitFor(json, /"msg":"workers ready"/);
    expect(json.out()).not.to.contain('template loaded');
  });

  it('the Procfile web and worker processes start and stop cleanly', async () => {
    const web = start('api/main.ts', env());
    const worker = start('workers/main.ts', env());
    procs.push(web, worker);
    const [, url] = await waitFor(web, /"url":"(http:\/\/localhost:\d+)"/);
    await waitFor(worker, /worker process ready|workers ready/);
    expect((await fetch(`${url}/readyz`)).status).to.equal(200);
    web.child.kill('SIGTERM');
    worker.child.kill('SIGTERM');
    expect((await web.exited).code, web.out()).to.equal(0);
    expect((await worker.exited).code, worker.out()).to.equal(0);
  });

  it('a worker serves its own /metrics (run durations, finishes by reason, queue waits) and /healthz on SERVICE_WORKER_METRICS_PORT', async () => {
    const port = await freePort();
    const web = start('api/main.ts', env());
    const worker = start('workers/main.ts', { ...env(), SERVICE_WORKER_METRICS_PORT: String(port) });
    procs.push(web, worker);
    const [, url] = await waitFor(web, /"url":"(http:\/\/localhost:\d+)"/);
    const [, metricsUrl] = await waitFor(worker, /"url":"(http:\/\/localhost:\d+)".*worker metrics listening/);
    expect(metricsUrl).to.equal(`http://localhost:${port}`);
    const health = await fetch(`${metricsUrl}/healthz`);
    expect(health.status).to.equal(200);
    expect(await health.json()).to.deep.include({ status: 'ok', process: 'worker', redis: 'ready' });
    const run = await fetch(`${url}/api/v1/autonomy/run`, {
      method: 'POST',
      headers: { authorization: `Bearer ${KEYS.a}`, 'content-type': 'application/json' },
      body: JSON.stringify({ steps: [{ tool: 'shell', args: { command: 'exit 3' } }] }),
    });
    expect(run.status).to.equal(202);
    const { run_id } = (await run.json()) as { run_id: string };
    const scrape = (key: string | null) => fetch(`${metricsUrl}/metrics`, { headers: key ? { authorization: `Bearer ${key}` } : {} });
    let text = '';
    for (const until = Date.now() + 15_000; Date.now() < until && !/automation_runs_finished_total\{/.test(text);) {
      await new Promise((r) => setTimeout(r, 100));
      text = await (await scrape(KEYS.admin)).text();
    }
    expect(text, `run ${run_id}`).to.match(/^automation_runs_finished_total\{kind="autonomy",status="failed",reason="nonzero-exit"\} 1$/m);
    expect(text).to.match(/^automation_run_duration_seconds_count\{kind="autonomy",status="failed"\} 1$/m);
    expect(text).to.match(/^automation_run_queue_wait_seconds_count\{kind="autonomy"\} 1$/m);
    expect(text).to.match(/^automation_queue_jobs\{queue="runs",state="failed"\} 1$/m);
    expect(text).to.match(/^automation_process_cpu_seconds_total /m);
    // the web process never ran it: its own counters do not have it, its store-wide gauges do
    const webText = await (await fetch(`${url}/metrics`, { headers: { authorization: `Bearer ${KEYS.admin}` } })).text();
    expect(webText).not.to.match(/^automation_runs_finished_total\{/m);
    expect(webText).to.match(/^automation_runs\{kind="autonomy",status="failed"\} 1$/m);
    expect((await scrape(null)).status).to.equal(401);
    expect((await scrape(KEYS.a)).status).to.equal(401);
    expect((await fetch(`${metricsUrl}/other`)).status).to.equal(404);
  });

  it('says in one line that Redis cannot be reached, and how to fix it, instead of hanging', async () => {
    const p = start('main.ts', { ...env(), REDIS_URL: 'redis://127.0.0.1:1' });
    procs.push(p);
    const { code, ms } = await p.exited;
    expect(code).to.equal(1);
    expect(ms).to.be.below(10_000);
    const lines = p.out().trim().split('\n');
    expect(
      lines.some((l) => /Redis is not reachable at redis:\/\/127\.0\.0\.1:1.*REDIS_URL/.test(l)),
      p.out(),
    ).to.equal(true);
  });

  it('stops before listening when the environment is bad, naming each bad variable', async () => {
    const p = start('main.ts', { ...env(), PORT: 'eighty', SERVICE_AUTH: 'sometimes' });
    procs.push(p);
    const { code } = await p.exited;
    expect(code).to.equal(1);
    expect(p.out()).to.contain('PORT').and.contain('SERVICE_AUTH');
  });

  it('refuses SERVICE_AUTH=none in production', async () => {
    const p = start('api/main.ts', {
      ...env(),
      NODE_ENV: 'production',
      SERVICE_STORE: 'sqlite',
      SERVICE_AUTH: 'none',
      SERVICE_SECRET_KEY: 'ab'.repeat(32),
      SERVICE_EVIDENCE_KEY: 'cd'.repeat(32),
    });
    procs.push(p);
    expect((await p.exited).code).to.equal(1);
    expect(p.out()).to.contain('SERVICE_AUTH: "none" is refused when NODE_ENV=production');
  });

  it('refuses to start when the data dir is inside the workspace root, where tools could read the secret key', async () => {
    const p = start('main.ts', { ...env(), SERVICE_WORKSPACE_ROOT: path.dirname(dataDir) });
    procs.push(p);
    expect((await p.exited).code).to.equal(1);
    expect(p.out()).to.match(/SERVICE_DATA_DIR: .* is inside SERVICE_WORKSPACE_ROOT/);
  });

  it('refuses to start in production with no sandbox while tenants may use shell, unless SERVICE_SANDBOX=none is set', async () => {
    const prod = {
      ...env(),
      NODE_ENV: 'production',
      SERVICE_STORE: 'sqlite',
      SERVICE_SECRET_KEY: 'ab'.repeat(32),
      SERVICE_EVIDENCE_KEY: 'cd'.repeat(32),
      SERVICE_WORKSPACE_ROOT: path.join(dataDir, '..', `${path.basename(dataDir)}-ws`),
    };
    // a PATH with no bwrap on it: the sandbox cannot be found
    const p = start('api/main.ts', { ...prod, PATH: '/nonexistent' });
    procs.push(p);
    expect((await p.exited).code).to.equal(1);
    expect(p.out()).to.contain('SERVICE_SANDBOX: bwrap is not installed and tenants may use shell');
    const explicit = start('api/main.ts', { ...prod, PATH: '/nonexistent', SERVICE_SANDBOX: 'none' });
    procs.push(explicit);
    const [, url] = await waitFor(explicit, /"url":"(http:\/\/localhost:\d+)"/);
    const ready = (await (await fetch(`${url}/readyz`)).json()) as { sandbox: { kind: string; warning?: string } };
    expect(ready.sandbox.kind).to.equal('none');
    expect(ready.sandbox.warning).to.be.a('string');
    expect(explicit.out()).to.contain('tool processes run without a sandbox');
  });
});
