import { expect } from 'chai';
import { eventually, finishedRun, KEYS, startHarness, type Harness } from '../support/harness.js';
import { startWorkers } from '../../workers/index.js';

type Body = Record<string, any>;

describe('automation runs', function () {
  this.timeout(30_000);
  let h: Harness;
  before(async () => {
    h = await startHarness();
  });
  after(async () => {
    await h.close();
  });

  const create = async (over: object = {}) =>
    (
      await h.call('POST', '/api/v1/automations', {
        body: {
          name: 'echo',
          steps: [{ tool: 'shell', args: { command: 'echo "$0"' } }],
          inputs: { greeting: 'hi' },
          triggers: [{ type: 'manual' }, { type: 'cron', schedule: '0 3 * * *', timezone: 'Europe/Paris' }],
          ...over,
        },
      })
    ).body;

  it('starts a run (202), which then shows in the history and the status', async () => {
    const a = await create();
    const started = await h.call('POST', '/api/v1/automations/run', { body: { automation_id: a.id, inputs: { extra: 1 } } });
    expect(started.status, started.text).to.equal(202);
    expect(started.body.run).to.deep.include({ kind: 'automation', automation_id: a.id });
    expect(started.body.run.trigger.type).to.equal('manual');
    expect(started.body.run.inputs).to.deep.equal({ greeting: 'hi', extra: 1 });
    const failing = await h.call('POST', '/api/v1/automations', { body: { name: 'fails', steps: [{ tool: 'shell', args: { command: 'exit 1' } }] } });
    await h.call('POST', '/api/v1/automations/run', { body: { automation_id: failing.body.id } });
    await eventually(async () => (await h.call<Body>('GET', `/api/v1/runs/${started.body.run_id}`)).body.status === 'succeeded', 'the run');
    await h.call('POST', '/api/v1/automations/run', { body: { automation_id: a.id } });
    await eventually(async () => (await h.call<Body>('GET', `/api/v1/automations/${a.id}/status`)).body.counts.succeeded === 2, 'two runs');

    const history = await h.call('GET', `/api/v1/automations/${a.id}/history?limit=1`);
    expect(history.status).to.equal(200);
    expect(history.body.data).to.have.length(1);
    expect(history.body.data[0]).to.include.keys('id', 'status', 'duration_ms', 'summary');
    const page2 = await h.call('GET', `/api/v1/automations/${a.id}/history?limit=1&cursor=${history.body.next_cursor}`);
    expect(page2.body.data[0].id).to.equal(started.body.run_id);
    expect(page2.body.next_cursor).to.equal(null);

    const status = (await h.call('GET', `/api/v1/automations/${a.id}/status`)).body;
    expect(status.counts).to.deep.include({ succeeded: 2, failed: 0, queued: 0 });
    expect(status.success_rate).to.equal(1);
    expect(status.duration_ms.sample).to.equal(2);
    expect(status.duration_ms.p50).to.be.a('number');
    expect(status.last_run.status).to.equal('succeeded');
    expect(new Date(status.next_fire_at).getTime()).to.be.greaterThan(Date.now());
  });

  it('refuses a disabled automation (409) and an archived one (404), and tenant B’s request for A’s (404)', async () => {
    const a = await create();
    expect((await h.call('POST', '/api/v1/automations/run', { body: { automation_id: a.id }, key: KEYS.b })).status).to.equal(404);
    expect((await h.call('GET', `/api/v1/automations/${a.id}/status`, { key: KEYS.b })).status).to.equal(404);
    expect((await h.call('GET', `/api/v1/automations/${a.id}/history`, { key: KEYS.b })).status).to.equal(404);
    await h.call('POST', `/api/v1/automations/${a.id}/disable`);
    const disabled = await h.call('POST', '/api/v1/automations/run', { body: { automation_id: a.id } });
    expect(disabled.status).to.equal(409);
    expect((await h.call('GET', `/api/v1/automations/${a.id}/status`)).body.next_fire_at).to.equal(null);
    await h.call('DELETE', `/api/v1/automations/${a.id}`);
    expect((await h.call('POST', '/api/v1/automations/run', { body: { automation_id: a.id } })).status).to.equal(404);
    expect((await h.call('GET', `/api/v1/automations/${a.id}/history`)).body.data).to.deep.equal([]);
  });

  it('never starts a run queued before its automation was disabled or archived: it ends canceled, its steps never run', async () => {
    const idle = await startHarness({ workers: false });
    try {
      const made = async (name: string) =>
        (await idle.call<Body>('POST', '/api/v1/automations', { body: { name, steps: [{ tool: 'shell', args: { command: 'touch ran' } }] } })).body;
      const [disabled, archived] = [await made('to disable'), await made('to archive')];
      const queued = [];
      for (const a of [disabled, archived]) {
        const res = await idle.call<Body>('POST', '/api/v1/automations/run', { body: { automation_id: a.id } });
        expect(res.status, res.text).to.equal(202);
        queued.push(res.body.run_id as string);
      }
      expect((await idle.call('POST', `/api/v1/automations/${disabled.id}/disable`)).status).to.equal(200);
      expect((await idle.call('DELETE', `/api/v1/automations/${archived.id}`)).status).to.equal(204);
      const workers = await startWorkers(idle.rt);
      try {
        const [one, two] = [await finishedRun(idle, queued[0]!), await finishedRun(idle, queued[1]!)];
        expect([one.status, two.status]).to.deep.equal(['canceled', 'canceled']);
        expect(one.error.message).to.equal(`automation ${disabled.id} was disabled before the run started`);
        expect(two.error.message).to.equal(`automation ${archived.id} was archived before the run started`);
        // as any run canceled before it started: its plan's steps never ran
        expect(one.steps.map((st: Body) => st.status)).to.deep.equal(['pending']);
      } finally {
        await workers.close();
      }
    } finally {
      await idle.close();
    }
  });

  it('goes on with an attempt a deploy interrupted after its automation was disabled: a disable stops no run already running', async () => {
    const idle = await startHarness({ workers: false });
    try {
      const a = (await idle.call<Body>('POST', '/api/v1/automations', { body: { name: 'long', steps: [{ tool: 'shell', args: { command: 'true' } }] } })).body;
      const res = await idle.call<Body>('POST', '/api/v1/automations/run', { body: { automation_id: a.id } });
      expect(res.status, res.text).to.equal(202);
      expect((await idle.call('POST', `/api/v1/automations/${a.id}/disable`)).status).to.equal(200);
      const run = (await idle.rt.store.runs.get(res.body.run.tenant_id, res.body.run_id))!;
      const { automations } = idle.rt.engine;
      // its first start is refused, as the test above shows through the workers
      expect(await automations.mayStart(run)).to.deep.equal({ refuse: `automation ${a.id} was disabled before the run started` });
      // its second attempt after a retry is refused too: the retry is a new start
      const retried = { ...run, attempt: 2, attempts: [{ ...attemptOf(1), outcome: 'retried' as const }] };
      expect(await automations.mayStart(retried)).to.deep.equal({ refuse: `automation ${a.id} was disabled before the run's attempt 2 started` });
      // an attempt a deploy cut off goes on: the run had started while its automation was enabled
      const interrupted = { ...run, attempt: 2, attempts: [{ ...attemptOf(1), outcome: 'interrupted' as const }] };
      expect(await automations.mayStart(interrupted)).to.equal(null);
    } finally {
      await idle.close();
    }
  });

  it('runs an automation once per Idempotency-Key', async () => {
    const a = await create();
    const headers = { 'idempotency-key': `nightly-${a.id}` };
    const one = await h.call('POST', '/api/v1/automations/run', { body: { automation_id: a.id }, headers });
    const two = await h.call('POST', '/api/v1/automations/run', { body: { automation_id: a.id }, headers });
    expect(two.body.run_id).to.equal(one.body.run_id);
    // a retry answers the run it started, even once the automation is disabled (a new key is refused)
    expect((await h.call('POST', `/api/v1/automations/${a.id}/disable`)).status).to.equal(200);
    const retried = await h.call('POST', '/api/v1/automations/run', { body: { automation_id: a.id }, headers });
    expect(retried.status, retried.text).to.equal(202);
    expect(retried.body.run_id).to.equal(one.body.run_id);
    expect(retried.headers.get('idempotent-replayed')).to.equal('true');
    const fresh = await h.call('POST', '/api/v1/automations/run', { body: { automation_id: a.id }, headers: { 'idempotency-key': `other-${a.id}` } });
    expect(fresh.status).to.equal(409);
    // and the refused new key was not kept: once enabled, it starts a run
    await h.call('POST', `/api/v1/automations/${a.id}/enable`);
    const later = await h.call('POST', '/api/v1/automations/run', { body: { automation_id: a.id }, headers: { 'idempotency-key': `other-${a.id}` } });
    expect(later.status).to.equal(202);
    expect(later.body.run_id).not.to.equal(one.body.run_id);
  });
});

const attemptOf = (attempt: number) => ({
  attempt,
  status: 'running' as const,
  error: null,
  started_at: '2026-11-30T00:00:00.000Z',
  finished_at: '2026-11-30T00:00:01.000Z',
  duration_ms: 1000,
});
