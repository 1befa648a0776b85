// Triggers that fire by themselves: cron through BullMQ job schedulers, file_change through chokidar.
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { expect } from 'chai';
import { startWorkers } from '../../workers/index.js';
import { automationFixture } from '../integration/store-contract.js';
import { eventually, KEYS, startHarness, type Harness } from '../support/harness.js';

type Body = Record<string, any>;

async function history(h: Harness, id: string): Promise<Body[]> {
  return (await h.call<Body>('GET', `/api/v1/automations/${id}/history?limit=100`)).body.data;
}
/** The automation's runs, once there are at least `n` of them. */
function runsOnce(h: Harness, id: string, n: number, what: string): Promise<Body[]> {
  return eventually(
    async () => {
      const r = await history(h, id);
      return r.length >= n ? r : null;
    },
    what,
    10_000,
  );
}
async function schedulers(h: Harness): Promise<string[]> {
  return (await h.rt.queues.get('triggers').getJobSchedulers(0, -1)).map((s) => s.key);
}

describe('cron triggers', function () {
  this.timeout(30_000);
  let h: Harness;
  before(async () => {
    h = await startHarness();
  });
  after(async () => {
    await h.close();
  });

  it('fires on schedule, once per tick even with two worker processes, and stops when disabled', async () => {
    const extra = await startWorkers(h.rt); // a second set of workers on the same queues
    try {
      const a = (
        await h.call('POST', '/api/v1/automations', {
          body: { name: 'tick', triggers: [{ type: 'cron', schedule: '* * * * * *', timezone: 'UTC' }], steps: [{ tool: 'shell', args: { command: 'true' } }] },
        })
      ).body;
      expect(await schedulers(h)).to.include(`cron-${a.id}-0`);
      const runs = await runsOnce(h, a.id, 3, 'three cron runs');
      expect(runs.every((r) => r.trigger.type === 'cron' && r.trigger.schedule === '* * * * * *')).to.equal(true);
      const ticks = runs.map((r) => r.trigger.fire_at);
      expect(new Set(ticks).size, 'one run per tick').to.equal(ticks.length);
      // fire_at is the tick itself (a whole second here), not the time its job was made at the tick before
      expect(
        ticks.every((t) => t.endsWith('.000Z')),
        ticks.join(' '),
      ).to.equal(true);
      expect(runs.every((r) => r.created_at >= r.trigger.fire_at && Date.parse(r.created_at) - Date.parse(r.trigger.fire_at) < 1000)).to.equal(true);

      await h.call('POST', `/api/v1/automations/${a.id}/disable`);
      expect(await schedulers(h)).not.to.include(`cron-${a.id}-0`);
      await new Promise((r) => setTimeout(r, 1500));
      const settled = (await history(h, a.id)).length;
      await new Promise((r) => setTimeout(r, 2000));
      expect((await history(h, a.id)).length).to.equal(settled);

      await h.call('POST', `/api/v1/automations/${a.id}/enable`);
      expect(await schedulers(h)).to.include(`cron-${a.id}-0`);
      await h.call('PATCH', `/api/v1/automations/${a.id}`, { body: { triggers: [{ type: 'manual' }] } });
      expect(await schedulers(h)).not.to.include(`cron-${a.id}-0`);
      await h.call('PATCH', `/api/v1/automations/${a.id}`, { body: { triggers: [{ type: 'cron', schedule: '0 0 1 1 *', timezone: 'Asia/Tokyo' }] } });
      expect(await schedulers(h)).to.include(`cron-${a.id}-0`);
      await h.call('DELETE', `/api/v1/automations/${a.id}`);
      expect(await schedulers(h)).not.to.include(`cron-${a.id}-0`);
    } finally {
      await extra.close();
    }
  });

  it('reconciles schedulers with the store at start-up', async () => {
    const missing = automationFixture('tenant-a', { triggers: [{ type: 'cron', schedule: '0 4 * * *', timezone: 'Europe/Berlin' }] });
    await h.rt.store.automations.insert(missing); // written without its scheduler
    await h.rt.queues.get('triggers').upsertJobScheduler('cron-aut_gone-0', { pattern: '0 5 * * *' }, { name: 'cron', data: {} });
    await h.rt.engine.schedules.reconcile();
    const ids = await schedulers(h);
    expect(ids).to.include(`cron-${missing.id}-0`);
    expect(ids).not.to.include('cron-aut_gone-0');
    const scheduler = (await h.rt.queues.get('triggers').getJobSchedulers(0, -1)).find((s) => s.key === `cron-${missing.id}-0`);
    expect(scheduler).to.deep.include({ pattern: '0 4 * * *', tz: 'Europe/Berlin' });
  });
});

