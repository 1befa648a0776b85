// Triggers that fire by themselves, on a schedule: cron through the set of due triggers and its ticker (file
// changes: file-triggers.test.ts).
import { expect } from 'chai';
import { startWorkers } from '../../workers/index.js';
import { CRON_TICK, cronDueKey, cronJobIdOf, nextCronFire, type CronJob } from '../../engine/automations/index.js';
import { automationFixture } from '../integration/store-contract.js';
import { ServiceUnavailableError, ValidationError } from '../../engine/platform/index.js';
import { history, runsOnce } from '../support/automation-history.js';
import { eventually, startHarness, type Harness } from '../support/harness.js';

type Body = Record<string, any>;

/** The cron triggers placed in the set, `{automation}-{index}` to the time each fires next. */
async function placed(h: Harness): Promise<Map<string, number>> {
  const all = await h.rt.redis.zrange(cronDueKey(h.config.queuePrefix), 0, -1, 'WITHSCORES');
  const out = new Map<string, number>();
  for (let i = 0; i < all.length; i += 2) {
    const [, automation, index] = all[i]!.split('\t');
    out.set(`${automation}-${index}`, Number(all[i + 1]));
  }
  return out;
}
const cronAutomation = (name: string, schedule: string, timezone = 'UTC') => ({
  name,
  triggers: [{ type: 'cron', schedule, timezone }],
  steps: [{ tool: 'message', args: { text: 'x' } }],
});

