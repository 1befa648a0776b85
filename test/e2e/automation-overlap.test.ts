// Overlap policies of automations: skip, queue and replace hold an automation to one run at a time, each its
// own way; allow (the default) lets runs of it start side by side.
import fs from 'node:fs/promises';
import path from 'node:path';
import { expect } from 'chai';
import { eventually, finishedRun, KEYS, startHarness, type Harness } from '../support/harness.js';
import { QUEUE_MAX_WAITING } from '../../engine/automations/index.js';
import { newId } from '../../engine/platform/index.js';
import { runFixture } from '../integration/store-contract.js';

type Body = Record<string, any>;

describe('automation overlap policies', function () {
  this.timeout(60_000);
  let h: Harness;
  before(async () => {
    h = await startHarness({ env: { SERVICE_WORKER_CONCURRENCY: '8' } });
  });
  after(async () => {
    await h.close();
  });

  /** An automation whose run writes its start and end to `log` (ns), `sleep` seconds apart. */
  const automation = async (overlap: string | undefined, log: string, sleep: number) => {
    // a run's name: the time it started, in ns (each step's shell is pid 1 or so in its sandbox)
    const command = `id=$(date +%s%N); echo "S $id $id" >> ${log}; sleep ${sleep}; echo "E $id $(date +%s%N)" >> ${log}`;
    const res = await h.call<Body>('POST', '/api/v1/automations', {
      body: { name: `overlap ${overlap ?? 'default'}`, steps: [{ tool: 'shell', args: { command } }], ...(overlap ? { overlap } : {}) },
    });
    expect(res.status, res.text).to.equal(201);
    return res.body;
  };
  const fire = async (id: string) => {
    const res = await h.call<Body>('POST', '/api/v1/automations/run', { body: { automation_id: id } });
    expect(res.status, res.text).to.equal(202);
    return res.body.run_id as string;
  };
  /** The [start, end] of each run the log tells of, in ns, in the order they started (every run here ends by itself). */
  const spans = async (log: string) => {
    const lines = (await fs.readFile(path.join(h.tenantDir(), log), 'utf8')).trim().split('\n');
    const at = (kind: string) => new Map(lines.filter((l) => l.startsWith(`${kind} `)).map((l) => [l.split(' ')[1]!, BigInt(l.split(' ')[2]!)]));
    const [starts, ends] = [at('S'), at('E')];
    return [...starts].sort((x, y) => (x[1] < y[1] ? -1 : 1)).map(([run, start]) => [start, ends.get(run)!] as const);
  };
  const overlapping = (s: (readonly [bigint, bigint])[]) => s.some(([start], i) => i > 0 && start < s[i - 1]![1]);

  it('lets runs of an automation start side by side by default (allow), and says its policy', async () => {
    const a = await automation(undefined, 'allow.log', 1);
    expect(a.overlap).to.equal('allow');
    const ids = [await fire(a.id), await fire(a.id)];
    for (const id of ids) expect((await finishedRun(h, id)).status).to.equal('succeeded');
    expect(overlapping(await spans('allow.log')), 'the two ran at once').to.equal(true);
    expect((await h.call<Body>('GET', `/api/v1/runs/${ids[0]}`)).body).to.not.have.property('overlap');
  });

  it('skips a run that meets another of its automation at its start (skip): canceled, saying which; the next fire after runs', async () => {
    const a = await automation('skip', 'skip.log', 2);
    const first = await fire(a.id);
    await eventually(async () => (await h.call<Body>('GET', `/api/v1/runs/${first}`)).body.status === 'running' || null, 'the first run to start');
    const second = await fire(a.id);
    const skipped = await finishedRun(h, second);
    expect(skipped.status).to.equal('canceled');
    expect(skipped.summary).to.contain(`skipped: run ${first} of automation ${a.id} is running (overlap: skip)`);
    expect(skipped.overlap).to.equal('skip');
    expect((await finishedRun(h, first)).status).to.equal('succeeded');
    const third = await fire(a.id);
    expect((await finishedRun(h, third)).status).to.equal('succeeded');
    expect(await spans('skip.log')).to.have.length(2);
  });

  it('runs them one at a time, in order, each as soon as the one before ends (queue)', async () => {
    const a = await automation('queue', 'queue.log', 0.5);
    const started = Date.now();
    const ids = [];
    for (let i = 0; i < 4; i++) ids.push(await fire(a.id));
    for (const id of ids) expect((await finishedRun(h, id)).status, id).to.equal('succeeded');
    const s = await spans('queue.log');
    expect(s).to.have.length(4);
    expect(overlapping(s), 'no two at once').to.equal(false);
    // each offered as its holder ended, not at its next try 5 s later
    expect(Date.now() - started).to.be.below(4 * 500 + 3000);
    const order = (await Promise.all(ids.map(async (id) => (await h.call<Body>('GET', `/api/v1/runs/${id}`)).body.started_at as string))).slice();
    expect([...order].sort()).to.deep.equal(order);
  });

  it('cancels the runs not yet ended when it fires (replace), and starts its own once they have stopped', async () => {
    // a run sleeps unless the mark is there when it starts
    const res = await h.call<Body>('POST', '/api/v1/automations', {
      body: {
        name: 'replace',
        steps: [{ tool: 'shell', args: { command: 'if [ -e replaced.mark ]; then echo quick; else echo asleep >> sleeping.log; sleep 30; fi' } }],
        overlap: 'replace',
      },
    });
    const a = res.body;
    const get = async (id: string) => (await h.call<Body>('GET', `/api/v1/runs/${id}`)).body;
    const first = await fire(a.id);
    await eventually(async () => (await get(first)).status === 'running' || null, 'the first run to start');
    /** runs past their check of the mark, asleep (a loaded machine starts a shell well after its run's start is written) */
    const asleep = (n: number) =>
      eventually(
        async () => (await fs.readFile(path.join(h.tenantDir(), 'sleeping.log'), 'utf8').catch(() => '')) === 'asleep\n'.repeat(n) || null,
        `${n} asleep`,
      );
    await asleep(1);
    const second = await fire(a.id);
    expect((await finishedRun(h, first)).status).to.equal('canceled');
    await asleep(2);
    await fs.writeFile(path.join(h.tenantDir(), 'replaced.mark'), '');
    const third = await fire(a.id);
    const [one, two, three] = [await finishedRun(h, first), await finishedRun(h, second), await finishedRun(h, third)];
    expect([one.status, two.status, three.status]).to.deep.equal(['canceled', 'canceled', 'succeeded']);
    expect(three.steps[0].output.stdout).to.equal('quick\n');
    // each started once the one it replaced had ended
    expect(Date.parse(two.started_at)).to.be.at.least(Date.parse(one.finished_at));
    expect(Date.parse(three.started_at)).to.be.at.least(Date.parse(two.finished_at));
  });

  it('replaces only runs made before: of two fires at once the later runs; a rerun keeps its run’s policy', async () => {
    const res = await h.call<Body>('POST', '/api/v1/automations', {
      body: { name: 'replace at once', steps: [{ tool: 'shell', args: { command: 'sleep 0.5' } }], overlap: 'replace' },
    });
    const ids = await Promise.all([fire(res.body.id), fire(res.body.id)]);
    const ended = await Promise.all(ids.map((id) => finishedRun(h, id)));
    expect(ended.map((r) => r.status).sort()).to.deep.equal(['canceled', 'succeeded']);
    const later = ended.reduce((x, y) => (x.created_at > y.created_at || (x.created_at === y.created_at && x.id > y.id) ? x : y));
    expect(later.status, 'the later one runs').to.equal('succeeded');
    // a rerun is a run of the automation by hand: under its policy
    const skip = await automation('skip', 'rerun.log', 0);
    const first = await finishedRun(h, await fire(skip.id));
    const rerun = await h.call<Body>('POST', `/api/v1/runs/${first.id}/rerun`);
    expect(rerun.status, rerun.text).to.equal(202);
    expect(rerun.body.run.overlap).to.equal('skip');
  });

  it('offers only a run its policy held when the holder ends: not one of the automation waiting out a retry’s backoff', async () => {
    const made = await h.call<Body>('POST', '/api/v1/automations', {
      body: {
        name: 'backoff',
        steps: [{ tool: 'shell', args: { command: '[ -e backoff.mark ] || exit 1' } }],
        retry: { attempts: 2, backoff: { type: 'fixed', delay_ms: 30_000 } },
      },
    });
    const a = made.body;
    // made before the policy: it fails, and waits 30 s for its next attempt
    const waiting = await fire(a.id);
    await eventually(async () => {
      const r = (await h.call<Body>('GET', `/api/v1/runs/${waiting}`)).body;
      return r.status === 'queued' && r.attempt === 2 ? r : null;
    }, 'the first attempt to fail');
    expect((await h.call('PATCH', `/api/v1/automations/${a.id}`, { body: { overlap: 'queue' } })).status).to.equal(200);
    await fs.writeFile(path.join(h.tenantDir(), 'backoff.mark'), '');
    const next = await finishedRun(h, await fire(a.id));
    expect(next.status).to.equal('succeeded');
    await new Promise((r) => setTimeout(r, 1500));
    const still = (await h.call<Body>('GET', `/api/v1/runs/${waiting}`)).body;
    expect(still, 'its backoff kept').to.deep.include({ status: 'queued', attempt: 2 });
    expect((await h.call('POST', `/api/v1/runs/${waiting}/cancel`)).status).to.be.oneOf([200, 202]);
  });

  it('replaces nothing with a fire a disable cancels (disabled as it fired), nor with a replay of a run that ended', async () => {
    const res = await h.call<Body>('POST', '/api/v1/automations', {
      body: { name: 'replace, disabled', steps: [{ tool: 'shell', args: { command: 'sleep 20' } }], overlap: 'replace' },
    });
    const a = res.body;
    const running = await fire(a.id);
    await eventually(async () => (await h.call<Body>('GET', `/api/v1/runs/${running}`)).body.status === 'running' || null, 'the run to start');
    // disabled between the fire's read of the automation and its run's insert
    const automations = h.rt.store.automations;
    const get = automations.get.bind(automations);
    let reads = 0;
    automations.get = (async (...args: Parameters<typeof get>) => {
      const found = await get(...args);
      return found && args[1] === a.id && ++reads > 1 ? { ...found, status: 'disabled' } : found;
    }) as typeof get;
    try {
      const fired = await h.rt.engine.fire('tenant-a', a.id, { type: 'manual', request_id: 'disabled-as-it-fired' }, 'disabled-as-it-fired');
      // canceled by the fire, or at its start by the automation's guard, whichever comes first
      expect((await finishedRun(h, fired!.id)).status).to.equal('canceled');
      // its replay (the same key) finds its run ended: it replaces nothing either
      await h.rt.engine.fire('tenant-a', a.id, { type: 'manual', request_id: 'disabled-as-it-fired' }, 'disabled-as-it-fired');
    } finally {
      automations.get = get;
    }
    await new Promise((r) => setTimeout(r, 500));
    expect((await h.call<Body>('GET', `/api/v1/runs/${running}`)).body.status, 'the run that stood').to.equal('running');
    expect((await h.call('POST', `/api/v1/runs/${running}/cancel`)).status).to.be.oneOf([200, 202]);
  });

  it(`cancels a fire that finds ${QUEUE_MAX_WAITING} runs of its automation before it (queue): held runs are out of the tenant's line, and bounded here`, async () => {
    const a = await automation('queue', 'full.log', 0);
    const at = new Date(Date.now() - 1000).toISOString();
    const waiting = Array.from({ length: QUEUE_MAX_WAITING }, () =>
      runFixture('tenant-a', { id: newId('run'), automation_id: a.id, overlap: 'queue', created_at: at, workspace: h.tenantDir() }),
    );
    for (const r of waiting) await h.rt.store.runs.insert(r);
    try {
      const over = await finishedRun(h, await fire(a.id));
      expect(over.status).to.equal('canceled');
      expect(over.summary).to.contain(`skipped: ${QUEUE_MAX_WAITING} runs of automation ${a.id} wait or run before it`);
    } finally {
      for (const r of waiting)
        await h.rt.store.runs.update('tenant-a', r.id, { status: 'canceled', finished_at: new Date().toISOString() }, { status: ['queued'] });
    }
  });

  it('takes over a key whose holder ended without giving it back, changes its policy by PATCH, refuses an unknown one, and keeps tenants apart', async () => {
    const a = await automation('queue', 'stale.log', 0);
    const done = await finishedRun(h, await fire(a.id));
    // its process died before its end gave the key back
    await h.rt.redis.set(`${h.config.queuePrefix}:automation-running:tenant-a:${a.id}`, done.id);
    expect((await finishedRun(h, await fire(a.id))).status).to.equal('succeeded');
    const patched = await h.call<Body>('PATCH', `/api/v1/automations/${a.id}`, { body: { overlap: 'skip' } });
    expect(patched.status, patched.text).to.equal(200);
    expect(patched.body.overlap).to.equal('skip');
    expect((await h.call('PATCH', `/api/v1/automations/${a.id}`, { body: { overlap: 'sometimes' } })).status).to.equal(400);
    expect(
      (await h.call('POST', '/api/v1/automations', { body: { name: 'x', steps: [{ tool: 'shell', args: { command: 'true' } }], overlap: 'never' } })).status,
    ).to.equal(400);
    // another tenant's automation of the same policy runs beside it: keys are per tenant and automation
    const b = await h.call<Body>('POST', '/api/v1/automations', {
      key: KEYS.b,
      body: { name: 'b', steps: [{ tool: 'shell', args: { command: 'sleep 1' } }], overlap: 'skip' },
    });
    const ofB = await h.call<Body>('POST', '/api/v1/automations/run', { key: KEYS.b, body: { automation_id: b.body.id } });
    const ofA = await fire(a.id);
    expect((await finishedRun(h, ofB.body.run_id, KEYS.b)).status).to.equal('succeeded');
    expect((await finishedRun(h, ofA)).status).to.equal('succeeded');
  });
});