describe('cron schedulers that BullMQ cannot place', function () {
  this.timeout(30_000);
  it("holds back no other automation's scheduler: the reconciler places the rest and says which one failed", async () => {
    const h = await startHarness({ workers: false });
    try {
      const make = async (name: string) =>
        (
          await h.call<Body>('POST', '/api/v1/automations', {
            body: {
              name,
              triggers: [{ type: 'cron', schedule: '0 3 * * *', timezone: 'Australia/Lord_Howe' }],
              steps: [{ tool: 'message', args: { text: 'x' } }],
            },
          })
        ).body;
      const [a, b] = [await make('first'), await make('second')];
      const queue = h.rt.queues.get('triggers');
      for (const id of await schedulers(h)) await queue.removeJobScheduler(id);
      // the failure cron-parser meets at some time zones' transitions ("loop limit exceeded"), for the first one
      const upsert = queue.upsertJobScheduler.bind(queue);
      queue.upsertJobScheduler = (async (id: string, ...rest: unknown[]) => {
        if (id === `cron-${a.id}-0`) throw new Error('Invalid expression, loop limit exceeded');
        return (upsert as (...args: unknown[]) => unknown)(id, ...rest);
      }) as typeof queue.upsertJobScheduler;
      try {
        await h.rt.engine.schedules.reconcile();
      } finally {
        queue.upsertJobScheduler = upsert;
      }
      expect(await schedulers(h)).to.deep.equal([`cron-${b.id}-0`]);
      expect(h.logs.join('\n')).to.contain('cron scheduler not placed').and.contain(a.id);
      await h.rt.engine.schedules.reconcile();
      expect((await schedulers(h)).sort()).to.deep.equal([`cron-${a.id}-0`, `cron-${b.id}-0`].sort());
    } finally {
      await h.close();
    }
  });

  it('refuses H (a hashed value): cron-parser draws it again at every parse, so the schedule would move at every tick', async () => {
    const h = await startHarness({ workers: false });
    try {
      for (const schedule of ['H * * * * *', 'H H * * *', '0 H(0-5) * * *', '*/5 H/2 * * *', '*/H * * * *', '0-H * * * *', '1-5/H * * * *']) {
        const res = await h.call<Body>('POST', '/api/v1/automations', {
          body: { name: 'hashed', triggers: [{ type: 'cron', schedule, timezone: 'UTC' }], steps: [{ tool: 'message', args: { text: 'x' } }] },
        });
        expect(res.status, schedule).to.equal(400);
        expect(res.body.errors[0].path).to.equal('/body/triggers/0/schedule');
      }
      const thursdays = await h.call<Body>('POST', '/api/v1/automations', {
        body: { name: 'thu', triggers: [{ type: 'cron', schedule: '0 9 * * THU', timezone: 'UTC' }], steps: [{ tool: 'message', args: { text: 'x' } }] },
      });
      expect(thursdays.status, 'a day name with an H in it is no hash').to.equal(201);
    } finally {
      await h.close();
    }
  });
});