describe('cron triggers', function () {
  this.timeout(30_000);
  let h: Harness;
  before(async () => {
    // second-level crons: fires within the test's time
    h = await startHarness({ env: { SERVICE_CRON_MIN_INTERVAL_SECONDS: '1' } });
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
      expect((await placed(h)).has(`${a.id}-0`)).to.equal(true);
      const runs = await runsOnce(h, a.id, 3, 'three cron runs');
      expect(runs.every((r) => r.trigger.type === 'cron' && r.trigger.schedule === '* * * * * *')).to.equal(true);
      const ticks = runs.map((r) => r.trigger.fire_at);
      expect(new Set(ticks).size, 'one run per tick').to.equal(ticks.length);
      // fire_at is the tick itself (a whole second here), and its run is made then, not at the ticker's next tick
      expect(
        ticks.every((t) => t.endsWith('.000Z')),
        ticks.join(' '),
      ).to.equal(true);
      // made then: the middle one of three within a second of its tick, none more than 3 s late (a loaded machine
      // promotes a delayed job late), none early
      const late = runs.map((r) => Date.parse(r.created_at) - Date.parse(r.trigger.fire_at)).sort((x, y) => x - y);
      expect(late[0], late.join(' ')).to.be.at.least(0);
      expect(late[1], late.join(' ')).to.be.below(1000);
      expect(late.at(-1), late.join(' ')).to.be.below(3000);

      await h.call('POST', `/api/v1/automations/${a.id}/disable`);
      expect((await placed(h)).has(`${a.id}-0`)).to.equal(false);
      await new Promise((r) => setTimeout(r, 2500)); // the fires handed over before it was disabled find it disabled
      const settled = (await history(h, a.id)).length;
      await new Promise((r) => setTimeout(r, 2000));
      expect((await history(h, a.id)).length).to.equal(settled);

      await h.call('POST', `/api/v1/automations/${a.id}/enable`);
      expect((await placed(h)).has(`${a.id}-0`)).to.equal(true);
      await h.call('PATCH', `/api/v1/automations/${a.id}`, { body: { triggers: [{ type: 'manual' }] } });
      expect((await placed(h)).has(`${a.id}-0`)).to.equal(false);
      await h.call('PATCH', `/api/v1/automations/${a.id}`, { body: { triggers: [{ type: 'cron', schedule: '0 0 1 1 *', timezone: 'Asia/Tokyo' }] } });
      const newYear = new Date(`${new Date().getUTCFullYear()}-12-31T15:00:00Z`).getTime(); // midnight in Tokyo
      expect((await placed(h)).get(`${a.id}-0`)).to.equal(newYear);
      await h.call('DELETE', `/api/v1/automations/${a.id}`);
      expect((await placed(h)).has(`${a.id}-0`)).to.equal(false);
    } finally {
      await extra.close();
    }
  });

  it('leaves the set as the store’s last change left it when two changes race and their set writes land in the other order', async () => {
    const a = (await h.call('POST', '/api/v1/automations', { body: cronAutomation('raced', '0 3 1 1 *') })).body;
    const cron = (...schedules: string[]) => ({ triggers: schedules.map((schedule) => ({ type: 'cron', schedule, timezone: 'UTC' })) });
    // the first change is stored, then held before its write to the set (a slow process) until the second is
    // stored and written: stored first, written last
    const update = h.rt.store.automations.update.bind(h.rt.store.automations);
    let stored!: () => void;
    const firstStored = new Promise<void>((resolve) => (stored = resolve));
    let release!: () => void;
    const held = new Promise<void>((resolve) => (release = resolve));
    let calls = 0;
    h.rt.store.automations.update = async (...args: Parameters<typeof update>) => {
      const answer = await update(...args);
      if (calls++ === 0) {
        stored();
        await held;
      }
      return answer;
    };
    try {
      const first = h.call('PATCH', `/api/v1/automations/${a.id}`, { body: cron('0 4 1 1 *', '0 6 1 1 *') });
      await firstStored;
      expect((await h.call('PATCH', `/api/v1/automations/${a.id}`, { body: cron('0 5 1 1 *') })).status).to.equal(200);
      release();
      expect((await first).status).to.equal(200);
    } finally {
      h.rt.store.automations.update = update;
    }
    expect((await h.call('GET', `/api/v1/automations/${a.id}`)).body.triggers).to.deep.equal(cron('0 5 1 1 *').triggers);
    const p = await placed(h);
    expect(p.get(`${a.id}-0`), 'at the stored schedule').to.equal(nextCronFire('0 5 1 1 *', 'UTC', new Date())!.getTime());
    expect(p.has(`${a.id}-1`), 'a trigger the stored automation does not have').to.equal(false);
    await h.call('DELETE', `/api/v1/automations/${a.id}`);
  });

  /**
   * A create whose write to the set is held (a slow process) after its insert, until `meanwhile` changes the
   * automation and its write lands: the create is stored first and written last. Answers the automation.
   */
  async function createHeldBehind(body: Body, meanwhile: (id: string) => Promise<void>): Promise<Body> {
    const insert = h.rt.store.automations.insert.bind(h.rt.store.automations);
    let stored!: (id: string) => void;
    const inserted = new Promise<string>((resolve) => (stored = resolve));
    let release!: () => void;
    const held = new Promise<void>((resolve) => (release = resolve));
    h.rt.store.automations.insert = async (...args: Parameters<typeof insert>) => {
      const answer = await insert(...args);
      stored(args[0].id);
      await held;
      return answer;
    };
    try {
      const created = h.call<Body>('POST', '/api/v1/automations', { body });
      await meanwhile(await inserted);
      release();
      const answer = await created;
      expect(answer.status).to.equal(201);
      return answer.body;
    } finally {
      h.rt.store.automations.insert = insert;
    }
  }

  it("leaves a change's placement when the automation's create writes to the set after it", async () => {
    const a = await createHeldBehind(cronAutomation('created late', '0 3 1 1 *'), async (id) => {
      const patched = await h.call('PATCH', `/api/v1/automations/${id}`, { body: { triggers: [{ type: 'cron', schedule: '0 5 1 1 *', timezone: 'UTC' }] } });
      expect(patched.status).to.equal(200);
    });
    expect((await placed(h)).get(`${a.id}-0`), 'at the stored schedule, not the create’s').to.equal(nextCronFire('0 5 1 1 *', 'UTC', new Date())!.getTime());
    await h.call('DELETE', `/api/v1/automations/${a.id}`);
  });

  it('never fires at a time the stored schedule does not give: a change stored before the create writes, written after it', async () => {
    const update = h.rt.store.automations.update.bind(h.rt.store.automations);
    let stored!: () => void;
    const patchStored = new Promise<void>((resolve) => (stored = resolve));
    let release!: () => void;
    const held = new Promise<void>((resolve) => (release = resolve));
    h.rt.store.automations.update = async (...args: Parameters<typeof update>) => {
      const answer = await update(...args);
      stored();
      await held;
      return answer;
    };
    let patched: Promise<unknown> = Promise.resolve();
    try {
      // the create's trigger fires every second: its write hands the next one over, reading the stored automation
      const a = await createHeldBehind(cronAutomation('changed early', '* * * * * *'), async (id) => {
        patched = h.call('PATCH', `/api/v1/automations/${id}`, { body: { triggers: [{ type: 'cron', schedule: '0 0 1 1 *', timezone: 'UTC' }] } });
        await patchStored; // stored; its write to the set held
      });
      release();
      expect(((await patched) as { status: number }).status).to.equal(200);
      await new Promise((r) => setTimeout(r, 2500));
      expect(await history(h, a.id), 'no run at a time of the schedule it no longer has').to.deep.equal([]);
      expect((await placed(h)).get(`${a.id}-0`)).to.equal(nextCronFire('0 0 1 1 *', 'UTC', new Date())!.getTime());
      await h.call('DELETE', `/api/v1/automations/${a.id}`);
    } finally {
      release();
      h.rt.store.automations.update = update;
    }
  });

  // the create's NX adds the trigger back here, as a plain ZADD would: this holds that such a member fires nothing
  it('never fires an automation archived before its create wrote to the set', async () => {
    const a = await createHeldBehind(cronAutomation('archived early', '* * * * * *'), async (id) => {
      expect((await h.call('DELETE', `/api/v1/automations/${id}`)).status).to.equal(204);
    });
    // the create added its trigger back, and its fire due within the tick found the automation archived
    expect((await placed(h)).has(`${a.id}-0`), 'dropped at once').to.equal(false);
    await new Promise((r) => setTimeout(r, 2500));
    expect(await history(h, a.id)).to.deep.equal([]);
    expect((await placed(h)).has(`${a.id}-0`)).to.equal(false);
  });

  it('reconciles the set with the store at start-up: missing and moved triggers placed, strays and the earlier per-trigger schedulers removed', async () => {
    const missing = automationFixture('tenant-a', { triggers: [{ type: 'cron', schedule: '0 4 * * *', timezone: 'Europe/Berlin' }] });
    await h.rt.store.automations.insert(missing); // written without its trigger placed
    const moved = automationFixture('tenant-a', { triggers: [{ type: 'manual' }, { type: 'cron', schedule: '0 6 * * *', timezone: 'UTC' }] });
    await h.rt.store.automations.insert(moved);
    const key = cronDueKey(h.config.queuePrefix);
    const future = Date.now() + 3_600_000;
    await h.rt.redis.zadd(key, future, `tenant-a\t${moved.id}\t1`); // placed for a schedule it no longer has
    await h.rt.redis.zadd(key, future, 'tenant-a\taut_gone\t0');
    const queue = h.rt.queues.get('triggers');
    await queue.upsertJobScheduler('cron-aut_gone-0', { pattern: '0 5 * * *' }, { name: 'cron', data: {} });
    await h.rt.engine.schedules.reconcile();
    const now = new Date();
    const p = await placed(h);
    expect(p.get(`${missing.id}-0`)).to.equal(nextCronFire('0 4 * * *', 'Europe/Berlin', now)!.getTime());
    expect(p.get(`${moved.id}-1`)).to.equal(nextCronFire('0 6 * * *', 'UTC', now)!.getTime());
    expect(p.has('aut_gone-0')).to.equal(false);
    const schedulerIds = (await queue.getJobSchedulers(0, -1)).map((s) => s.key);
    expect(schedulerIds).not.to.include('cron-aut_gone-0');
    expect(schedulerIds).to.include(CRON_TICK);
  });
});

