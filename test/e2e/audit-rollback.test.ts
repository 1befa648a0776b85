// A workspace audit when Redis comes back with older data (a restart from an older save, a failover to a
// lagging replica): the report and its jobs read as they were before it finished. The evidence ledger in
// the store says it was assembled: the report is finished again from it, its phases do not run again, and
// the ledger keeps one entry for it. And a start Redis takes only after its request was answered 503 (Redis
// stalled past the deadline, on a private redis-server stopped with SIGSTOP): nothing of it is kept.
import { spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs/promises';
import path from 'node:path';
import { expect } from 'chai';
import { scanKeys } from '../../engine/platform/redis.js';
import { eventually, freePort, listening, startHarness, type Harness } from '../support/harness.js';
import { makeFlawedProject } from '../support/projects.js';
import { startWorkers, type Workers } from '../../workers/index.js';

type Body = Record<string, any>;
type Snapshot = Map<string, { dump: Buffer; pttl: number }>;

/** Every key of this harness's deployment, as DUMP gives it, with what was left of its TTL. */
async function snapshotOf(h: Harness): Promise<Snapshot> {
  const out: Snapshot = new Map();
  for (const key of await scanKeys(h.rt.redis, `${h.config.queuePrefix}:*`)) {
    const [dump, pttl] = await Promise.all([h.rt.redis.dumpBuffer(key), h.rt.redis.pttl(key)]);
    if (dump) out.set(key, { dump, pttl });
  }
  return out;
}

/** Redis as the snapshot had it: what was made since is gone, what it held is back. */
async function rollBack(h: Harness, snapshot: Snapshot): Promise<void> {
  for (const key of await scanKeys(h.rt.redis, `${h.config.queuePrefix}:*`)) if (!snapshot.has(key)) await h.rt.redis.del(key);
  for (const [key, { dump, pttl }] of snapshot) await h.rt.redis.restore(key, Math.max(0, pttl), dump, 'REPLACE');
}

describe('workspace audit after Redis comes back with older data', function () {
  this.timeout(120_000);
  let h: Harness;
  let workers: Workers | null = null;
  before(async () => {
    h = await startHarness({ workers: false, env: { SERVICE_AUDIT_REGISTRY_URL: 'none' } });
    await makeFlawedProject(h.tenantDir());
  });
  after(async () => {
    await workers?.close();
    await h.close();
  });

  it('finishes a report that reads running again from its ledger entry: one entry, and its phases do not run again', async () => {
    const reportEntries = async (id: string) =>
      (await h.rt.store.evidence.list('tenant-a', { limit: 1000 })).filter((e) => e.kind === 'audit.report' && e.subject.report_id === id);
    const read = async (id: string) => (await h.call<Body>('GET', `/api/v1/autonomy/workspace-audit/${id}`)).body;

    const started = await h.call<Body>('POST', '/api/v1/autonomy/workspace-audit/run', { body: { phases: ['sanity'], timeout_seconds: 0 } });
    expect(started.status, started.text).to.equal(202);
    const id = started.body.report_id as string;
    // Redis's older save: the report running, its jobs not yet taken
    const snapshot = await snapshotOf(h);

    workers = await startWorkers(h.rt);
    const first = await eventually(async () => ((await read(id)).status !== 'running' ? read(id) : null), 'the report', 60_000);
    expect(first.status).to.equal('completed');
    expect(await reportEntries(id)).to.have.length(1);
    const phaseJobId = `${id}__sanity`;
    expect((await h.rt.queues.get('audits').getJob(phaseJobId))!.returnvalue).to.deep.equal({ phase: 'sanity', status: 'completed' });

    // the workers stop while Redis comes back (they would take the jobs back before the report is read)
    await workers.close();
    await rollBack(h, snapshot);
    expect((await read(id)).status, 'the report reads as the older save had it').to.equal('running');

    // its jobs come back and are taken again
    workers = await startWorkers(h.rt);
    const job = async (name: string) => h.rt.queues.get('audits').getJob(`${id}__${name}`);
    await eventually(async () => (await (await job('report'))?.getState()) === 'completed', 'the report job to end again', 60_000);
    // the ledger keeps the one entry, and the sandbox did not run the phase again
    expect(await reportEntries(id), 'audit.report entries of the report').to.have.length(1);
    expect((await job('sanity'))!.returnvalue, 'the phase job found the report assembled').to.equal(null);
    // the report is the one the ledger holds, finished when it first was
    const again = await read(id);
    expect(again).to.deep.include({
      status: 'completed',
      started_at: first.started_at,
      finished_at: first.finished_at,
      totals: first.totals,
      scores: first.scores,
    });
    expect(again.ledger).to.deep.equal(first.ledger);
    const summary = (r: Body) => r.phases.map((p: Body) => [p.phase, p.status, p.counts, p.score, p.duration_ms]);
    expect(summary(again)).to.deep.equal(summary(first));
    // it no longer holds a running place
    expect(await h.rt.redis.zscore(`${h.config.queuePrefix}:audit-running`, `tenant-a\n${id}`)).to.equal(null);
  });

  it('keeps the findings of a phase whose result Redis still has when the reconciler finishes such a report from the ledger', async () => {
    workers ??= await startWorkers(h.rt);
    const res = await h.call<Body>('POST', '/api/v1/autonomy/workspace-audit/run', { body: { phases: ['sanity'], timeout_seconds: 60 } });
    expect(res.status, res.text).to.equal(200);
    const first = res.body;
    expect(first.phases[0].findings).to.have.length.above(0);
    // an older save that has the phase's result, the report not yet assembled (the report job, ended, is taken for lost)
    const prefix = h.config.queuePrefix;
    const startedMs = Date.parse(first.started_at);
    const head = {
      ...first,
      status: 'running',
      finished_at: null,
      phases: [],
      totals: { critical: 0, high: 0, medium: 0, low: 0, info: 0 },
      scores: {},
      ledger: null,
    };
    await h.rt.redis
      .multi()
      .hset(`${prefix}:audit:{tenant-a}:${first.report_id}`, 'head', JSON.stringify(head))
      .zadd(`${prefix}:audit-running`, startedMs, `tenant-a\n${first.report_id}`)
      .zadd(`${prefix}:audit-running:{tenant-a}`, startedMs, first.report_id)
      .del(`${prefix}:audit:assemble:${first.report_id}`)
      .exec();
    expect((await h.call<Body>('GET', `/api/v1/autonomy/workspace-audit/${first.report_id}`)).body.status).to.equal('running');

    await h.rt.engine.audits.reconcile(0);
    const again = (await h.call<Body>('GET', `/api/v1/autonomy/workspace-audit/${first.report_id}`)).body;
    expect(again).to.deep.equal(first);
    const entries = (await h.rt.store.evidence.list('tenant-a', { limit: 1000 })).filter((e) => e.subject.report_id === first.report_id);
    expect(entries).to.have.length(1);
  });
});

describe('workspace audit whose start Redis takes after the request was answered 503', function () {
  this.timeout(60_000);
  let redis: ChildProcess;
  let h: Harness;
  let stopped = false;
  const stop = () => {
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
    await eventually(() => listening(port), 'the private redis-server to listen');
    // one place per tenant: a start kept after its 503 would refuse the client's retry (429)
    h = await startHarness({
      env: { REDIS_URL: `redis://127.0.0.1:${port}`, SERVICE_AUDIT_TENANT_MAX_RUNNING: '1', SERVICE_AUDIT_REGISTRY_URL: 'none' },
    });
    await fs.writeFile(path.join(h.tenantDir(), 'README.md'), '# a\n');
    // one audit while Redis answers: its scripts are then in Redis's cache, so that what a refused start sends
    // is run in the order it was sent (a script's first use is sent again, after Redis says it has none)
    const warm = await start(60);
    expect(warm.status, warm.text).to.equal(200);
    // its report is answered once assembled, and its report job completes just after: what the tests count starts
    // from both its jobs completed (under load, a count taken at once found the report job still active)
    await eventually(async () => {
      const counts = await jobCounts();
      return (counts.completed === 2 && !counts.active) || null;
    }, 'the warm-up audit’s jobs to complete');
  });
  after(async () => {
    if (stopped) resume();
    await h?.close();
    redis?.kill('SIGKILL');
  });

  const start = (timeoutSeconds: number) =>
    h.call<Body>('POST', '/api/v1/autonomy/workspace-audit/run', { body: { phases: ['sanity'], timeout_seconds: timeoutSeconds } });
  const placesTaken = () => h.rt.redis.zcard(`${h.config.queuePrefix}:audit-running:{tenant-a}`);
  const reportKeys = () => scanKeys(h.rt.redis, `${h.config.queuePrefix}:audit:{tenant-a}:*`);
  const jobCounts = () => h.rt.queues.get('audits').getJobCounts('waiting', 'active', 'waiting-children', 'delayed', 'completed', 'failed');
  const reportEntries = async () => (await h.rt.store.evidence.list('tenant-a', { limit: 1000 })).filter((e) => e.kind === 'audit.report');

  it('makes nothing when Redis runs the start after the deadline: no report, no place taken, no jobs; the retry is accepted', async () => {
    const [reportsBefore, jobsBefore, entriesBefore] = [await reportKeys(), await jobCounts(), await reportEntries()];
    stop();
    try {
      const refused = await start(0);
      expect(refused.status, refused.text).to.equal(503);
      expect(refused.headers.get('retry-after')).to.equal('5');
    } finally {
      resume();
    }
    // what the refused request sent Redis runs now, before what is asked after it on the same connection
    expect(await placesTaken(), 'places taken').to.equal(0);
    expect(await reportKeys(), 'reports kept').to.deep.equal(reportsBefore);
    expect(await jobCounts(), 'jobs').to.deep.equal(jobsBefore);
    // the client's retry is accepted (not refused for the place a kept start would hold), and it is the one audit
    const again = await start(60);
    expect(again.status, again.text).to.equal(200);
    expect(again.body.status).to.equal('completed');
    expect((await reportEntries()).map((e) => e.subject.report_id)).to.deep.equal([...entriesBefore.map((e) => e.subject.report_id), again.body.report_id]);
  });

  it('takes back a start whose report Redis made in time but whose jobs it took after the 503: report, place and jobs, and no ledger entry', async () => {
    const before = (await reportEntries()).length;
    const reports = h.rt.engine.audits.reports;
    const create = reports.create;
    let made: string | undefined;
    // Redis stalls right after it made the report, before the audit's jobs are added
    reports.create = async (...args: Parameters<typeof create>) => {
      const answer = await create.apply(reports, args);
      made = args[1].report_id;
      stop();
      return answer;
    };
    try {
      const refused = await start(0);
      expect(refused.status, refused.text).to.equal(503);
    } finally {
      reports.create = create;
      resume();
    }
    expect(made).to.be.a('string');
    // the jobs land once Redis runs again; the report, its place and its jobs are taken back
    const kept = async () => (await reportKeys()).filter((k) => k.endsWith(`:${made}`));
    await eventually(async () => (await placesTaken()) === 0 && (await kept()).length === 0, 'the report and its place taken back', 10_000);
    const job = (name: string) => h.rt.queues.get('audits').getJob(`${made}__${name}`);
    // its jobs are gone (or, when a worker had taken its phase first, ended finding no report)
    await eventually(async () => ['gone', 'completed'].includes((await (await job('report'))?.getState()) ?? 'gone'), 'its jobs to go', 20_000);
    expect((await h.call<Body>('GET', `/api/v1/autonomy/workspace-audit/${made}`)).status).to.equal(404);
    expect(await reportEntries(), 'no ledger entry of it').to.have.length(before);
    const again = await start(60);
    expect(again.status, again.text).to.equal(200);
    expect((await reportEntries()).map((e) => e.subject.report_id))
      .to.include(again.body.report_id)
      .and.not.include(made);
  });
});