describe('file_change triggers', function () {
  this.timeout(30_000);
  let h: Harness;
  before(async () => {
    h = await startHarness({ env: { SERVICE_FILE_TRIGGER_REFRESH_SECONDS: '1' } });
  });
  after(async () => {
    await h.close();
  });

  it('starts one debounced run for a burst of matching changes, and none for others', async () => {
    const a = (
      await h.call('POST', '/api/v1/automations', {
        body: {
          name: 'on ts change',
          triggers: [{ type: 'file_change', paths: ['src/**/*.ts'], debounce_ms: 300 }],
          steps: [{ tool: 'shell', args: { command: 'true' } }],
        },
      })
    ).body;
    // the folders exist before the watcher starts, so the burst below is two file events, not a new
    // folder that the watcher must first discover (which can land outside the debounce window)
    await fs.mkdir(path.join(h.tenantDir(), 'src/lib'), { recursive: true });
    await new Promise((r) => setTimeout(r, 1500)); // the watcher refreshes its automations every second
    await fs.writeFile(path.join(h.tenantDir(), 'src/a.ts'), 'a');
    await fs.writeFile(path.join(h.tenantDir(), 'src/lib/b.ts'), 'b');
    await fs.writeFile(path.join(h.tenantDir(), 'README.md'), 'not watched');
    const runs = await runsOnce(h, a.id, 1, 'a file_change run');
    await new Promise((r) => setTimeout(r, 800));
    const all = await history(h, a.id);
    expect(all).to.have.length(1);
    expect(runs[0]!.trigger).to.deep.equal({ type: 'file_change', paths: ['src/a.ts', 'src/lib/b.ts'] });

    await fs.writeFile(path.join(h.tenantDir(), 'notes.txt'), 'x');
    await new Promise((r) => setTimeout(r, 800));
    expect(await history(h, a.id)).to.have.length(1);

    await h.call('POST', `/api/v1/automations/${a.id}/disable`);
    await new Promise((r) => setTimeout(r, 1500));
    await fs.writeFile(path.join(h.tenantDir(), 'src/c.ts'), 'c');
    await new Promise((r) => setTimeout(r, 1000));
    expect(await history(h, a.id)).to.have.length(1);
  });

  it('fires each change that follows the last batch closely, losing none (debounce 0)', async () => {
    const a = (
      await h.call('POST', '/api/v1/automations', {
        body: { name: 'no debounce', triggers: [{ type: 'file_change', paths: ['d0/**'], debounce_ms: 0 }], steps: [{ tool: 'message', args: { text: 'x' } }] },
      })
    ).body;
    await fs.mkdir(path.join(h.tenantDir(), 'd0'), { recursive: true });
    await new Promise((r) => setTimeout(r, 1500));
    await fs.writeFile(path.join(h.tenantDir(), 'd0/first.txt'), '1');
    await new Promise((r) => setTimeout(r, 120));
    await fs.writeFile(path.join(h.tenantDir(), 'd0/second.txt'), '2');
    const runs = await runsOnce(h, a.id, 2, 'a run for each change');
    expect(
      runs
        .map((r) => r.trigger.paths)
        .flat()
        .sort(),
    ).to.deep.equal(['d0/first.txt', 'd0/second.txt']);
  });

  it("follows a tenant's root that is itself a link (its folder on another disk)", async () => {
    const linked = await startHarness({ env: { SERVICE_FILE_TRIGGER_REFRESH_SECONDS: '1' } });
    const elsewhere = await fs.mkdtemp(path.join(os.tmpdir(), 'svc-tenant-disk-'));
    try {
      await fs.symlink(elsewhere, path.join(linked.workspace, 'tenant-a'));
      const a = (
        await linked.call<Body>('POST', '/api/v1/automations', {
          body: { name: 'linked', triggers: [{ type: 'file_change', paths: ['*.txt'], debounce_ms: 100 }], steps: [{ tool: 'message', args: { text: 'x' } }] },
        })
      ).body;
      await new Promise((r) => setTimeout(r, 1500));
      await fs.writeFile(path.join(elsewhere, 'note.txt'), 'x');
      const runs = await runsOnce(linked, a.id, 1, 'a run');
      expect(runs[0]!.trigger.paths).to.deep.equal(['note.txt']);
    } finally {
      await linked.close();
      await fs.rm(elsewhere, { recursive: true, force: true });
    }
  });

  it("never follows a link out of the tenant's root: another tenant's files are not seen through it", async () => {
    const a = (
      await h.call('POST', '/api/v1/automations', {
        body: { name: 'peek', triggers: [{ type: 'file_change', paths: ['peek/**'], debounce_ms: 100 }], steps: [{ tool: 'message', args: { text: 'x' } }] },
      })
    ).body;
    // tenant-b is watched too (it has an automation of its own), and tenant-a links to its folder
    await h.call('POST', '/api/v1/automations', {
      key: KEYS.b,
      body: { name: 'b watches', triggers: [{ type: 'file_change', paths: ['**'] }], steps: [{ tool: 'message', args: { text: 'x' } }] },
    });
    await fs.symlink(h.tenantDir('tenant-b'), path.join(h.tenantDir(), 'peek'));
    await new Promise((r) => setTimeout(r, 1500));
    await fs.writeFile(path.join(h.tenantDir('tenant-b'), 'acquisition-target.txt'), 'secret plans');
    await new Promise((r) => setTimeout(r, 1500));
    expect(await history(h, a.id)).to.deep.equal([]);
  });
});
