// The entry points as ops run them: start, print, answer, and stop cleanly on SIGTERM (their refusals to
// start: process-refusals.test.ts).
import { spawnSync } from 'node:child_process';
import { once } from 'node:events';
import net from 'node:net';
import { expect } from 'chai';
import { startLocalRedis } from '../../engine/process/index.js';
import { builtEntry } from '../support/built.js';
import { eventually, finishedRun, freePort, KEYS, processesMatching, sameDeployment, startHarness } from '../support/harness.js';
import { serviceProcesses, spawnProc, start, waitFor } from '../support/procs.js';

describe('processes', function () {
  this.timeout(40_000);
  const { procs, dataDir, env } = serviceProcesses();

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
    // and one beside it whose stdout is a pipe
    const json = start('main.ts', env());
    procs.push(p, json);
    await waitFor(p, /listening on http:\/\/localhost:\d+/);
    await waitFor(p, /INFO\S*: \S*workers ready/);
    expect(p.out()).not.to.contain('"level":30');
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
    const other = await fetch(`${metricsUrl}/other`);
    expect(other.status).to.equal(404);
    // its refusals are the service's problems, as the web's are: a stable code and the request's id
    expect(other.headers.get('content-type')).to.match(/^application\/problem\+json/);
    expect(await other.json()).to.deep.include({ code: 'not-found', status: 404, request_id: other.headers.get('x-request-id'), instance: '/other' });
    const unreadable = await rawRequest(port, `GET / HTTP/1.1\r\nHost x\r\n\r\n`);
    expect(unreadable)
      .to.match(/^HTTP\/1\.1 400 /)
      .and.match(/"code":"bad-request"/);
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

  it('hands a gate it runs back to the queue as it stops, within the grace period and exiting 0, spending none of the job’s stalls; another worker runs it', async () => {
    const h = await startHarness({ workers: false });
    try {
      const dir = h.tenantDir();
      const marker = `sleep ${7000 + Math.floor(Math.random() * 3000)}`;
      const fs = await import('node:fs/promises');
      await fs.writeFile(`${dir}/gates.yaml`, `gates:\n  - id: slow\n    shell: true\n    run: "if [ -e second ]; then exit 0; fi; touch second; ${marker}"\n`);
      const worker = start('workers/main.ts', { ...sameDeployment(h), REDIS_URL: h.config.redisUrl, SERVICE_SHUTDOWN_GRACE_SECONDS: '3' });
      procs.push(worker);
      await waitFor(worker, /workers ready/);
      const run = await h.rt.engine.gates.start('tenant-a', { trigger: { type: 'api' } });
      await eventually(() => processesMatching(marker) > 0, 'the gate to run', 15_000);
      const stoppedAt = Date.now();
      worker.child.kill('SIGTERM');
      // 0: before its grace timer, which exits 1 with the work unfinished (a gate was waited for until then)
      expect((await worker.exited).code, worker.out()).to.equal(0);
      expect(Date.now() - stoppedAt).to.be.below(4500);
      expect(worker.out()).to.contain('interrupting runs, gates, audit phases and notifications');
      await eventually(() => processesMatching(marker) === 0, 'the gate’s sleep to be killed', 10_000);
      const job = (await h.rt.queues.get('gates').getJob(`${run.id}__slow`))!;
      expect(await job.getState()).to.be.oneOf(['waiting', 'delayed', 'wait']);
      expect({ attempts: job.attemptsMade, stalls: job.stalledCounter }).to.deep.equal({ attempts: 0, stalls: 0 });
      const record = await h.rt.store.gateRuns.get('tenant-a', run.id);
      expect({ status: record!.status, results: await h.rt.store.gateRuns.results('tenant-a', run.id) }).to.deep.equal({ status: 'running', results: [] });
      // another worker takes it at once, and the gate run ends with its result
      const next = start('workers/main.ts', { ...sameDeployment(h), REDIS_URL: h.config.redisUrl });
      procs.push(next);
      const sealed = await h.rt.engine.gates.wait('tenant-a', run.id);
      expect(sealed.results.map((r) => [r.gate_id, r.conclusion])).to.deep.equal([['slow', 'success']]);
    } finally {
      await h.close();
    }
  });

  it('kills the process groups of its unsandboxed steps however it exits (a second signal at once): none lives on unowned', async () => {
    const h = await startHarness({ workers: false });
    try {
      const worker = start('workers/main.ts', {
        ...sameDeployment(h),
        REDIS_URL: h.config.redisUrl,
        SERVICE_SANDBOX: 'none',
        SERVICE_SHUTDOWN_GRACE_SECONDS: '10',
      });
      procs.push(worker);
      await waitFor(worker, /workers ready/);
      const marker = `sleep ${7000 + Math.floor(Math.random() * 3000)}`;
      await h.call('POST', '/api/v1/autonomy/run', { body: { steps: [{ tool: 'shell', args: { command: `${marker} & wait` } }], budget_seconds: 120 } });
      await eventually(() => processesMatching(marker) > 0, 'the step to run', 15_000);
      worker.child.kill('SIGTERM');
      await new Promise((r) => setTimeout(r, 200));
      worker.child.kill('SIGINT');
      expect((await worker.exited).code, worker.out()).to.equal(1);
      await eventually(() => processesMatching(marker) === 0, 'the step’s sleep to be killed with its worker', 5000);
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
      // a step killed by the same signal while no shutdown is under way is the run's own failure (this worker
      // takes the first run's attempt 2 too: its shortest grace, so that its stop waits 0.75 s for it, not 7.5)
      const other = start('workers/main.ts', { ...sameDeployment(h), REDIS_URL: h.config.redisUrl, SERVICE_SHUTDOWN_GRACE_SECONDS: '1' });
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
    const local = await startLocalRedis({ dataDir: dataDir() });
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
