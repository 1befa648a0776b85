// Redis away for a few seconds, on a private redis-server of this test (stopped with SIGSTOP, so its
// connections hang as on a network partition): run creation answers within a couple of seconds, and
// every run still reaches its end with its slot freed.
import { spawn, type ChildProcess } from 'node:child_process';
import net from 'node:net';
import { expect } from 'chai';
import { eventually, finishedRun, freePort, startHarness, type Harness } from '../support/harness.js';

describe('Redis outage', function () {
  this.timeout(60_000);
  let redis: ChildProcess;
  let h: Harness;
  let stopped = false;
  const pause = () => {
    redis.kill('SIGSTOP');
    stopped = true;
  };
  const resume = () => {
    redis.kill('SIGCONT');
    stopped = false;
  };

  before(async () => {
    const port = await freePort();
    redis = spawn('redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'], { stdio: 'ignore' });
    await eventually(
      () =>
        new Promise<boolean>((resolve) => {
          const s = net.connect(port, '127.0.0.1', () => (s.end(), resolve(true)));
          s.on('error', () => resolve(false));
        }),
      'the private redis-server to listen',
    );
    h = await startHarness({ env: { REDIS_URL: `redis://127.0.0.1:${port}` } });
  });
  after(async () => {
    if (stopped) resume();
    await h?.close();
    redis?.kill('SIGKILL');
  });

  it('says in /readyz, and at start, when Redis may evict keys (maxmemory-policy other than noeviction)', async () => {
    const ready = await h.call<Record<string, any>>('GET', '/readyz', { key: null });
    expect(ready.body.redis).to.deep.equal({ maxmemory_policy: 'noeviction' });
    await h.rt.redis.config('SET', 'maxmemory-policy', 'allkeys-lru');
    try {
      const warned = await h.call<Record<string, any>>('GET', '/readyz', { key: null });
      expect(warned.status).to.equal(200);
      expect(warned.body.redis.maxmemory_policy).to.equal('allkeys-lru');
      expect(warned.body.redis.warning).to.contain('noeviction');
      // a process that starts now says it in its log
      const other = await startHarness({ env: { REDIS_URL: h.config.redisUrl }, workers: false });
      try {
        expect(other.logs.join('')).to.contain('maxmemory-policy is allkeys-lru');
      } finally {
        await other.close();
      }
    } finally {
      await h.rt.redis.config('SET', 'maxmemory-policy', 'noeviction');
    }
  });

  it('answers run creation within 2 s while Redis is stopped: 202 when stored, 503 with Retry-After for an Idempotency-Key; the run then runs', async () => {
    // the same two requests once while Redis answers, so that what is timed below is the outage, not this
    // process's first answer on the route (its request and response validators are compiled on first use)
    for (const headers of [{}, { 'idempotency-key': 'warm-up' }] as Record<string, string>[]) {
      const warm = await h.call('POST', '/api/v1/autonomy/run', { body: { steps: [{ tool: 'message', args: { text: 'warm' } }] }, headers });
      expect(warm.status, warm.text).to.equal(202);
    }
    pause();
    const resumed = new Promise((r) => setTimeout(r, 5000)).then(resume);
    try {
      let at = Date.now();
      const accepted = await h.call('POST', '/api/v1/autonomy/run', { body: { steps: [{ tool: 'shell', args: { command: 'echo after' } }] } });
      expect(Date.now() - at).to.be.below(2000);
      expect(accepted.status, accepted.text).to.equal(202);
      at = Date.now();
      const keyed = await h.call('POST', '/api/v1/autonomy/run', {
        body: { steps: [{ tool: 'shell', args: { command: 'echo keyed' } }] },
        headers: { 'idempotency-key': 'outage-1' },
      });
      expect(Date.now() - at).to.be.below(2000);
      expect(keyed.status, keyed.text).to.equal(503);
      expect(keyed.body.code).to.equal('unavailable');
      expect(Number(keyed.headers.get('retry-after'))).to.be.greaterThan(0);
      await resumed;
      const run = await finishedRun(h, accepted.body.run_id);
      expect(run.status).to.equal('succeeded');
      expect(run.steps[0].output.stdout).to.equal('after\n');
      // the key was not kept by the refused request: the retry is accepted
      const retried = await h.call('POST', '/api/v1/autonomy/run', {
        body: { steps: [{ tool: 'shell', args: { command: 'echo keyed' } }] },
        headers: { 'idempotency-key': 'outage-1' },
      });
      expect(retried.status, retried.text).to.equal(202);
      expect((await finishedRun(h, retried.body.run_id)).status).to.equal('succeeded');
    } finally {
      await resumed;
    }
  });

  it('writes run.finished once Redis takes writes again, when it refused them (out of memory) as the run ended', async () => {
    const res = await h.call('POST', '/api/v1/autonomy/run', { body: { steps: [{ tool: 'shell', args: { command: 'sleep 1.5' } }] } });
    expect(res.status).to.equal(202);
    await eventually(async () => (await h.call('GET', `/api/v1/runs/${res.body.run_id}`)).body.status === 'running', 'the run to start');
    const admin = await import('ioredis').then((m) => new m.Redis(h.config.redisUrl));
    try {
      // every write refused with an OOM error (noeviction at its limit) while the run ends
      await admin.config('SET', 'maxmemory', '1');
      const run = await finishedRun(h, res.body.run_id);
      expect(run.status).to.equal('succeeded');
      await new Promise((r) => setTimeout(r, 1000));
      await admin.config('SET', 'maxmemory', '0');
      const finished = await eventually(
        async () => {
          const events = await h.rt.events.after(`session:${run.session_id}`, '0-0');
          return events.find((e) => e.type === 'run.finished') ?? null;
        },
        'run.finished in the log',
        20_000,
      );
      expect(finished.data).to.include({ status: 'succeeded' });
      await eventually(async () => (await h.rt.engine.runs.reliabilityContext('tenant-a')).tenant.running === 0, 'the slot to be freed', 20_000);
    } finally {
      await admin.config('SET', 'maxmemory', '0');
      admin.disconnect();
    }
  });

  it('finishes a run when Redis stops for 3 s in the middle of it, and frees its slot', async () => {
    const res = await h.call('POST', '/api/v1/autonomy/run', {
      body: {
        steps: [
          { tool: 'shell', args: { command: 'sleep 1; echo one' } },
          { tool: 'shell', args: { command: 'echo two' } },
        ],
      },
    });
    expect(res.status).to.equal(202);
    await eventually(async () => (await h.call('GET', `/api/v1/runs/${res.body.run_id}`)).body.status === 'running', 'the run to start');
    pause();
    await new Promise((r) => setTimeout(r, 3000));
    resume();
    const run = await finishedRun(h, res.body.run_id);
    expect(run.status).to.equal('succeeded');
    expect(run.steps.map((s: { output: { stdout: string } }) => s.output.stdout)).to.deep.equal(['one\n', 'two\n']);
    await eventually(async () => (await h.rt.engine.runs.reliabilityContext('tenant-a')).tenant.running === 0, 'the slot to be freed');
  });
});
