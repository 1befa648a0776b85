// A workspace audit when Redis comes back with older data (a restart from an older save, a failover to a
// lagging replica): the report and its jobs read as they were before it finished. The evidence ledger in
// the store says it was assembled: the report is finished again from it, its phases do not run again, and
// the ledger keeps one entry for it.
import { expect } from 'chai';
import { scanKeys } from '../../engine/platform/redis.js';
import { eventually, startHarness, type Harness } from '../support/harness.js';
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