describe('the cron ticker', function () {
  this.timeout(30_000);
  let h: Harness;
  before(async () => {
    h = await startHarness({ workers: false, env: { SERVICE_CRON_MIN_INTERVAL_SECONDS: '1' } });
  });
  after(async () => {
    await h.close();
  });

  it('places a trigger Redis lost at the fire it missed meanwhile (made once by the next tick), unless the automation changed since', async () => {
    const hourly = { type: 'cron', schedule: '0 * * * *', timezone: 'UTC' } as const;
    const twoHoursAgo = new Date(Date.now() - 2 * 3_600_000).toISOString();
    const lost = automationFixture('tenant-a', { triggers: [hourly], created_at: twoHoursAgo, updated_at: twoHoursAgo });
    const changed = automationFixture('tenant-a', { triggers: [hourly] });
    for (const a of [lost, changed]) await h.rt.store.automations.insert(a); // their members missing from the set, as after a loss
    await h.rt.engine.schedules.reconcile();
    const now = new Date();
    const lastHour = Math.floor(now.getTime() / 3_600_000) * 3_600_000;
    const p = await placed(h);
    expect(p.get(`${lost.id}-0`), 'the fire it missed').to.equal(lastHour);
    expect(p.get(`${changed.id}-0`), 'changed after that fire: from now on').to.equal(nextCronFire('0 * * * *', 'UTC', now)!.getTime());
    await h.rt.engine.schedules.tick();
    const jobs = (await h.rt.queues.get('triggers').getJobs(['waiting', 'delayed', 'active', 'completed'])).filter((j) => j.data?.automation_id === lost.id);
    expect(jobs.map((j) => j.id)).to.deep.equal([cronJobIdOf({ tenant_id: 'tenant-a', automation_id: lost.id, trigger_index: 0 }, lastHour)]);
    expect((await placed(h)).get(`${lost.id}-0`)).to.equal(nextCronFire('0 * * * *', 'UTC', new Date())!.getTime());
  });

  it('makes a fire missed while nothing ran once, then goes on from now; two ticks at once hand a fire over once', async () => {
    const a = (await h.call<Body>('POST', '/api/v1/automations', { body: cronAutomation('missed', '0 0 1 1 *') })).body;
    const key = cronDueKey(h.config.queuePrefix);
    const missedAt = Date.parse('2026-01-01T00:00:00Z'); // a time its schedule gives
    await h.rt.redis.zadd(key, missedAt, `${a.tenant_id}\t${a.id}\t0`); // as if every worker had been down since
    const [one, two] = await Promise.all([h.rt.engine.schedules.tick(), h.rt.engine.schedules.tick()]);
    expect(one + two, 'moved on once').to.equal(1);
    const queue = h.rt.queues.get('triggers');
    const jobs = (await queue.getJobs(['waiting', 'delayed'])).filter((j) => j.name === 'cron' && j.data.automation_id === a.id);
    expect(jobs.map((j) => j.id)).to.deep.equal([cronJobIdOf({ tenant_id: a.tenant_id, automation_id: a.id, trigger_index: 0 }, missedAt)]);
    expect(jobs[0]!.data).to.deep.include({ schedule: '0 0 1 1 *', timezone: 'UTC', fire_at: '2026-01-01T00:00:00.000Z' });
    expect((await placed(h)).get(`${a.id}-0`)).to.equal(nextCronFire('0 0 1 1 *', 'UTC', new Date())!.getTime());
    expect(await h.rt.engine.schedules.tick(), 'nothing more due').to.equal(0);
  });

  it('keeps a fire missed while nothing ran through a change that leaves the cron triggers as they were (a rename, an enable again)', async () => {
    const a = (await h.call<Body>('POST', '/api/v1/automations', { body: cronAutomation('missed-then-renamed', '0 0 1 1 *') })).body;
    const missedAt = Date.parse('2026-01-01T00:00:00Z');
    await h.rt.redis.zadd(cronDueKey(h.config.queuePrefix), missedAt, `${a.tenant_id}\t${a.id}\t0`); // every worker down since
    // the change hands the missed fire over (it is due), once, and the trigger goes on from now
    expect((await h.call('PATCH', `/api/v1/automations/${a.id}`, { body: { name: 'renamed' } })).status).to.equal(200);
    expect((await h.call('POST', `/api/v1/automations/${a.id}/enable`)).status).to.equal(200);
    expect(await h.rt.engine.schedules.tick()).to.equal(0);
    const jobs = (await h.rt.queues.get('triggers').getJobs(['waiting', 'delayed'])).filter((j) => j.name === 'cron' && j.data.automation_id === a.id);
    expect(jobs.map((j) => j.data.fire_at)).to.deep.equal(['2026-01-01T00:00:00.000Z']);
    expect((await placed(h)).get(`${a.id}-0`)).to.equal(nextCronFire('0 0 1 1 *', 'UTC', new Date())!.getTime());
    await h.call('DELETE', `/api/v1/automations/${a.id}`);
  });

  it('hands over a fire that the spring clock change moved (02:30 in Paris that night is 03:30 summer time)', async () => {
    const a = (await h.call<Body>('POST', '/api/v1/automations', { body: cronAutomation('dst', '30 2 * * *', 'Europe/Paris') })).body;
    const movedAt = Date.parse('2026-03-29T01:30:00Z'); // what the schedule gave for that night, placed the evening before
    await h.rt.redis.zadd(cronDueKey(h.config.queuePrefix), movedAt, `${a.tenant_id}\t${a.id}\t0`);
    expect(await h.rt.engine.schedules.tick()).to.equal(1);
    const jobs = (await h.rt.queues.get('triggers').getJobs(['waiting', 'delayed'])).filter((j) => j.name === 'cron' && j.data.automation_id === a.id);
    expect(jobs.map((j) => j.data.fire_at)).to.deep.equal(['2026-03-29T01:30:00.000Z']);
    await h.call('DELETE', `/api/v1/automations/${a.id}`);
  });

  it('moves a trigger on through a clock change at midnight or of 30 minutes in its zone: no day loses its fire, and none leaves the set', async () => {
    // each zone's fire before its change, that day's, and the next day's (Santiago and Havana skipped the day of
    // the change; Lord Howe's trigger left the set, cron-parser giving up at its change of 30 minutes)
    const cases = [
      ['0 0 * * *', 'America/Santiago', ['2026-09-05T04:00:00Z', '2026-09-06T04:00:00Z', '2026-09-07T03:00:00Z']],
      ['0 0 * * *', 'America/Havana', ['2026-10-31T04:00:00Z', '2026-11-01T04:00:00Z', '2026-11-02T05:00:00Z']],
      ['0 2 * * *', 'Australia/Lord_Howe', ['2026-04-03T15:00:00Z', '2026-04-04T15:30:00Z', '2026-04-05T15:30:00Z']],
    ] as const;
    const made = [];
    for (const [schedule, zone] of cases) made.push((await h.call<Body>('POST', '/api/v1/automations', { body: cronAutomation(zone, schedule, zone) })).body);
    const key = cronDueKey(h.config.queuePrefix);
    const realNow = h.rt.clock.now;
    let now = Date.now();
    h.rt.clock.now = () => new Date(now);
    try {
      for (const [i, [, zone, fires]] of cases.entries()) {
        const a = made[i]!;
        await h.rt.redis.zadd(key, Date.parse(fires[0]), `${a.tenant_id}\t${a.id}\t0`);
        for (let f = 0; f + 1 < fires.length; f++) {
          now = Date.parse(fires[f]!) - 500; // the tick just before the fire
          expect(await h.rt.engine.schedules.tick(), `${zone} ${fires[f]} handed over`).to.be.at.least(1);
          expect(new Date((await placed(h)).get(`${a.id}-0`) ?? 0).toISOString(), `${zone}: placed after ${fires[f]}`).to.equal(
            new Date(fires[f + 1]!).toISOString(),
          );
        }
        const jobs = (await h.rt.queues.get('triggers').getJobs(['waiting', 'delayed'])).filter((j) => j.name === 'cron' && j.data.automation_id === a.id);
        expect(jobs.map((j) => j.data.fire_at).sort(), zone).to.deep.equal(fires.slice(0, -1).map((t) => new Date(t).toISOString()));
      }
    } finally {
      h.rt.clock.now = realNow;
      for (const a of made) await h.call('DELETE', `/api/v1/automations/${a.id}`);
    }
  });

  it('hands a fire due within the next tick over as the automation is made; after a change, makes it only if the new schedule gives its time too', async () => {
    const a = (await h.call<Body>('POST', '/api/v1/automations', { body: cronAutomation('soon', '* * * * * *') })).body;
    const queue = h.rt.queues.get('triggers');
    const jobs = (await queue.getJobs(['waiting', 'delayed'])).filter((j) => j.data.automation_id === a.id);
    expect(jobs.length, 'the fires of the next two seconds').to.be.within(1, 3);
    expect(jobs.map((j) => j.opts.attempts)).to.deep.equal(jobs.map(() => 5));
    await h.call('DELETE', `/api/v1/automations/${a.id}`); // its fires every second would be in the next tests' ticks
    // a fire of the old schedule handed over before a change: the new schedule's fire at the same time has the
    // same job id, so it was not added again; made at an even second (the new schedule's), not at an odd one
    const b = (await h.call<Body>('POST', '/api/v1/automations', { body: cronAutomation('changed', '0 0 1 1 *') })).body;
    await h.call('PATCH', `/api/v1/automations/${b.id}`, { body: { triggers: [{ type: 'cron', schedule: '*/2 * * * * *', timezone: 'UTC' }] } });
    const member = { tenant_id: b.tenant_id, automation_id: b.id, trigger_index: 0 };
    const stale = (at: number): CronJob => ({ ...member, schedule: '* * * * * *', timezone: 'UTC', fire_at: new Date(at).toISOString() });
    const even = Math.floor(Date.now() / 2000) * 2000 - 10_000;
    expect(await h.rt.engine.fireCron(stale(even + 1000), cronJobIdOf(member, even + 1000), new Date(even + 1000))).to.equal(null);
    expect(h.logs.join('\n')).to.contain('its trigger changed since it was handed over');
    // a client's Idempotency-Key of the text the service's own key for this fire would have takes nothing from it
    const squatter = await h.call('POST', '/api/v1/autonomy/run', {
      body: { steps: [{ tool: 'message', args: { text: 'mine' } }] },
      headers: { 'idempotency-key': `cron:${cronJobIdOf(member, even)}` },
    });
    expect(squatter.status, squatter.text).to.equal(202);
    const made = await h.rt.engine.fireCron(stale(even), cronJobIdOf(member, even), new Date(even));
    expect(made?.trigger).to.deep.include({ type: 'cron', schedule: '*/2 * * * * *', fire_at: new Date(even).toISOString() });
    await h.call('DELETE', `/api/v1/automations/${b.id}`);
  });

  it('tries a fire again when what failed may pass: its job has tries of its own, and the reconcile takes up one whose tries were spent', async () => {
    const a = (await h.call<Body>('POST', '/api/v1/automations', { body: cronAutomation('flaky', '0 0 1 1 *') })).body;
    const member = { tenant_id: a.tenant_id, automation_id: a.id, trigger_index: 0 };
    const queue = h.rt.queues.get('triggers');
    const runs = h.rt.engine.runs;
    const createIdempotent = runs.createIdempotent;
    let refusal: Error | null = new ServiceUnavailableError('Redis did not answer', 2);
    const workers = await startWorkers(h.rt); // this suite's ticks are its own; the fires need a worker
    runs.createIdempotent = (async (...args: Parameters<typeof createIdempotent>) => {
      if (refusal && args[0] === a.tenant_id) throw refusal;
      return createIdempotent(...args);
    }) as typeof createIdempotent;
    try {
      const minute = Math.floor(Date.now() / 60_000) * 60_000;
      const fire = async (at: number, attempts: number) => {
        const job: CronJob = { ...member, schedule: '0 0 1 1 *', timezone: 'UTC', fire_at: new Date(at).toISOString() };
        const id = cronJobIdOf(member, at);
        await queue.add('cron', job, { jobId: id, attempts, removeOnFail: { count: 500 } });
        return eventually(async () => ((await queue.getJob(id))?.finishedOn ? id : null), 'the fire’s job to fail');
      };
      // its tries spent on a Redis that did not answer (one try here, for the test's time)
      const spent = await fire(minute - 60_000, 1);
      // refused for good on its first of five tries: not a fire to try again
      refusal = new ValidationError('no', [{ path: '/x', message: 'refused for good' }]);
      const refused = await fire(minute - 120_000, 5);
      refusal = null;
      await h.rt.engine.schedules.reconcile();
      const made = await eventually(async () => {
        const list = await history(h, a.id);
        return list.length ? list : null;
      }, 'the fire tried again');
      expect(made.map((r) => r.trigger.fire_at)).to.deep.equal([new Date(minute - 60_000).toISOString()]);
      // the run is in the history before the job's processor returns: its job completes a moment later
      await eventually(async () => ((await (await queue.getJob(spent))!.getState()) === 'completed' ? true : null), 'the fire’s job to complete');
      expect(await (await queue.getJob(refused))!.getState()).to.equal('failed');
    } finally {
      runs.createIdempotent = createIdempotent;
      await workers.close();
      await h.call('DELETE', `/api/v1/automations/${a.id}`);
    }
  });

  it('cancels before it starts the run of a fire whose automation was disabled or archived as it fired (the answer came first)', async () => {
    for (const change of ['disable', 'archive'] as const) {
      const a = (await h.call<Body>('POST', '/api/v1/automations', { body: cronAutomation(`racing ${change}`, '0 0 1 1 *') })).body;
      const member = { tenant_id: a.tenant_id, automation_id: a.id, trigger_index: 0 };
      const runs = h.rt.engine.runs;
      const createIdempotent = runs.createIdempotent;
      let inside!: () => void;
      const entered = new Promise<void>((r) => (inside = r));
      let release!: () => void;
      const held = new Promise<void>((r) => (release = r));
      runs.createIdempotent = (async (...args: Parameters<typeof createIdempotent>) => {
        inside();
        await held;
        return createIdempotent(...args);
      }) as typeof createIdempotent;
      try {
        const at = Math.floor(Date.now() / 60_000) * 60_000 - 60_000;
        const job: CronJob = { ...member, schedule: '0 0 1 1 *', timezone: 'UTC', fire_at: new Date(at).toISOString() };
        const firing = h.rt.engine.fireCron(job, cronJobIdOf(member, at), new Date(at));
        await entered;
        const answered =
          change === 'disable' ? await h.call('POST', `/api/v1/automations/${a.id}/disable`) : await h.call('DELETE', `/api/v1/automations/${a.id}`);
        expect(answered.status).to.be.oneOf([200, 204]);
        release();
        const run = await firing;
        expect(run?.status, change).to.equal('canceled');
      } finally {
        runs.createIdempotent = createIdempotent;
      }
    }
  });

  it('holds back no other fire when one cannot be handed over, and hands that one over at a later tick', async () => {
    const [a, b] = [
      (await h.call<Body>('POST', '/api/v1/automations', { body: cronAutomation('first', '0 0 1 1 *') })).body,
      (await h.call<Body>('POST', '/api/v1/automations', { body: cronAutomation('second', '0 0 1 1 *') })).body,
    ];
    const key = cronDueKey(h.config.queuePrefix);
    const missedAt = Date.parse('2026-01-01T00:00:00Z');
    for (const x of [a, b]) await h.rt.redis.zadd(key, missedAt, `${x.tenant_id}\t${x.id}\t0`);
    const queue = h.rt.queues.get('triggers');
    const add = queue.add.bind(queue);
    queue.add = (async (name: string, data: CronJob, ...rest: unknown[]) => {
      if (data.automation_id === a.id) throw new Error('Connection is closed.');
      return (add as (...args: unknown[]) => unknown)(name, data, ...rest);
    }) as typeof queue.add;
    try {
      expect(await h.rt.engine.schedules.tick()).to.equal(1);
    } finally {
      queue.add = add;
    }
    expect((await placed(h)).get(`${a.id}-0`), 'still due').to.equal(missedAt);
    expect((await placed(h)).get(`${b.id}-0`)).to.be.greaterThan(Date.now());
    expect(h.logs.join('\n')).to.contain('cron fire not handed over');
    expect(await h.rt.engine.schedules.tick()).to.equal(1);
    expect((await placed(h)).get(`${a.id}-0`)).to.be.greaterThan(Date.now());
  });

  it('places every trigger that has a next time, and says which one has none', async () => {
    const never = automationFixture('tenant-a', { triggers: [{ type: 'cron', schedule: '0 0 31 2 *', timezone: 'UTC' }] }); // 31 February
    const daily = automationFixture('tenant-a', { triggers: [{ type: 'cron', schedule: '0 3 * * *', timezone: 'Australia/Lord_Howe' }] });
    await h.rt.store.automations.insert(never);
    await h.rt.store.automations.insert(daily);
    await h.rt.engine.schedules.reconcile();
    const p = await placed(h);
    expect(p.has(`${never.id}-0`)).to.equal(false);
    expect(p.get(`${daily.id}-0`)).to.equal(nextCronFire('0 3 * * *', 'Australia/Lord_Howe', new Date())!.getTime());
    expect(h.logs.join('\n')).to.contain('cron trigger has no next time').and.contain(never.id);
  });

  it('bounds the work of rare and never-firing expressions: one request of 20 took 7 s of the process, now refused or taken at once', async () => {
    const zones = ['America/New_York', 'Europe/Paris', 'Asia/Tokyo', 'Australia/Sydney', 'America/Chicago'];
    const post = async (schedule: (i: number) => string) => {
      const triggers = Array.from({ length: 20 }, (_, i) => ({ type: 'cron', schedule: schedule(i), timezone: zones[i % zones.length] }));
      const started = performance.now();
      const res = await h.call<Body>('POST', '/api/v1/automations', { body: { name: 'rare', triggers, steps: [{ tool: 'message', args: { text: 'x' } }] } });
      return { res, ms: performance.now() - started };
    };
    // the fifth Monday (Tuesday, ...) of February: once in 28 years, stepped day by day through them
    const decades = await post((i) => `${i} 7 * 2 1#5`);
    expect(decades.res.status).to.equal(400);
    expect(decades.res.body.errors[0]).to.deep.include({ path: '/body/triggers/0/schedule', message: 'does not fire within the next 5 years' });
    expect(decades.ms, 'the request took').to.be.below(3000);
    const never = await post((i) => `${i} 7 31 4,6,9,11 *`); // the 31st of months of 30 days
    expect(never.res.status).to.equal(400);
    expect(never.res.body.errors[0].message).to.match(/never fires/);
    expect(never.ms).to.be.below(3000);
    const leap = await post((i) => `${i} 7 29 2 *`); // 29 February fires every four years: taken
    expect(leap.res.status).to.equal(201);
    expect(leap.ms).to.be.below(3000);
    const status = await h.call<Body>('GET', `/api/v1/automations/${leap.res.body.id}/status`);
    expect(new Date(status.body.next_fire_at).getUTCFullYear() % 4, 'a leap year').to.equal(0); // 7:00 on 29 February, somewhere
    await h.call('DELETE', `/api/v1/automations/${leap.res.body.id}`);
  });

  it('refuses H (a hashed value): cron-parser draws it again at every parse, so the schedule would move at every tick', async () => {
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
  });
});
