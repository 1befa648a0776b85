// The entry points as ops run them: start, print, answer, and stop cleanly on SIGTERM; fail fast
// with one clear line when Redis is down or the environment is bad.
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import fs from 'node:fs/promises';
import os from 'node:os';
import net from 'node:net';
import path from 'node:path';
import { expect } from 'chai';
import { startLocalRedis } from '../../engine/process/index.js';
import { builtEntry } from '../support/built.js';
import {
  deleteRedisPrefix,
  eventually,
  finishedRun,
  freePort,
  KEYS,
  processesMatching,
  sameDeployment,
  startHarness,
  testRedisUrl,
  uniquePrefix,
} from '../support/harness.js';

type Proc = { child: ChildProcess; out: () => string; exited: Promise<{ code: number | null; signal: NodeJS.Signals | null; ms: number }> };

/** A process of the service as the Procfile starts it: its built entry point (`api/main.ts`: dist/api/main.js). */
const start = (entry: string, env: Record<string, string>): Proc => spawnProc(process.execPath, [builtEntry(entry)], env);

function spawnProc(command: string, args: string[], env: Record<string, string>): Proc {
  const started = Date.now();
  // detached: its own process group, so cleanup can kill the whole group
  const child = spawn(command, args, { env: { ...process.env, ...env }, detached: true, stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  child.stdout!.on('data', (d) => (out += d));
  child.stderr!.on('data', (d) => (out += d));
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null; ms: number }>((resolve) =>
    child.on('exit', (code, signal) => resolve({ code, signal, ms: Date.now() - started })),
  );
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
    // and the workspace root a test gave beside it, which the service made
    for (const dir of [dataDir, `${dataDir}-ws`]) await fs.rm(dir, { recursive: true, force: true });
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
    // the log line is written by the logger's own stream: on a loaded machine after the banner
    await waitFor(p, /worker process ready|workers ready/);
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
    const cmd = [process.execPath, builtEntry('main.ts')].map((a) => `'${a}'`).join(' ');
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
    // the run's end is counted before its job is moved to failed (a few round trips later): scraped until both are in
    const settled = (t: string) => /automation_runs_finished_total\{/.test(t) && /^automation_queue_jobs\{queue="runs",state="failed"\} [1-9]/m.test(t);
    for (const until = Date.now() + 15_000; Date.now() < until && !settled(text);) {
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
    // request targets no URL parses are paths it does not serve: the worker answers and lives on
    for (const target of ['//[', 'http://[/x', 'http://x:99999/']) {
      const answer = await rawRequest(port, `GET ${target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n`);
      expect(answer, target).to.match(/^HTTP\/1\.1 404 /);
    }
    expect((await fetch(`${metricsUrl}/healthz?probe=1`)).status).to.equal(200);
  });

  /** A web process whose request's body is still coming (a keep-alive connection) when `signals` SIGTERMs come at once; the body comes after. */
  async function stoppedWithRequestInFlight(signals: number) {
    const web = start('api/main.ts', { ...env(), SERVICE_SHUTDOWN_GRACE_SECONDS: '6' });
    procs.push(web);
    const [, port] = await waitFor(web, /"url":"http:\/\/localhost:(\d+)"/);
    const request = halfSentRun(Number(port));
    await request.sent;
    for (let i = 0; i < signals; i++) web.child.kill('SIGTERM');
    await waitFor(web, /shutting down/);
    await new Promise((r) => setTimeout(r, 300));
    request.finish();
    return { web, answer: await request.answer, answeredAt: Date.now() };
  }

  it('a web process stopped with a request in flight answers it with Connection: close and exits 0 once it is answered', async () => {
    const { web, answer, answeredAt } = await stoppedWithRequestInFlight(1);
    expect(answer).to.match(/^HTTP\/1\.1 202 /);
    expect(answer).to.match(/^connection: close\r$/im);
    const { code } = await web.exited;
    expect(code, web.out()).to.equal(0);
    // not at the end of its 6 s grace period
    expect(Date.now() - answeredAt).to.be.below(3500);
    expect(web.out()).to.contain('stopped cleanly');
  });

  it('a web process given a second signal while it waits for a request exits 1 at once, as it says', async () => {
    const web = start('api/main.ts', { ...env(), SERVICE_SHUTDOWN_GRACE_SECONDS: '20' });
    procs.push(web);
    const [, port] = await waitFor(web, /"url":"http:\/\/localhost:(\d+)"/);
    const request = halfSentRun(Number(port));
    await request.sent;
    web.child.kill('SIGTERM');
    await waitFor(web, /shutting down/);
    // asked again, not the first signal's copy (which comes at once)
    await new Promise((r) => setTimeout(r, 1200));
    const again = Date.now();
    web.child.kill('SIGTERM');
    const { code, signal } = await web.exited;
    // exited by its own hand (its exit handlers ran), not killed by the signal's default
    expect({ code, signal }, web.out()).to.deep.equal({ code: 1, signal: null });
    expect(Date.now() - again).to.be.below(3000);
    expect(web.out()).to.contain('second signal: exiting now');
  });

  it('a web process takes a signal that comes twice at once (a wrapper such as npm forwarding its group’s) as one: it stops cleanly', async () => {
    const { web, answer } = await stoppedWithRequestInFlight(2);
    expect(answer).to.match(/^HTTP\/1\.1 202 /);
    const { code } = await web.exited;
    expect(code, web.out()).to.equal(0);
    expect(web.out()).to.contain('stopped cleanly').and.not.contain('second signal');
  });

  it('a web process cuts a request still unanswered near the end of the grace period, then closes the store and Redis and exits 0', async () => {
    const web = start('api/main.ts', { ...env(), SERVICE_SHUTDOWN_GRACE_SECONDS: '2' });
    procs.push(web);
    const [, port] = await waitFor(web, /"url":"http:\/\/localhost:(\d+)"/);
    const request = halfSentRun(Number(port));
    await request.sent;
    const stoppedAt = Date.now();
    web.child.kill('SIGTERM');
    const { code } = await web.exited;
    // 0: ended by the cut, before its 2 s grace timer (which exits 1 with the work unfinished); the bound allows
    // for a busy machine's delays in the signal and in the exit's news
    expect(code, web.out()).to.equal(0);
    expect(Date.now() - stoppedAt).to.be.below(3500);
    expect(web.out()).to.contain('closing the connections of requests still in flight').and.contain('stopped cleanly');
    expect(await request.answer).to.equal('');
  });

  it('npm start stopped while a run runs and a request is in flight: its workers do not wait for the web’s close, the run goes back to the queue and the process exits 0 within the grace period', async () => {
    const h = await startHarness({ workers: false });
    try {
      const p = start('main.ts', {
        ...sameDeployment(h),
        REDIS_URL: h.config.redisUrl,
        PORT: '0',
        SERVICE_API_KEYS: `tenant-a:${KEYS.a},tenant-b:${KEYS.b}`,
        SERVICE_SHUTDOWN_GRACE_SECONDS: '3',
        LOG_LEVEL: 'info',
      });
      procs.push(p);
      const [, port] = await waitFor(p, /listening on http:\/\/localhost:(\d+)/);
      const marker = `sleep ${7000 + Math.floor(Math.random() * 3000)}`;
      const res = await h.call('POST', '/api/v1/autonomy/run', {
        body: { steps: [{ tool: 'shell', args: { command: `${marker} & wait` } }], budget_seconds: 120 },
      });
      const id = res.body.run_id as string;
      await eventually(async () => (await h.call('GET', `/api/v1/runs/${id}`)).body.steps[0]?.status === 'running', 'the step to run', 15_000);
      await eventually(() => processesMatching(marker) > 0, 'the sleep to start');
      // the web's close lasts the whole grace period: the workers' must not wait for it
      const request = halfSentRun(Number(port));
      await request.sent;
      const stoppedAt = Date.now();
      p.child.kill('SIGTERM');
      const { code } = await p.exited;
      // 0: before its 3 s grace timer (which exits 1 with the work unfinished)
      expect(code, p.out()).to.equal(0);
      expect(Date.now() - stoppedAt).to.be.below(4500);
      expect(p.out()).to.contain('interrupting runs');
      // a sleep left behind would live for over 7,000 s
      await eventually(() => processesMatching(marker) === 0, 'the step’s sleep to be killed', 10_000);
      expect((await h.call('GET', `/api/v1/runs/${id}`)).body).to.deep.include({ status: 'queued', attempt: 2 });
    } finally {
      await h.close();
    }
  });

  it('refuses SERVICE_SHUTDOWN_GRACE_SECONDS=0; at the least, 1 s, a worker still hands its running runs back to the queue before it exits', async () => {
    const refused = start('workers/main.ts', { ...env(), SERVICE_SHUTDOWN_GRACE_SECONDS: '0' });
    procs.push(refused);
    await waitFor(refused, /SERVICE_SHUTDOWN_GRACE_SECONDS: expected a whole number from 1 to/, 10_000);
    expect((await refused.exited).code).to.equal(1);
    const h = await startHarness({ workers: false });
    try {
      const worker = start('workers/main.ts', { ...sameDeployment(h), REDIS_URL: h.config.redisUrl, SERVICE_SHUTDOWN_GRACE_SECONDS: '1' });
      procs.push(worker);
      await waitFor(worker, /workers ready/);
      const marker = `sleep ${7000 + Math.floor(Math.random() * 3000)}`;
      const res = await h.call('POST', '/api/v1/autonomy/run', {
        body: { steps: [{ tool: 'shell', args: { command: `${marker} & wait` } }], budget_seconds: 120 },
      });
      const id = res.body.run_id as string;
      await eventually(() => processesMatching(marker) > 0, 'the sleep to start', 15_000);
      worker.child.kill('SIGTERM');
      expect((await worker.exited).code, worker.out()).to.equal(0);
      await eventually(() => processesMatching(marker) === 0, 'the step’s sleep to be killed', 10_000);
      expect((await h.call('GET', `/api/v1/runs/${id}`)).body).to.deep.include({ status: 'queued', attempt: 2 });
    } finally {
      await h.close();
    }
  });

  it('hands a run back to the queue when the platform signals every process of the machine (Heroku), the step’s included', async () => {
    const h = await startHarness({ workers: false });
    try {
      const worker = start('workers/main.ts', { ...sameDeployment(h), REDIS_URL: h.config.redisUrl, SERVICE_SHUTDOWN_GRACE_SECONDS: '5' });
      procs.push(worker);
      await waitFor(worker, /workers ready/);
      const marker = `sleep ${10_000 + Math.floor(Math.random() * 3000)}`;
      const res = await h.call('POST', '/api/v1/autonomy/run', { body: { steps: [{ tool: 'shell', args: { command: marker } }], budget_seconds: 120 } });
      const id = res.body.run_id as string;
      await eventually(() => processesMatching(marker) > 0, 'the sleep to start', 15_000);
      // the step's processes first, as a platform's signal to all may reach them first
      spawnSync('pkill', ['-TERM', '-f', '--', marker]);
      worker.child.kill('SIGTERM');
      expect((await worker.exited).code, worker.out()).to.equal(0);
      expect((await h.call('GET', `/api/v1/runs/${id}`)).body, 'a deploy, not the run’s failure').to.deep.include({ status: 'queued', attempt: 2 });
      // a step killed by the same signal while no shutdown is under way is the run's own failure
      const other = start('workers/main.ts', { ...sameDeployment(h), REDIS_URL: h.config.redisUrl });
      procs.push(other);
      await waitFor(other, /workers ready/);
      const lone = `sleep ${13_000 + Math.floor(Math.random() * 3000)}`;
      const killed = await h.call('POST', '/api/v1/autonomy/run', { body: { steps: [{ tool: 'shell', args: { command: lone } }], budget_seconds: 120 } });
      await eventually(() => processesMatching(lone) > 0, 'the second sleep to start', 15_000);
      spawnSync('pkill', ['-TERM', '-f', '--', lone]);
      const failed = await finishedRun(h, killed.body.run_id as string);
      expect(failed).to.deep.include({ status: 'failed', attempt: 1 });
      other.child.kill('SIGTERM');
      await other.exited;
    } finally {
      await h.close();
    }
  });

  it('a worker’s /healthz says 503 within about a second while Redis is hung, and 200 again once it answers', async () => {
    const local = await startLocalRedis({ dataDir });
    try {
      const worker = start('workers/main.ts', { ...env(), REDIS_URL: local.url, SERVICE_WORKER_METRICS_PORT: String(await freePort()) });
      procs.push(worker);
      const [, metricsUrl] = await waitFor(worker, /"url":"(http:\/\/localhost:\d+)".*worker metrics listening/);
      // its port listens before its workers start (a port in use refuses the start before any run is taken): 503 until they run
      await eventually(async () => (await fetch(`${metricsUrl}/healthz`)).status === 200 || null, 'the worker to be healthy', 5000);
      process.kill(local.pid, 'SIGSTOP');
      try {
        const started = Date.now();
        const health = await fetch(`${metricsUrl}/healthz`, { signal: AbortSignal.timeout(5000) });
        expect(health.status).to.equal(503);
        expect(await health.json()).to.deep.include({ status: 'degraded', redis: 'no answer within 1000 ms' });
        // a probe that waited for Redis would be cut by the 5 s signal above
        expect(Date.now() - started).to.be.below(3000);
      } finally {
        process.kill(local.pid, 'SIGCONT');
      }
      // 200 again once Redis answers: what the worker asked while it was stopped comes back first
      await eventually(async () => (await fetch(`${metricsUrl}/healthz`)).status === 200 || null, 'the worker to be healthy again', 5000);
    } finally {
      await local.stop();
    }
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

  it('says in one line which setting it cannot start with (a port in use, a data dir that is a file, a key given to two tenants), and takes no run first', async function () {
    // seven processes started one after another (40 s under a loaded machine, past the file's bound)
    this.timeout(90_000);
    const h = await startHarness({ workers: false });
    try {
      const marker = `sleep ${3000 + Math.floor(Math.random() * 1000)}`;
      const ids: string[] = [];
      for (let i = 0; i < 2; i++)
        ids.push((await h.call('POST', '/api/v1/autonomy/run', { body: { steps: [{ tool: 'shell', args: { command: marker } }] } })).body.run_id);
      const port = new URL(h.url).port;
      const shared = { ...sameDeployment(h), REDIS_URL: h.config.redisUrl, SERVICE_API_KEYS: `tenant-a:${KEYS.a}` };
      for (const [entry, variable, extra] of [
        ['main.ts', 'PORT', { PORT: port }],
        ['api/main.ts', 'PORT', { PORT: port }],
        ['workers/main.ts', 'SERVICE_WORKER_METRICS_PORT', { SERVICE_WORKER_METRICS_PORT: port }],
      ] as const) {
        const p = start(entry, { ...shared, ...extra });
        procs.push(p);
        const { code } = await p.exited;
        expect(code, p.out()).to.equal(1);
        expect(p.out(), entry).to.contain(`${variable}: port ${port} is in use by another process`);
        expect(p.out(), entry).not.to.contain('start-up failed');
        // its workers never took a run: both are still queued, on their first attempt (taken, each was lost)
        for (const id of ids) expect((await h.call('GET', `/api/v1/runs/${id}`)).body, entry).to.deep.include({ status: 'queued', attempt: 1 });
      }
      expect(processesMatching(marker)).to.equal(0);
    } finally {
      await h.close();
    }
    const file = path.join(dataDir, 'a-file');
    await fs.writeFile(file, '');
    for (const [bad, said] of [
      [{ SERVICE_DATA_DIR: file }, `SERVICE_DATA_DIR: ${file} cannot be used as a folder`],
      [{ SERVICE_API_KEYS: `acme:${KEYS.a},other:${KEYS.a}` }, 'SERVICE_API_KEYS: entry 2 gives tenant other the key entry 1 gives tenant acme'],
    ] as const) {
      const p = start('api/main.ts', { ...env(), ...bad });
      procs.push(p);
      expect((await p.exited).code).to.equal(1);
      expect(p.out()).to.contain(said);
      expect(p.out()).not.to.contain('start-up failed');
      expect(p.out()).not.to.contain(KEYS.a);
    }
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

/** A run request on a keep-alive connection, sent but for the end of its body until finish(); answer: all the server sent until it closed the connection. */
function halfSentRun(port: number): { sent: Promise<void>; finish(): void; answer: Promise<string> } {
  const body = JSON.stringify({ steps: [{ tool: 'message', args: { text: 'late' } }] });
  const socket = net.connect(port, '127.0.0.1');
  socket.on('error', () => {}); // a cut connection: the answer is what came before it
  let answer = '';
  socket.setEncoding('utf8');
  socket.on('data', (chunk: string) => (answer += chunk));
  const head = `POST /api/v1/autonomy/run HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${KEYS.a}\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n`;
  return {
    sent: once(socket, 'connect').then(() => void socket.write(head + body.slice(0, 10))),
    finish: () => void socket.write(body.slice(10)),
    answer: once(socket, 'close').then(() => answer),
  };
}

/** What a server answers to bytes sent as they are (a request target fetch would not send). */
function rawRequest(port: number, bytes: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const socket = net.connect(port, '127.0.0.1', () => socket.end(bytes));
    let answer = '';
    socket.setEncoding('utf8');
    socket.on('data', (chunk: string) => (answer += chunk));
    socket.on('end', () => resolve(answer));
    socket.on('error', reject);
  });
}
