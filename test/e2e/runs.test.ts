import { createHash } from 'node:crypto';
import fs from 'node:fs/promises';
import path from 'node:path';
import { expect } from 'chai';
import { EVENT_VALUE_MAX_BYTES } from '../../engine/platform/index.js';
import { CUT_MARK } from '../../engine/runs/attempt.js';
import { eventually, finishedRun, KEYS, processesMatching, releasable, startHarness, type Harness } from '../support/harness.js';

type RunBody = Record<string, any>;

describe('autonomy runs', function () {
  this.timeout(30_000);
  let h: Harness;
  before(async () => {
    h = await startHarness();
  });
  after(async () => {
    await h.close();
  });

  async function start(body: object, key = KEYS.a, headers: Record<string, string> = {}) {
    const res = await h.call('POST', '/api/v1/autonomy/run', { body, key, headers });
    expect(res.status, res.text).to.equal(202);
    return res;
  }
  const finished = (id: string) => finishedRun(h, id);

  it('runs shell steps to success: 202, Location, output, timing, summary', async () => {
    const res = await start({
      steps: [
        { tool: 'shell', args: { command: 'echo hello; echo oops >&2' } },
        { tool: 'message', args: { text: 'done' } },
      ],
      tools: ['shell', 'message'],
    });
    expect(res.headers.get('location')).to.equal(`/api/v1/runs/${res.body.run_id}`);
    expect(res.body.events_url).to.equal(`/api/v1/autonomy/streaming/${res.body.session_id}/events`);
    expect(res.body.run.status).to.equal('queued');
    const run = await finished(res.body.run_id);
    expect(run.status).to.equal('succeeded');
    expect(run.steps[0]).to.deep.include({ status: 'succeeded', tool: 'shell' });
    expect(run.steps[0].output).to.deep.include({ exit_code: 0, stdout: 'hello\n', stderr: 'oops\n' });
    expect(run.steps[0].duration_ms).to.be.a('number');
    expect(run.summary).to.equal('2 steps succeeded');
    expect(run.duration_ms).to.be.a('number');
    expect(run.usage.steps).to.equal(2);
    expect(run.started_at >= run.created_at).to.equal(true);
  });

  it('fails a step whose tool is not allowed, before anything of it runs', async () => {
    const marker = path.join(h.tenantDir(), 'should-not-exist');
    const res = await start({ steps: [{ tool: 'shell', args: { command: 'touch should-not-exist' } }], tools: ['message'] });
    const run = await finished(res.body.run_id);
    expect(run.status).to.equal('failed');
    expect(run.error.code).to.equal('tool-not-allowed');
    expect(run.steps[0].error.code).to.equal('tool-not-allowed');
    expect(await fs.stat(marker).catch(() => null)).to.equal(null);
  });

  it('fails on a nonzero exit and skips the rest', async () => {
    const res = await start({
      steps: [
        { tool: 'shell', args: { command: 'exit 3' } },
        { tool: 'shell', args: { command: 'true' } },
      ],
    });
    const run = await finished(res.body.run_id);
    expect(run.status).to.equal('failed');
    expect(run.error.code).to.equal('nonzero-exit');
    expect(run.steps.map((s: RunBody) => s.status)).to.deep.equal(['failed', 'skipped']);
  });

  it('lists a step skipped by its if in its place, once, and counts only the steps that ran', async () => {
    const ok = await finished(
      (
        await start({
          steps: [
            { tool: 'message', if: '0', args: { text: 'skipped' } },
            { tool: 'message', args: { text: 'ran' } },
          ],
        })
      ).body.run_id,
    );
    expect(ok.status).to.equal('succeeded');
    expect(ok.steps.map((s: RunBody) => [s.status, s.args.text])).to.deep.equal([
      ['skipped', 'skipped'],
      ['succeeded', 'ran'],
    ]);
    expect(ok.summary).to.equal('1 step succeeded');
    const failed = await finished(
      (
        await start({
          steps: [
            { tool: 'message', if: '0', args: { text: 'skipped' } },
            { tool: 'shell', args: { command: 'exit 1' } },
            { tool: 'message', args: { text: 'never' } },
          ],
        })
      ).body.run_id,
    );
    expect(failed.steps.map((s: RunBody) => [s.tool, s.status])).to.deep.equal([
      ['message', 'skipped'],
      ['shell', 'failed'],
      ['message', 'skipped'],
    ]);
  });

  it('ends timed_out within 2 s of the budget and kills the step’s processes', async () => {
    const marker = `sleep ${3000 + Math.floor(Math.random() * 5000)}`;
    // 2 s: on a busy machine the sandbox takes a while to start the sleep, which must be seen alive before the budget ends
    const res = await start({ steps: [{ tool: 'shell', args: { command: `${marker} & wait` } }], budget_seconds: 2 });
    await eventually(() => processesMatching(marker) > 0, 'the background sleep to start', 15_000);
    const run = await finished(res.body.run_id);
    expect(run.status).to.equal('timed_out');
    expect(run.error.code).to.equal('budget-exceeded');
    const overshoot = new Date(run.finished_at).getTime() - new Date(run.started_at).getTime() - 2000;
    expect(overshoot).to.be.below(2000);
    // an orphaned sleep would live for over 3,000 s
    await eventually(() => processesMatching(marker) === 0, 'the background sleep to be killed', 10_000);
  });

  it('stops after max_steps', async () => {
    const res = await start({ steps: [1, 2, 3].map((i) => ({ tool: 'shell', args: { command: `echo ${i}` } })), max_steps: 2 });
    const run = await finished(res.body.run_id);
    expect(run.status).to.equal('failed');
    expect(run.error.code).to.equal('max-steps-reached');
    expect(run.steps.map((s: RunBody) => s.status)).to.deep.equal(['succeeded', 'succeeded', 'skipped']);
  });

  it('cancels a running run: the step is aborted and the run ends canceled', async () => {
    const res = await start({ steps: [{ tool: 'shell', args: { command: 'sleep 30' } }], budget_seconds: 60 });
    await eventually(async () => (await h.call<RunBody>('GET', `/api/v1/runs/${res.body.run_id}`)).body.steps[0].status === 'running', 'the step to run');
    const cancel = await h.call('POST', `/api/v1/runs/${res.body.run_id}/cancel`);
    expect(cancel.status).to.equal(202);
    const run = await finished(res.body.run_id);
    expect(run.status).to.equal('canceled');
    expect(run.steps[0].status).to.equal('canceled');
    // not left to end on its own (30 s)
    expect(new Date(run.finished_at).getTime() - new Date(run.started_at).getTime()).to.be.below(15_000);
    const again = await h.call('POST', `/api/v1/runs/${res.body.run_id}/cancel`);
    expect(again.status).to.equal(409);
  });

  it('keeps file tools inside the workspace, links included', async () => {
    await fs.symlink('/etc', path.join(h.tenantDir(), 'escape'));
    for (const p of ['../../../../etc/passwd', '/etc/passwd', 'escape/passwd']) {
      const res = await start({ steps: [{ tool: 'read_file', args: { path: p } }] });
      const run = await finished(res.body.run_id);
      expect(run.error.code, p).to.equal('path-outside-workspace');
    }
    const ok = await start({
      steps: [
        { tool: 'write_file', args: { path: 'notes/a.txt', content: 'hi' } },
        { tool: 'read_file', args: { path: 'notes/a.txt' } },
        { tool: 'list_files', args: {} },
      ],
    });
    const run = await finished(ok.body.run_id);
    expect(run.status, JSON.stringify(run.error)).to.equal('succeeded');
    expect(run.steps[1].output.content).to.equal('hi');
    expect(run.steps[2].output.files).to.include('notes/a.txt');
  });

  it('refuses private and loopback addresses in the http tool', async () => {
    const res = await start({ steps: [{ tool: 'http', args: { url: `${h.url}/healthz` } }] });
    const run = await finished(res.body.run_id);
    expect(run.error.code).to.equal('address-not-allowed');
    const named = await start({ steps: [{ tool: 'http', args: { url: h.url.replace('127.0.0.1', 'localhost') + '/healthz' } }] });
    expect((await finished(named.body.run_id)).error.code).to.equal('address-not-allowed');
  });

  it('gives shell steps a scrubbed environment', async () => {
    const res = await start({ steps: [{ tool: 'shell', args: { command: 'env' } }] });
    const run = await finished(res.body.run_id);
    const names = (run.steps[0].output.stdout as string)
      .split('\n')
      .filter(Boolean)
      .map((l) => l.split('=')[0]);
    for (const n of names)
      expect(['PATH', 'HOME', 'LANG', 'LANGUAGE', 'TZ', 'TERM', 'SHELL', 'USER', 'LOGNAME', 'TMPDIR', 'PWD', 'SHLVL', '_', 'OLDPWD']).to.include(n);
    expect(run.steps[0].output.stdout).not.to.contain(KEYS.a);
  });

  it('refuses a goal with no agent endpoint (422), bad budgets (400), and another tenant’s run (404)', async () => {
    const goal = await h.call('POST', '/api/v1/autonomy/run', { body: { goal: 'fix the tests' } });
    expect(goal.status).to.equal(422);
    expect(goal.body.code).to.equal('agent-not-configured');
    const budget = await h.call('POST', '/api/v1/autonomy/run', { body: { steps: [{ tool: 'shell', args: { command: 'true' } }], budget_seconds: 999_999 } });
    expect(budget.status).to.equal(400);
    const res = await start({ steps: [{ tool: 'shell', args: { command: 'true' } }] });
    expect((await h.call('GET', `/api/v1/runs/${res.body.run_id}`, { key: KEYS.b })).status).to.equal(404);
    expect((await h.call('POST', `/api/v1/runs/${res.body.run_id}/cancel`, { key: KEYS.b })).status).to.equal(404);
    expect((await h.call('GET', `/api/v1/autonomy/streaming/${res.body.session_id}/events`, { key: KEYS.b })).status).to.equal(404);
  });

  it('answers the same run for the same Idempotency-Key and body; 422 for another body', async () => {
    const body = { steps: [{ tool: 'shell', args: { command: 'echo once' } }] };
    const first = await start(body, KEYS.a, { 'idempotency-key': 'deploy-42' });
    const second = await start(body, KEYS.a, { 'idempotency-key': 'deploy-42' });
    expect(second.body.run_id).to.equal(first.body.run_id);
    expect(second.headers.get('idempotent-replayed')).to.equal('true');
    const other = await h.call('POST', '/api/v1/autonomy/run', {
      body: { steps: [{ tool: 'shell', args: { command: 'echo twice' } }] },
      headers: { 'idempotency-key': 'deploy-42' },
    });
    expect(other.status).to.equal(422);
    expect(other.body.code).to.equal('idempotency-key-reused');
    const otherTenant = await start(body, KEYS.b, { 'idempotency-key': 'deploy-42' });
    expect(otherTenant.body.run_id).not.to.equal(first.body.run_id);
  });

  it('answers requests sent at once with one Idempotency-Key as the first: its refusal, or its run however slow it is to store', async () => {
    // over the operator's budget (SERVICE_RUN_MAX_BUDGET_SECONDS), inside the schema's: refused by the first, which lets the key go
    const over = { steps: [{ tool: 'message', args: { text: 'x' } }], budget_seconds: 5000 };
    const refused = await Promise.all(
      Array.from({ length: 4 }, () => h.call('POST', '/api/v1/autonomy/run', { body: over, headers: { 'idempotency-key': 'at-once-1' } })),
    );
    expect(refused.map((r) => `${r.status} ${r.body.code}`)).to.deep.equal(Array(4).fill('400 validation-failed'));
    // a first request that takes longer than a second to store its run: the others wait for it and answer it
    const insert = h.rt.store.runs.insert;
    let calls = 0;
    h.rt.store.runs.insert = (async (...args: Parameters<typeof insert>) => {
      if (calls++ <= 0) await new Promise((r) => setTimeout(r, calls <= 0 ? 6000 : 1500));
      return insert.apply(h.rt.store.runs, args);
    }) as typeof insert;
    try {
      const body = { steps: [{ tool: 'message', args: { text: 'slow' } }] };
      const answers = await Promise.all(
        Array.from({ length: 3 }, () => h.call('POST', '/api/v1/autonomy/run', { body, headers: { 'idempotency-key': 'at-once-2' } })),
      );
      expect(answers.map((r) => r.status)).to.deep.equal([202, 202, 202]);
      expect(new Set(answers.map((r) => r.body.run_id)).size).to.equal(1);
      expect(answers.filter((r) => r.headers.get('idempotent-replayed') === 'true')).to.have.length(2);
      expect(calls).to.equal(1);
      // one slower than the wait (5 s in all): the others are a 409 to retry after a second, nothing made
      calls = -10; // every insert from here waits 6 s
      const slow = h.call('POST', '/api/v1/autonomy/run', { body, headers: { 'idempotency-key': 'at-once-3' } });
      await new Promise((r) => setTimeout(r, 200));
      const startedAt = Date.now();
      const waited = await h.call('POST', '/api/v1/autonomy/run', { body, headers: { 'idempotency-key': 'at-once-3' } });
      expect(waited.status, waited.text).to.equal(409);
      expect(waited.headers.get('retry-after')).to.equal('1');
      expect(Date.now() - startedAt).to.be.within(4500, 6500);
      expect((await slow).status).to.equal(202);
    } finally {
      h.rt.store.runs.insert = insert;
    }
  });

  it('knows a request with the same Idempotency-Key by its content, not the order of its fields', async () => {
    const key = { 'idempotency-key': 'deploy-43' };
    const first = await h.call('POST', '/api/v1/autonomy/run', {
      body: { budget_seconds: 60, steps: [{ tool: 'shell', args: { command: 'echo once', timeout_seconds: 5 } }] },
      headers: key,
    });
    expect(first.status).to.equal(202);
    const reordered = await h.call('POST', '/api/v1/autonomy/run', {
      body: { steps: [{ args: { timeout_seconds: 5, command: 'echo once' }, tool: 'shell' }], budget_seconds: 60 },
      headers: key,
    });
    expect(reordered.status).to.equal(202);
    expect(reordered.headers.get('idempotent-replayed')).to.equal('true');
    expect(reordered.body.run_id).to.equal(first.body.run_id);
    // the order of a list is content: steps in another order are another request
    const steps = [
      { tool: 'message', args: { text: 'a' } },
      { tool: 'message', args: { text: 'b' } },
    ];
    expect((await h.call('POST', '/api/v1/autonomy/run', { body: { steps }, headers: { 'idempotency-key': 'deploy-44' } })).status).to.equal(202);
    const swapped = await h.call('POST', '/api/v1/autonomy/run', { body: { steps: [...steps].reverse() }, headers: { 'idempotency-key': 'deploy-44' } });
    expect(swapped.status).to.equal(422);
  });

  it('still answers the first run for a key after Redis lost it: the store keeps each key for its day', async () => {
    const body = { steps: [{ tool: 'message', args: { text: 'kept' } }] };
    const key = { 'idempotency-key': 'deploy-45' };
    const first = await h.call('POST', '/api/v1/autonomy/run', { body, headers: key });
    expect(first.status).to.equal(202);
    const slot = `${h.config.queuePrefix}:idempotency:tenant-a:${createHash('sha256').update('deploy-45').digest('hex')}`;
    expect(await h.rt.redis.del(slot)).to.equal(1); // Redis lost its data (no AOF, a failover)
    // a store that does not answer then: 503 with Retry-After, nothing made, and the claim taken back
    const lookup = h.rt.store.idempotencyKeys.get.bind(h.rt.store.idempotencyKeys);
    h.rt.store.idempotencyKeys.get = async () => {
      throw new Error('SQLITE_IOERR: injected');
    };
    try {
      const down = await h.call('POST', '/api/v1/autonomy/run', { body, headers: key });
      expect(down.status, down.text).to.equal(503);
      expect(down.headers.get('retry-after')).to.equal('5');
    } finally {
      h.rt.store.idempotencyKeys.get = lookup;
    }
    expect(await h.rt.redis.exists(slot)).to.equal(0);
    const retry = await h.call('POST', '/api/v1/autonomy/run', { body, headers: key });
    expect(retry.status).to.equal(202);
    expect(retry.headers.get('idempotent-replayed')).to.equal('true');
    expect(retry.body.run_id).to.equal(first.body.run_id);
    // Redis holds the key again, for the rest of its day
    expect(await h.rt.redis.pttl(slot)).to.be.within(23 * 3600 * 1000, 24 * 3600 * 1000);
    await h.rt.redis.del(slot);
    const other = await h.call('POST', '/api/v1/autonomy/run', { body: { steps: [{ tool: 'message', args: { text: 'other' } }] }, headers: key });
    expect(other.status).to.equal(422);
    expect(other.body.code).to.equal('idempotency-key-reused');
    // a key's day is over: it may start a new run (the reconciler forgets the store's copy)
    await h.rt.redis.del(slot);
    const kept = await h.rt.store.idempotencyKeys.get('tenant-a', createHash('sha256').update('deploy-45').digest('hex'), '1970-01-01T00:00:00.000Z');
    const dayAgo = new Date(Date.now() - 25 * 3600 * 1000).toISOString();
    const keep = (r: NonNullable<typeof kept>) => h.rt.store.idempotencyKeys.claim(r, '1970-01-01T00:00:00.000Z', '1970-01-01T00:00:00.000Z');
    expect(await keep({ ...kept!, created_at: dayAgo })).to.equal(null);
    // with more expired keys than a write takes: one pass forgets them all (a page a pass fell behind any busy day)
    await Promise.all(Array.from({ length: 2500 }, (_, i) => keep({ ...kept!, key_digest: `${i}`.padStart(64, '0'), created_at: dayAgo })));
    await h.rt.engine.runs.reconcile();
    expect(await h.rt.store.idempotencyKeys.get('tenant-a', '0'.repeat(64), '1970-01-01T00:00:00.000Z')).to.equal(null);
    expect(await h.rt.store.idempotencyKeys.get('tenant-a', '2499'.padStart(64, '0'), '1970-01-01T00:00:00.000Z')).to.equal(null);
    expect(await h.rt.store.idempotencyKeys.prune(new Date(Date.now() - 24 * 3600 * 1000).toISOString(), 10_000)).to.equal(0);
    expect(await h.rt.store.idempotencyKeys.get('tenant-a', kept!.key_digest, '1970-01-01T00:00:00.000Z')).to.equal(null);
    const later = await h.call('POST', '/api/v1/autonomy/run', { body, headers: key });
    expect(later.status).to.equal(202);
    expect(later.headers.get('idempotent-replayed')).to.equal(null);
    expect(later.body.run_id).not.to.equal(first.body.run_id);
  });

  it('makes one run for a key when Redis loses it while the first request is still storing its run', async () => {
    const body = { steps: [{ tool: 'message', args: { text: 'window' } }] };
    const key = { 'idempotency-key': 'deploy-46' };
    const slot = `${h.config.queuePrefix}:idempotency:tenant-a:${createHash('sha256').update('deploy-46').digest('hex')}`;
    const insert = h.rt.store.runs.insert;
    let reached!: () => void;
    const storing = new Promise<void>((r) => (reached = r));
    let go!: () => void;
    const gate = new Promise<void>((r) => (go = r));
    h.rt.store.runs.insert = (async (...args: Parameters<typeof insert>) => {
      reached();
      await gate;
      return insert.apply(h.rt.store.runs, args);
    }) as typeof insert;
    try {
      const first = h.call('POST', '/api/v1/autonomy/run', { body, headers: key });
      await storing;
      expect(await h.rt.redis.del(slot)).to.equal(1); // Redis lost its data between the first's claim and its commit
      const second = h.call('POST', '/api/v1/autonomy/run', { body, headers: key });
      await new Promise((r) => setTimeout(r, 300));
      go();
      const [a, b] = await Promise.all([first, second]);
      expect([a.status, b.status]).to.deep.equal([202, 202]);
      expect(b.body.run_id).to.equal(a.body.run_id);
      expect(b.headers.get('idempotent-replayed')).to.equal('true');
    } finally {
      h.rt.store.runs.insert = insert;
    }
    // and a request that dies after taking the key in the store, before storing its run, holds it only for the claim's lifetime
    const digest = createHash('sha256').update('deploy-47').digest('hex');
    const old = new Date(Date.now() - 31_000).toISOString();
    const taken = await h.rt.store.idempotencyKeys.claim(
      { tenant_id: 'tenant-a', key_digest: digest, fingerprint: 'x', run_id: 'run_never_stored', created_at: old },
      '1970-01-01T00:00:00.000Z',
      '1970-01-01T00:00:00.000Z',
    );
    expect(taken).to.equal(null);
    const fresh = await h.call('POST', '/api/v1/autonomy/run', { body, headers: { 'idempotency-key': 'deploy-47' } });
    expect(fresh.status, fresh.text).to.equal(202);
    expect(fresh.headers.get('idempotent-replayed')).to.equal(null);
    expect((await h.rt.store.idempotencyKeys.get('tenant-a', digest, '1970-01-01T00:00:00.000Z'))?.run_id).to.equal(fresh.body.run_id);
  });

  it('still knows a retry by a key claimed before fingerprints were canonical', async () => {
    const runs = h.rt.engine.runs;
    const fingerprint = { work: { steps: [{ tool: 'message', args: { text: 'legacy' } }] }, kind: 'autonomy' };
    const request = { kind: 'autonomy' as const, steps: [{ tool: 'message' as const, args: { text: 'legacy' } }], trigger: { type: 'api' as const } };
    const { run } = await runs.createIdempotent('tenant-a', 'legacy-1', fingerprint, request);
    // the claim as the earlier version wrote it: the digest of the fields in the order they came
    const slot = `${h.config.queuePrefix}:idempotency:tenant-a:${createHash('sha256').update('legacy-1').digest('hex')}`;
    const legacy = createHash('sha256').update(JSON.stringify(fingerprint)).digest('hex');
    await h.rt.redis.set(slot, JSON.stringify({ hash: legacy, run_id: run.id }), 'KEEPTTL');
    const again = await runs.createIdempotent('tenant-a', 'legacy-1', fingerprint, request);
    expect(again).to.deep.include({ replayed: true });
    expect(again.run.id).to.equal(run.id);
    const other = { ...fingerprint, work: { steps: [{ tool: 'message', args: { text: 'other' } }] } };
    let refused: unknown;
    await runs.createIdempotent('tenant-a', 'legacy-1', other, request).catch((err: unknown) => (refused = err));
    expect((refused as { code?: string } | undefined)?.code).to.equal('idempotency-key-reused');
  });

  it('reports budget and concurrency hints', async () => {
    const res = await h.call('GET', '/api/v1/autonomy/reliability-context');
    expect(res.status).to.equal(200);
    expect(res.body.budget).to.deep.include({ default_seconds: h.config.runBudget.defaultSeconds, max_seconds: h.config.runBudget.maxSeconds });
    expect(res.body.budget.suggested_seconds.autonomy).to.be.a('number');
    expect(res.body.workers.count).to.be.at.least(1);
    expect(res.body.tenant.max_running).to.equal(h.config.tenantMaxRunning);
    expect(res.body.tenant).to.have.all.keys('max_running', 'max_waiting', 'running', 'waiting');
  });

  it('tells a tenant only its own figures: another tenant’s running runs show nowhere in its hints', async () => {
    const hints = async (key: string) => {
      const res = await h.call<RunBody>('GET', '/api/v1/autonomy/reliability-context', { key });
      expect(res.status, res.text).to.equal(200);
      return res.body;
    };
    const before = await hints(KEYS.b);
    const gate = releasable(h, 'hints-running');
    const busy = await Promise.all([1, 2].map(() => start({ steps: [{ tool: 'shell', args: { command: gate.command } }] })));
    try {
      await eventually(async () => {
        const statuses = await Promise.all(busy.map(async (r) => (await h.call<RunBody>('GET', `/api/v1/runs/${r.body.run_id}`)).body.status));
        return statuses.every((s) => s === 'running') || null;
      }, 'both runs to run');
      // tenant-a's own answer counts them
      expect((await hints(KEYS.a)).tenant.running).to.be.at.least(2);
      // tenant-b's is what it was: no figure in it counts tenant-a's runs, as the queues' depths of every tenant did
      const during = await hints(KEYS.b);
      expect(during).to.have.all.keys('budget', 'workers', 'tenant');
      expect(during).to.deep.equal(before);
    } finally {
      await gate.release();
      for (const r of busy) await finished(r.body.run_id);
      await gate.clear();
    }
  });

  it('suggests budgets from runs that started: a run canceled before it started does not lower them', async () => {
    // no worker: a run stays queued until it is canceled
    const idle = await startHarness({ workers: false });
    try {
      const suggested = async () => (await idle.call<RunBody>('GET', '/api/v1/autonomy/reliability-context')).body.budget.suggested_seconds.autonomy as number;
      expect(await suggested(), 'with no history, the default').to.equal(idle.config.runBudget.defaultSeconds);
      const res = await idle.call<RunBody>('POST', '/api/v1/autonomy/run', { body: { steps: [{ tool: 'shell', args: { command: 'true' } }] } });
      expect(res.status, res.text).to.equal(202);
      const canceled = await idle.call<RunBody>('POST', `/api/v1/runs/${res.body.run_id}/cancel`);
      expect(canceled.body).to.deep.include({ status: 'canceled', started_at: null, duration_ms: 0 });
      // its 0 ms says nothing of how long the work takes: counted, it brought the suggestion down to the floor of 30 s
      expect(await suggested()).to.equal(idle.config.runBudget.defaultSeconds);
    } finally {
      await idle.close();
    }
  });

  it('fails a step whose references would make its args more than 1 MB, before it runs; what it carries stays small', async () => {
    const res = await start({
      inputs: { x: 'x'.repeat(50_000) },
      steps: [
        { tool: 'message', args: { text: '${inputs.x}' } },
        { tool: 'write_file', args: { path: 'big.txt', content: '${inputs.x}'.repeat(400) } },
        { tool: 'message', args: { text: 'never' } },
      ],
    });
    const run = await finished(res.body.run_id);
    expect(run.status).to.equal('failed');
    expect(run.error.code).to.equal('args-too-large');
    expect(run.error.message).to.contain('step 1 (write_file)').and.contain('1048576 bytes');
    expect(run.steps.map((s: RunBody) => s.status)).to.deep.equal(['succeeded', 'failed', 'skipped']);
    // what fits is as it was; the refused step keeps its args as the plan wrote them
    expect(run.steps[0].args.text).to.equal('x'.repeat(50_000));
    expect(run.steps[1].args.content).to.equal('${inputs.x}'.repeat(400));
    expect(run.steps[1].error.code).to.equal('args-too-large');
    expect(await fs.stat(path.join(h.tenantDir(), 'big.txt')).catch(() => null)).to.equal(null);
    expect(JSON.stringify(run).length).to.be.below(200_000);
    const events = await h.rt.events.after(`session:${run.session_id}`, '0-0', 1000);
    expect(events.filter((e) => e.type === 'step.started').map((e) => (e.data as { index: number }).index)).to.deep.equal([0, 1]);
    expect(JSON.stringify(events).length).to.be.below(200_000);
  });

  it('reads a step by its place before a step named like it', async () => {
    const res = await start({
      steps: [
        { tool: 'message', args: { text: 'first' } },
        { tool: 'message', name: '0', args: { text: 'named 0' } },
        { tool: 'message', name: '__proto__', args: { text: '${steps.0.output.text} ${steps.__proto__.status}' } },
        { tool: 'message', args: { text: '${steps.0.output.text} ${steps.__proto__.output.text} ${steps.constructor}.' } },
      ],
    });
    const run = await finished(res.body.run_id);
    expect(run.status, JSON.stringify(run.error)).to.equal('succeeded');
    expect(run.steps.map((s: RunBody) => s.args.text)).to.deep.equal(['first', 'named 0', 'first ', 'first first  .']);
    expect(run.summary).to.equal('4 steps succeeded');
  });

  it('hands a shell step what its references name through its environment, never as command text, and leaves other ${...} to the shell', async () => {
    // a pull request's title as a webhook brings it: a quote and a command after it
    const title = 'fix typo"; echo INJECTED; echo "';
    const res = await start({
      inputs: { title, count: 3, labels: ['a', 'b'], fallback: 'echo from-input' },
      steps: [
        { tool: 'shell', name: 'say', args: { command: 'echo "PR title: ${inputs.title}"' } },
        { tool: 'shell', args: { command: 'X=abc; echo "var=${X} home=${HOME:+set} n=${inputs.count} l=${inputs.labels} s=${steps.say.output.exit_code}"' } },
        // the step's own env keeps its names; a typo in an `if` names nothing (the step is skipped, not run)
        { tool: 'shell', args: { command: 'echo "$SVC_REF_0 ${inputs.count}"', env: { SVC_REF_0: 'mine' } } },
        { tool: 'shell', if: '${input.count}', args: { command: 'echo never' } },
        // written as the author wants it (a YAML block ends with a newline), the value itself is the command
        { tool: 'shell', args: { command: '${inputs.cmd|inputs.fallback}\n' } },
      ],
    });
    const run = await finished(res.body.run_id);
    expect(run.status, JSON.stringify(run.error)).to.equal('succeeded');
    expect(run.steps[0].output.stdout).to.equal(`PR title: ${title}\n`);
    expect(run.steps[0].args).to.deep.equal({ command: 'echo "PR title: ${SVC_REF_0}"', env: { SVC_REF_0: title } });
    expect(run.steps[1].output.stdout).to.equal('var=abc home=set n=3 l=["a","b"] s=0\n');
    expect(run.steps[2].output.stdout).to.equal('mine 3\n');
    expect(run.steps[2].args.env).to.deep.equal({ SVC_REF_0: 'mine', SVC_REF_1: 3 });
    expect(run.steps[3].status).to.equal('skipped');
    expect(run.steps[4].args).to.deep.equal({ command: 'echo from-input\n' });
    expect(run.steps[4].output.stdout).to.equal('from-input\n');

    // a reference stays where it stood whatever the quoting: an apostrophe in a comment or a heredoc (which a
    // guess at the quoting took for an opening quote) never takes a quoted reference out of its quotes
    const spread = 'a b -o -exec echo INJECTED {} ; -name y';
    const commented = await finished(
      (
        await start({
          inputs: { v: spread },
          steps: [
            { tool: 'shell', args: { command: `# we don't split it\nprintf '[%s]\\n' "\${inputs.v}"` } },
            { tool: 'shell', args: { command: `cat <<EOF\nThe build didn't pass: \${inputs.v}\nEOF\nfind . -maxdepth 0 -name "\${inputs.v}"` } },
          ],
        })
      ).body.run_id,
    );
    expect(commented.steps[0].output.stdout).to.equal(`[${spread}]\n`);
    expect(commented.steps[1].output.stdout).to.equal(`The build didn't pass: ${spread}\n`);
    expect(commented.steps[1].output.stdout).not.to.contain('INJECTED .');
    // an env that is no object of names: the step is refused before it runs, never run with the title as command text
    for (const env of [null, [], 'x', '${inputs.vars}']) {
      const refused = await finished(
        (await start({ inputs: { title, vars: {} }, steps: [{ tool: 'shell', args: { command: 'echo "v=${inputs.title}"', env } }] })).body.run_id,
      );
      expect(refused.status, JSON.stringify(env)).to.equal('failed');
      expect(refused.error.code, JSON.stringify(env)).to.equal('invalid-args');
      expect(refused.error.message).to.contain('env must be an object');
      expect(refused.steps[0].output ?? {}, JSON.stringify(env)).not.to.have.property('stdout');
    }
  });

  it('streams a step’s output whole characters at a time, up to 1 MB of UTF-8, and keeps a tail that starts with a whole one', async () => {
    // 1,000,000 € (3 bytes each): 3 MB printed
    const res = await start({ steps: [{ tool: 'shell', args: { command: 'yes € | head -n 1000000 | tr -d "\\n"' } }] });
    const run = await finished(res.body.run_id);
    expect(run.status, JSON.stringify(run.error)).to.equal('succeeded');
    const events = await h.rt.events.after(`session:${run.session_id}`, '0-0', 10_000);
    const streamed = events
      .filter((e) => e.type === 'step.output')
      .map((e) => (e.data as { text: string }).text)
      .join('');
    // 349,525 € are 1,048,575 bytes: the next one does not fit whole
    expect(streamed === '€'.repeat(349_525), `${streamed.length} characters streamed, ${streamed.split('\ufffd').length - 1} replaced`).to.equal(true);
    // the record keeps the last 64 KB: 21,845 € and a byte of the one before, left out
    expect(run.steps[0].output.truncated).to.equal(true);
    expect(run.steps[0].output.stdout === '€'.repeat(21_845)).to.equal(true);
  });

  it('counts a step’s streamed output as the event log stores it (JSON): control characters escaped six times larger count six times', async () => {
    // 1.2 MB of \u0001: 7.2 MB as JSON, where the bound is 1 MB a step (8 MB an attempt) of what the shared Redis keeps
    const res = await start({ steps: [{ tool: 'shell', args: { command: "head -c 1200000 /dev/zero | tr '\\0' '\\001'; echo; echo after" } }] });
    const run = await finished(res.body.run_id);
    expect(run.status, JSON.stringify(run.error)).to.equal('succeeded');
    const texts = (await h.rt.events.after(`session:${run.session_id}`, '0-0', 10_000))
      .filter((e) => e.type === 'step.output')
      .map((e) => (e.data as { text: string }).text);
    const stored = texts.reduce((n, t) => n + Buffer.byteLength(JSON.stringify(t)) - 2, 0);
    expect(stored, 'bytes of JSON streamed').to.be.at.most(1024 * 1024);
    // a prefix of the output, of all the room it had: 174,762 characters of 6 bytes
    const joined = texts.join('');
    expect(joined === '\u0001'.repeat(174_762), `${joined.length} characters streamed`).to.equal(true);
  });

  /** A message of 500,000 characters, then steps that each post it twice over (1 MB of args each, references brought in). */
  const doubling = (steps: number) => [
    { name: 's', tool: 'message', args: { text: 'x'.repeat(500_000) } },
    ...Array.from({ length: steps }, () => ({ tool: 'message', args: { text: '${steps.s.output.text}${steps.s.output.text}' } })),
  ];

  it('spends a run’s messages from the tenant’s day of output and streams its steps’ arguments cut; the record keeps both whole', async () => {
    const budgeted = await startHarness({ env: { SERVICE_TENANT_OUTPUT_MB_PER_DAY: '1' } });
    try {
      const res = await budgeted.call<RunBody>('POST', '/api/v1/autonomy/run', { body: { steps: doubling(3) } });
      expect(res.status, res.text).to.equal(202);
      const run = await finishedRun(budgeted, res.body.run_id);
      expect(run.status, JSON.stringify(run.error)).to.equal('succeeded');
      const scope = `session:${run.session_id}`;
      const events = await budgeted.rt.events.after(scope, '0-0', 10_000);
      // 3.5 MB of messages posted, against 1 MB a day: the first (0.5 MB), then the notice once, then nothing
      const messages = events.filter((e) => e.type === 'message.created').map((e) => e.data as { role: string; text: string; step: number });
      expect(messages.map((m) => [m.step, m.role, m.text.length])).to.deep.equal([
        [0, 'assistant', 500_000],
        [1, 'system', messages[1]?.text.length],
      ]);
      expect(messages[1]!.text).to.contain('SERVICE_TENANT_OUTPUT_MB_PER_DAY');
      // each step.started carries its arguments' start, marked, not 1 MB
      const started = events.filter((e) => e.type === 'step.started').map((e) => (e.data as RunBody).args as { text: string });
      expect(started).to.have.length(4);
      for (const args of started) expect(Buffer.byteLength(JSON.stringify(args))).to.be.at.most(EVENT_VALUE_MAX_BYTES + Buffer.byteLength(CUT_MARK));
      expect(started[1]!.text.startsWith('xxx') && started[1]!.text.endsWith(CUT_MARK)).to.equal(true);
      // what the shared Redis holds of the run: the one message, not 50 times the budget
      const held = Number(await budgeted.rt.redis.call('MEMORY', 'USAGE', budgeted.rt.events.key(scope)));
      expect(held, 'bytes of the run’s stream in Redis').to.be.below(1024 * 1024);
      // the run's record keeps the arguments and the messages whole
      expect(run.steps[3].args.text.length).to.equal(1_000_000);
      expect(run.steps[3].output.text.length).to.equal(1_000_000);
    } finally {
      await budgeted.close();
    }
  });

  it('streams a message from its step’s and its attempt’s room: past 8 MB of output it streams only that it was posted', async () => {
    // eight steps of 1.1 MB printed, 1 MB of each streamed: the attempt's 8 MB spent before the message
    const print = { tool: 'shell', args: { command: 'head -c 1100000 /dev/zero | tr "\\0" a' } };
    const res = await start({ steps: [...Array.from({ length: 8 }, () => print), { tool: 'message', args: { text: 'after the output' } }] });
    const run = await finished(res.body.run_id);
    expect(run.status, JSON.stringify(run.error)).to.equal('succeeded');
    const events = await h.rt.events.after(`session:${run.session_id}`, '0-0', 10_000);
    expect(events.filter((e) => e.type === 'message.created').map((e) => e.data)).to.deep.equal([
      { role: 'assistant', text: '', text_truncated: true, step: 8 },
    ]);
    expect(run.steps[8].output.text).to.equal('after the output');
  });

  it('fails a plan whose steps’ arguments, references brought in, pass 8 MB an attempt, before the step that would pass it runs', async function () {
    this.timeout(60_000);
    const res = await start({ steps: doubling(39) });
    const run = await finished(res.body.run_id);
    expect(run.status).to.equal('failed');
    expect(run.error.code).to.equal('attempt-args-too-large');
    // 0.5 MB and seven steps of 1 MB fit in 8 MB; the eighth does not
    expect(run.error.message).to.contain('step 8 (message)').and.contain('8388608 bytes');
    expect(run.steps.map((s: RunBody) => s.status)).to.deep.equal([...Array<string>(8).fill('succeeded'), 'failed', ...Array<string>(31).fill('skipped')]);
    expect(run.steps[8].error.code).to.equal('attempt-args-too-large');
    expect(run.steps[8].args.text).to.equal('${steps.s.output.text}${steps.s.output.text}');
    // what the run's record holds: its steps' 7.5 MB of arguments and the messages they posted, not 40 MB of each
    expect(JSON.stringify(run).length).to.be.below(16 * 1024 * 1024);
  });

  it('cancels a run waiting out a retry’s backoff as canceled before its next attempt, keeping its first start and the time since', async () => {
    const res = await start({
      steps: [{ tool: 'shell', args: { command: 'exit 1' } }],
      retry: { attempts: 3, backoff: { type: 'fixed', delay_ms: 20_000 } },
    });
    const id = res.body.run_id;
    const waiting = await eventually(async () => {
      const r = (await h.call<RunBody>('GET', `/api/v1/runs/${id}`)).body;
      return r.status === 'queued' && r.attempt === 2 ? r : null;
    }, 'the first attempt to fail into its backoff');
    const canceled = await h.call<RunBody>('POST', `/api/v1/runs/${id}/cancel`);
    expect(canceled.status, canceled.text).to.equal(200);
    const run = (await h.call<RunBody>('GET', `/api/v1/runs/${id}`)).body;
    expect(run).to.deep.include({ status: 'canceled', attempt: 2, summary: 'canceled before its next attempt started' });
    expect(run.error).to.deep.equal({ code: 'canceled', message: 'canceled before its next attempt started' });
    // it started once: its first start stays, and its duration runs from it to the cancel, its attempt within it
    expect(run.started_at).to.equal(waiting.attempts[0].started_at);
    expect(run.duration_ms).to.equal(Date.parse(run.finished_at) - Date.parse(run.started_at));
    expect(run.duration_ms).to.be.at.least(waiting.attempts[0].duration_ms);
    // the plan's step the next attempt never ran is skipped, not pending
    expect(run.steps.map((s: RunBody) => s.status)).to.deep.equal(['skipped']);
    expect(run.attempts.map((a: RunBody) => `${a.attempt}:${a.outcome}:${a.status}`)).to.deep.equal(['1:retried:failed']);
  });
});
