import { expect } from 'chai';
import { CronExpressionParser } from 'cron-parser';
import { isCronFire, isTimeZone, nextCronFire, validateTriggers } from '../../engine/automations/triggers.js';

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
    for (const schedule of schedules)
      for (const timezone of zones)
        for (const start of starts)
          for (const offset of [0, 1, 999, 1000, 3_600_000]) {
            const from = new Date(Date.parse(start) + offset);
            const fresh = CronExpressionParser.parse(schedule, { tz: timezone, currentDate: from }).next().getTime();
            expect(nextCronFire(schedule, timezone, from)?.getTime(), `${schedule} ${timezone} ${from.toISOString()}`).to.equal(fresh);
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

  it('looks for a next fire no further than 5 years ahead, in little time however rarely the expression fires', () => {
    const started = performance.now();
    const rare = Array.from({ length: 20 }, (_, i) => ({ type: 'cron' as const, schedule: `${i} 5 * 2 1#5`, timezone: 'Europe/Paris' }));
    const errors = validateTriggers(rare, '/t', { cronMinIntervalSeconds: 60 });
    expect(errors).to.have.length(20);
    expect(errors[0]!.message).to.equal('does not fire within the next 5 years');
    expect(performance.now() - started, 'ms for 20 (7,000 before)').to.be.below(2000);
    expect(nextCronFire('0 0 * 2 1#5', 'UTC', new Date('2026-01-01T00:00:00Z'))).to.equal(null); // 29 February 2044
    expect(nextCronFire('0 0 * 2 1#5', 'UTC', new Date('2040-01-01T00:00:00Z'))?.toISOString()).to.equal('2044-02-29T00:00:00.000Z');
    expect(nextCronFire('0 0 29 2 *', 'UTC', new Date('2026-01-01T00:00:00Z'))?.toISOString()).to.equal('2028-02-29T00:00:00.000Z');
  });
});
