import { expect } from 'chai';
import { CronExpressionParser } from 'cron-parser';
import { isTimeZone, nextCronFire, validateTriggers } from '../../engine/automations/triggers.js';

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
    const errors = validateTriggers([{ type: 'file_change', paths: ['src/**/*.ts', '/etc/passwd', '../outside/*'] }]);
    expect(errors.map((e) => e.path)).to.deep.equal(['/body/triggers/0/paths/1', '/body/triggers/0/paths/2']);
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
});
