import { expect } from 'chai';
import { CronExpressionParser } from 'cron-parser';
import { isCronFire, isTimeZone, lastCronFire, nextCronFire, validateTriggers } from '../../engine/automations/triggers.js';
import { cpuMs } from '../support/cpu.js';

describe('engine/triggers', () => {
  it('accepts 5-field and 6-field (seconds first) cron expressions', () => {
    expect(validateTriggers([{ type: 'cron', schedule: '0 9 * * MON-FRI', timezone: 'Europe/Paris' }])).to.deep.equal([]);
    expect(validateTriggers([{ type: 'cron', schedule: '*/10 * * * * *', timezone: 'UTC' }])).to.deep.equal([]);
  });

  it('says which part of a cron trigger is wrong', () => {
    const errors = validateTriggers([
      { type: 'manual' },
      { type: 'cron', schedule: '61 * * * *', timezone: 'Mars/Olympus' },
      { type: 'cron', schedule: '* * *', timezone: 'UTC' },
    ]);
    expect(errors.map((e) => e.path)).to.deep.equal(['/body/triggers/1/schedule', '/body/triggers/1/timezone', '/body/triggers/2/schedule']);
    expect(errors[0]!.message).to.match(/0-59/);
    expect(errors[1]!.message).to.contain('Mars/Olympus');
    expect(errors[2]!.message).to.match(/5 fields/);
  });

  it('keeps file_change globs inside the workspace', () => {
    const errors = validateTriggers([{ type: 'file_change', paths: ['src/**/*.ts', '/etc/passwd', '../outside/*', '{..,a}/x', '{src,/etc}/*', '{a,b}/*.ts'] }]);
    expect(errors.map((e) => e.path)).to.deep.equal([
      '/body/triggers/0/paths/1',
      '/body/triggers/0/paths/2',
      '/body/triggers/0/paths/3',
      '/body/triggers/0/paths/4',
    ]);
    // a brace's alternatives are globs of their own: `{..,a}/x` is `../x` too
    expect(errors[2]!.message).to.match(/climb out/);
    expect(errors[3]!.message).to.match(/relative/);
  });

  it('knows IANA zones and computes the next fire in that zone', () => {
    expect(isTimeZone('America/New_York')).to.equal(true);
    expect(isTimeZone('Nowhere/Special')).to.equal(false);
    const next = nextCronFire('0 9 * * *', 'Europe/Paris', new Date('2026-01-15T12:00:00Z'));
    expect(next?.toISOString()).to.equal('2026-01-16T08:00:00.000Z');
  });

  it('answers what a fresh parse answers, from any millisecond, across the clock changes of zones, every call', () => {
    const schedules = ['* * * * * *', '*/7 * * * * *', '30 2 * * *', '0 9 * * MON-FRI', '15 */3 * * *', '0 0 L * *'];
    const zones = ['UTC', 'Europe/Paris', 'America/New_York', 'Australia/Lord_Howe'];
    // around the 2026 spring and autumn changes of Paris and New York, and inside one second
    const starts = ['2026-03-08T06:59:59.000Z', '2026-03-29T00:59:58.250Z', '2026-10-25T00:30:00.999Z', '2026-11-01T05:59:59.500Z'];
    // where cron-parser is wrong: asked from the start of the hour New York's spring change skips, it passes over
    // that night's 02:30, which fires at 03:30 summer time
    const parserWrong = new Map([['30 2 * * * America/New_York 2026-03-08T07:00:00.000Z', Date.parse('2026-03-08T07:30:00Z')]]);
    for (const schedule of schedules)
      for (const timezone of zones)
        for (const start of starts)
          for (const offset of [0, 1, 999, 1000, 3_600_000]) {
            const from = new Date(Date.parse(start) + offset);
            const what = `${schedule} ${timezone} ${from.toISOString()}`;
            const fresh = parserWrong.get(what) ?? CronExpressionParser.parse(schedule, { tz: timezone, currentDate: from }).next().getTime();
            expect(nextCronFire(schedule, timezone, from)?.getTime(), what).to.equal(fresh);
            expect(nextCronFire(schedule, timezone, from)?.getTime()).to.equal(fresh); // remembered
          }
    expect(nextCronFire('0 0 31 2 *', 'UTC', new Date())).to.equal(null); // never fires
  });

  it('knows a fire the spring clock change moved as a time its schedule gives, and no other time', () => {
    // 02:30 does not exist in Paris on 2027-03-28: the schedule fires at 03:30 summer time (01:30Z), which
    // cron-parser gives from the evening before, but not from the millisecond before, already in summer time
    const moved = Date.parse('2027-03-28T01:30:00Z');
    expect(nextCronFire('30 2 * * *', 'Europe/Paris', new Date('2027-03-27T22:00:00Z'))?.getTime()).to.equal(moved);
    expect(isCronFire('30 2 * * *', 'Europe/Paris', moved)).to.equal(true);
    expect(isCronFire('30 2 * * *', 'Europe/Paris', Date.parse('2027-03-29T00:30:00Z'))).to.equal(true);
    expect(isCronFire('30 2 * * *', 'Europe/Paris', moved + 60_000)).to.equal(false);
    expect(isCronFire('30 2 * * *', 'Europe/Paris', Date.parse('2027-03-28T00:30:00Z'))).to.equal(false);
    for (const [schedule, at] of [
      ['*/7 * * * * *', '2026-11-28T10:00:07Z'],
      ['0 9 * * MON-FRI', '2026-11-27T09:00:00Z'],
      ['0 0 L * *', '2026-11-30T00:00:00Z'],
    ] as const) {
      expect(isCronFire(schedule, 'UTC', Date.parse(at)), schedule).to.equal(true);
      expect(isCronFire(schedule, 'UTC', Date.parse(at) + 1000), `${schedule} + 1 s`).to.equal(false);
    }
  });

  it('fires a time of day the autumn clock change gives twice once, at its first pass, whenever it is asked (a schedule of set hours)', () => {
    // 02:30 happens twice in Paris on 2026-10-25: 00:30Z (summer time), then 01:30Z (winter time)
    const first = Date.parse('2026-10-25T00:30:00Z');
    const tomorrow = Date.parse('2026-10-26T01:30:00Z');
    for (const from of ['2026-10-24T23:00:00Z', '2026-10-25T00:29:59.999Z'])
      expect(nextCronFire('30 2 * * *', 'Europe/Paris', new Date(from))?.getTime(), from).to.equal(first);
    // from after the first pass, and from inside the repeated hour (what the reconcile asked: it gave 01:30Z)
    for (const from of ['2026-10-25T00:30:00.001Z', '2026-10-25T01:00:00Z', '2026-10-25T01:29:59.999Z'])
      expect(nextCronFire('30 2 * * *', 'Europe/Paris', new Date(from))?.getTime(), from).to.equal(tomorrow);
    expect(isCronFire('30 2 * * *', 'Europe/Paris', first)).to.equal(true);
    expect(isCronFire('30 2 * * *', 'Europe/Paris', Date.parse('2026-10-25T01:30:00Z'))).to.equal(false);
    // every quarter of the hours 1 to 3: the repeated hour's quarters are not made again
    expect(nextCronFire('*/15 1-3 * * *', 'Europe/Paris', new Date('2026-10-25T00:50:00Z'))?.toISOString()).to.equal('2026-10-25T02:00:00.000Z');
    // a schedule of every hour goes on through the repeated hour, as before
    expect(nextCronFire('*/30 * * * *', 'Europe/Paris', new Date('2026-10-25T00:45:00Z'))?.toISOString()).to.equal('2026-10-25T01:00:00.000Z');
    expect(nextCronFire('0 * * * *', 'Europe/Paris', new Date('2026-10-25T01:15:00Z'))?.toISOString()).to.equal('2026-10-25T02:00:00.000Z');
    // New York's 01:30 on 2026-11-01: 05:30Z, then 06:30Z
    expect(nextCronFire('30 1 * * *', 'America/New_York', new Date('2026-11-01T06:00:00Z'))?.toISOString()).to.equal('2026-11-02T06:30:00.000Z');
  });

  /** The fires of a schedule one after another from `from`, as the ticker moves a trigger on, in UTC and on the zone's clock. */
  function firesFrom(schedule: string, timezone: string, from: string, n: number): string[] {
    const clock = new Intl.DateTimeFormat('en-GB', { timeZone: timezone, dateStyle: 'short', timeStyle: 'long' });
    const out: string[] = [];
    for (let at: Date | null = new Date(from); out.length < n;) {
      at = nextCronFire(schedule, timezone, at);
      out.push(at ? `${at.toISOString()} ${clock.format(at)}` : 'none');
      if (!at) break;
    }
    return out;
  }
  /** Asked from every `stepMinutes` between `from` and its n-th fire, the next fire is the first of them after that time. */
  function expectConsistent(schedule: string, timezone: string, from: string, n: number, stepMinutes: number): void {
    const fires: number[] = [];
    for (let at: Date | null = new Date(from); fires.length < n && at;) if ((at = nextCronFire(schedule, timezone, at))) fires.push(at.getTime());
    for (let t = Date.parse(from); t < fires.at(-1)!; t += stepMinutes * 60_000) {
      const next = nextCronFire(schedule, timezone, new Date(t))?.getTime();
      expect(next, `${schedule} ${timezone} from ${new Date(t).toISOString()}`).to.equal(fires.find((f) => f > t));
    }
  }

  it('fires once on a day whose midnight the spring clock change skips, at the first time after the gap (Santiago, Beirut; Paris 02:30 the control)', () => {
    expect(firesFrom('30 2 * * *', 'Europe/Paris', '2026-03-27T12:00:00Z', 3)).to.deep.equal([
      '2026-03-28T01:30:00.000Z 28/03/2026, 02:30:00 CET',
      '2026-03-29T01:30:00.000Z 29/03/2026, 03:30:00 CEST',
      '2026-03-30T00:30:00.000Z 30/03/2026, 02:30:00 CEST',
    ]);
    // Santiago's clocks go from 00:00 to 01:00 on 6 September 2026: that day's fire was lost (5 Sep, then 7 Sep)
    expect(firesFrom('0 0 * * *', 'America/Santiago', '2026-09-04T12:00:00Z', 3)).to.deep.equal([
      '2026-09-05T04:00:00.000Z 05/09/2026, 00:00:00 GMT-4',
      '2026-09-06T04:00:00.000Z 06/09/2026, 01:00:00 GMT-3',
      '2026-09-07T03:00:00.000Z 07/09/2026, 00:00:00 GMT-3',
    ]);
    expect(firesFrom('0 0 * * *', 'Asia/Beirut', '2026-03-27T12:00:00Z', 3)).to.deep.equal([
      '2026-03-27T22:00:00.000Z 28/03/2026, 00:00:00 EET',
      '2026-03-28T22:00:00.000Z 29/03/2026, 01:00:00 EEST',
      '2026-03-29T21:00:00.000Z 30/03/2026, 00:00:00 EEST',
    ]);
    for (const [schedule, zone, from] of [
      ['30 2 * * *', 'Europe/Paris', '2026-03-27T12:00:00Z'],
      ['0 0 * * *', 'America/Santiago', '2026-09-04T12:00:00Z'],
      ['0 0 * * *', 'Asia/Beirut', '2026-03-27T12:00:00Z'],
      ['*/30 * * * *', 'America/Santiago', '2026-09-05T22:00:00Z'],
    ] as const)
      expectConsistent(schedule, zone, from, 3, 7);
  });

  it('fires once on a day whose midnight the autumn clock change shows twice, at its first pass (Havana)', () => {
    // Havana's clocks go from 01:00 back to 00:00 on 1 November 2026: that day had no fire (31 Oct, then 2 Nov)
    expect(firesFrom('0 0 * * *', 'America/Havana', '2026-10-30T12:00:00Z', 3)).to.deep.equal([
      '2026-10-31T04:00:00.000Z 31/10/2026, 00:00:00 GMT-4',
      '2026-11-01T04:00:00.000Z 01/11/2026, 00:00:00 GMT-4',
      '2026-11-02T05:00:00.000Z 02/11/2026, 00:00:00 GMT-5',
    ]);
    expectConsistent('0 0 * * *', 'America/Havana', '2026-10-30T12:00:00Z', 3, 7);
  });

  it('goes on through a clock change of 30 minutes, where cron-parser gave up and the trigger left the schedule (Lord Howe)', () => {
    // Lord Howe's clocks go from 02:00 back to 01:30 on 5 April 2026: 02:00 is then shown once, at 15:30Z
    expect(firesFrom('0 2 * * *', 'Australia/Lord_Howe', '2026-04-03T15:00:00Z', 2)).to.deep.equal([
      '2026-04-04T15:30:00.000Z 05/04/2026, 02:00:00 GMT+10:30',
      '2026-04-05T15:30:00.000Z 06/04/2026, 02:00:00 GMT+10:30',
    ]);
    // and forward on 4 October 2026, 02:00 to 02:30: 02:00 fires at 02:30
    expect(firesFrom('0 2 * * *', 'Australia/Lord_Howe', '2026-10-02T15:30:00Z', 2)).to.deep.equal([
      '2026-10-03T15:30:00.000Z 04/10/2026, 02:30:00 GMT+11',
      '2026-10-04T15:00:00.000Z 05/10/2026, 02:00:00 GMT+11',
    ]);
    expectConsistent('0 2 * * *', 'Australia/Lord_Howe', '2026-04-03T12:00:00Z', 3, 7);
    expectConsistent('20,40 * * * *', 'Australia/Lord_Howe', '2026-10-03T14:00:00Z', 8, 3);
  });

  it('never answers a time at or before the one it is asked from, inside a clock change (Chatham, every hour through the repeated one)', () => {
    // Chatham's clocks go from 03:45 back to 02:45 at 14:00Z on 4 April 2026: a schedule of every hour fires through both passes
    for (let t = Date.parse('2026-04-04T13:00:00Z'); t <= Date.parse('2026-04-04T13:14:00Z'); t += 60_000)
      expect(nextCronFire('15,45 * * * *', 'Pacific/Chatham', new Date(t))?.toISOString(), new Date(t).toISOString()).to.equal('2026-04-04T13:30:00.000Z');
    expect(firesFrom('15,45 * * * *', 'Pacific/Chatham', '2026-04-04T12:50:00Z', 5)).to.deep.equal([
      '2026-04-04T13:00:00.000Z 05/04/2026, 02:45:00 GMT+13:45',
      '2026-04-04T13:30:00.000Z 05/04/2026, 03:15:00 GMT+13:45',
      '2026-04-04T14:00:00.000Z 05/04/2026, 02:45:00 GMT+12:45',
      '2026-04-04T14:30:00.000Z 05/04/2026, 03:15:00 GMT+12:45',
      '2026-04-04T15:00:00.000Z 05/04/2026, 03:45:00 GMT+12:45',
    ]);
    expectConsistent('15,45 * * * *', 'Pacific/Chatham', '2026-04-04T11:00:00Z', 10, 1);
    expectConsistent('15,45 3 * * *', 'Pacific/Chatham', '2026-04-03T11:00:00Z', 3, 5);
  });

  it('takes the shortest gap from the clock fields, the same at any hour it is asked (11 fires from now saw it only at some)', () => {
    // 2 h apart but for 22:00 -> 23:00, and 23:00 -> 00:00 the next day
    const late = validateTriggers([{ type: 'cron', schedule: '0 0,2,4,6,8,10,12,14,16,18,20,22,23 * * *', timezone: 'UTC' }], '/t', {
      cronMinIntervalSeconds: 7200,
    });
    expect(late.map((e) => e.message)).to.deep.equal(['fires every 3600 s; the shortest interval allowed is 7200 s (SERVICE_CRON_MIN_INTERVAL_SECONDS)']);
    const midnight = validateTriggers([{ type: 'cron', schedule: '30 0,23 * * *', timezone: 'UTC' }], '/t', { cronMinIntervalSeconds: 7200 });
    expect(midnight[0]?.message).to.match(/fires every 3600 s/);
    expect(validateTriggers([{ type: 'cron', schedule: '0 0,12 * * *', timezone: 'Europe/Paris' }], '/t', { cronMinIntervalSeconds: 7200 })).to.deep.equal([]);
    expect(validateTriggers([{ type: 'cron', schedule: '0 9 * * MON', timezone: 'UTC' }], '/t', { cronMinIntervalSeconds: 86_400 })).to.deep.equal([]);
  });

  it('holds an automation’s cron triggers together to the shortest interval: on the days both fire, across midnight, and across zones', () => {
    const cron = (schedule: string, timezone = 'UTC') => ({ type: 'cron' as const, schedule, timezone });
    const check = (triggers: ReturnType<typeof cron>[], limit: number) =>
      validateTriggers(triggers, '/t', { cronMinIntervalSeconds: limit }).map((e) => `${e.path} ${e.message.split(';')[0]}`);
    // five triggers of every 10 s, 2 s apart: every 2 s in all
    expect(
      check(
        [0, 2, 4, 6, 8].map((s) => cron(`${s}/10 * * * * *`)),
        10,
      ),
    ).to.deep.equal(['/t/1/schedule fires 2 s from a fire of trigger 0']);
    expect(
      check(
        [0, 5].map((s) => cron(`${s}/10 * * * * *`)),
        5,
      ),
    ).to.deep.equal([]);
    // the same schedule twice: two fires at once
    expect(check([cron('0 9 * * *'), cron('0 12 * * *'), cron('0 9 * * *')], 60)).to.deep.equal(['/t/2/schedule fires 0 s from a fire of trigger 0']);
    // 09:00 on Mondays and on Tuesdays never fire together; on Mondays and on the 1st of the month they do, some day
    expect(check([cron('0 9 * * MON'), cron('0 9 * * TUE')], 60)).to.deep.equal([]);
    expect(check([cron('0 9 * * MON'), cron('0 9 1 * *')], 60)).to.deep.equal(['/t/1/schedule fires 0 s from a fire of trigger 0']);
    // a day's last fire and the next day's first: Monday 23:59:30 and Tuesday 00:00:10, not Wednesday's
    expect(check([cron('30 59 23 * * MON'), cron('10 0 0 * * TUE')], 60)).to.deep.equal(['/t/1/schedule fires 40 s from a fire of trigger 0']);
    expect(check([cron('30 59 23 * * MON'), cron('10 0 0 * * WED')], 60)).to.deep.equal([]);
    expect(check([cron('10 0 0 * * TUE'), cron('30 59 23 * * MON')], 60)).to.deep.equal(['/t/1/schedule fires 40 s from a fire of trigger 0']);
    // zones: every hour in UTC and at half past in India (UTC+05:30) are the same instants; on the hour there, 30 min apart
    expect(check([cron('0 * * * *'), cron('30 * * * *', 'Asia/Kolkata')], 60)).to.deep.equal(['/t/1/schedule fires 0 s from a fire of trigger 0']);
    expect(check([cron('0 * * * *'), cron('0 * * * *', 'Asia/Kolkata')], 60)).to.deep.equal([]);
    // Paris is UTC+1 or UTC+2: 10:00 there is 09:00 UTC half the year
    expect(check([cron('0 9 * * *'), cron('0 10 * * *', 'Europe/Paris')], 60)).to.deep.equal(['/t/1/schedule fires 0 s from a fire of trigger 0']);
    expect(check([cron('0 9 * * *'), cron('30 10 * * *', 'Europe/Paris')], 60)).to.deep.equal([]);
    // a date on a weekday, and 29 February, come together only some years: within the calendar's 28
    expect(check([cron('0 9 13 3 *'), cron('0 9 * * 5')], 60)).to.deep.equal(['/t/1/schedule fires 0 s from a fire of trigger 0']);
    expect(check([cron('0 0 9 29 2 *'), cron('5 0 9 * * *')], 10)).to.deep.equal(['/t/1/schedule fires 5 s from a fire of trigger 0']);
    // the night Paris's clocks go forward, 02:00 is made at 03:00: one instant with a trigger of 03:00
    expect(check([cron('0 2 * * *', 'Europe/Paris'), cron('0 3 * * *', 'Europe/Paris')], 60)).to.deep.equal([
      '/t/1/schedule fires 0 s from a fire of trigger 0',
    ]);
    expect(check([cron('30 2 * * *', 'Europe/Paris'), cron('0 3 * * *', 'Europe/Paris')], 60)).to.deep.equal([]);
    expect(check([cron('0 2 * * *', 'UTC'), cron('0 3 * * *', 'UTC')], 60)).to.deep.equal([]);
    // twenty at one time of day on different dates: never together, found without stepping through fires
    const dates = Array.from({ length: 20 }, (_, d) => cron(`0 9 ${d + 1} 1 *`, 'Europe/Paris'));
    const apart = cpuMs(() => check(dates, 60));
    expect(apart.value).to.deep.equal([]);
    expect(apart.ms).to.be.below(500);
    // twenty triggers of every minute, as dense as the limit allows: answered in little time
    const dense = Array.from({ length: 20 }, (_, i) => cron(`${i * 3} * * * * *`, i % 2 ? 'UTC' : 'Europe/Paris'));
    const together = cpuMs(() => [check(dense, 60), check(dense.slice(0, 1), 60)]);
    expect(together.value[0]).to.have.length(1);
    expect(together.value[1]).to.deep.equal([]);
    expect(together.ms).to.be.below(500);
  });

  it('looks for a next fire no further than 5 years ahead, in little time however rarely the expression fires', () => {
    const rare = Array.from({ length: 20 }, (_, i) => ({ type: 'cron' as const, schedule: `${i} 5 * 2 1#5`, timezone: 'Europe/Paris' }));
    const { value: errors, ms } = cpuMs(() => validateTriggers(rare, '/t', { cronMinIntervalSeconds: 60 }));
    expect(errors).to.have.length(20);
    expect(errors[0]!.message).to.equal('does not fire within the next 5 years');
    expect(ms, 'ms for 20 (7,000 before)').to.be.below(2000);
    expect(nextCronFire('0 0 * 2 1#5', 'UTC', new Date('2026-01-01T00:00:00Z'))).to.equal(null); // 29 February 2044
    expect(nextCronFire('0 0 * 2 1#5', 'UTC', new Date('2040-01-01T00:00:00Z'))?.toISOString()).to.equal('2044-02-29T00:00:00.000Z');
    expect(nextCronFire('0 0 29 2 *', 'UTC', new Date('2026-01-01T00:00:00Z'))?.toISOString()).to.equal('2028-02-29T00:00:00.000Z');
  });

  it('finds the last fire before a time by the same clock-change rules as the next (a missed fire recovered after Redis lost the schedule)', () => {
    const HOURS_12 = 12 * 3600_000;
    const last = (schedule: string, zone: string, at: string) => {
      const t = Date.parse(at);
      const { value, ms } = cpuMs(() => lastCronFire(schedule, zone, new Date(t), t - HOURS_12));
      const found = value?.toISOString() ?? null;
      // cron-parser's own prev stepped for up to 3.6 s on some change days, then gave nothing
      expect(ms, `${schedule} ${zone} ${at}`).to.be.below(200);
      return found;
    };
    // the spring change's moved fire (02:30 at 03:30 summer time), not the day before's
    expect(last('30 2 * * *', 'Europe/Paris', '2026-03-29T01:35:00Z')).to.equal('2026-03-29T01:30:00.000Z');
    // a midnight the spring change skips fires at 01:00
    expect(last('0 0 * * *', 'America/Santiago', '2026-09-06T05:00:00Z')).to.equal('2026-09-06T04:00:00.000Z');
    // the autumn's first pass of a midnight shown twice, not its second
    expect(last('0 0 * * *', 'America/Havana', '2026-11-01T05:00:00Z')).to.equal('2026-11-01T04:00:00.000Z');
    // changes of 30 minutes
    expect(last('15,45 * * * *', 'Australia/Lord_Howe', '2026-04-04T15:00:00Z')).to.equal('2026-04-04T14:45:00.000Z');
    expect(last('*/30 * * * *', 'Pacific/Chatham', '2026-04-04T14:00:00Z')).to.equal('2026-04-04T13:45:00.000Z');
    for (const [schedule, zone, at] of [
      ['30 2 * * *', 'Pacific/Chatham', '2026-09-26T20:00:00Z'],
      ['0 0 * * *', 'Africa/Cairo', '2026-04-24T06:00:00Z'],
    ]) {
      const found = last(schedule!, zone!, at!);
      expect(found, `${schedule} ${zone}`).to.be.a('string');
      expect(isCronFire(schedule!, zone, Date.parse(found!))).to.equal(true);
      expect(nextCronFire(schedule!, zone, new Date(found!))!.getTime()).to.be.above(Date.parse(at!));
    }
    // none at or after `since`; a fire exactly at `at` is the last
    expect(lastCronFire('0 3 * * *', 'UTC', new Date('2026-05-01T02:00:00Z'), Date.parse('2026-04-30T04:00:00Z'))).to.equal(null);
    expect(lastCronFire('0 3 * * *', 'UTC', new Date('2026-05-01T03:00:00Z'), 0)!.toISOString()).to.equal('2026-05-01T03:00:00.000Z');
    // a schedule of every minute: the minute itself
    expect(last('* * * * *', 'Europe/Paris', '2026-06-01T10:00:30Z')).to.equal('2026-06-01T10:00:00.000Z');
  });
});
