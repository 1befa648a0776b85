// Trigger rules the schema cannot express: a cron expression that parses, a real IANA time zone,
// file globs that stay inside the workspace. Triggers are validated here and fire in the run engine.
import path from 'node:path';
import { CronExpressionParser } from 'cron-parser';
import type { FieldError, Trigger } from '../platform/index.js';
import { IGNORED_FOLDERS } from './file-triggers.js';
import { expandBraces, globSyntaxError, literalSegmentsOf } from './globs.js';

/** Remembers what a pure, costly check answered (zone and cron parsing cost ~0.1-1 ms each); bounded. */
function memo<T>(compute: (key: string) => T, max = 2000): (key: string) => T {
  const seen = new Map<string, T>();
  return (key) => {
    if (seen.has(key)) return seen.get(key)!;
    const value = compute(key);
    if (seen.size >= max) seen.delete(seen.keys().next().value!);
    seen.set(key, value);
    return value;
  };
}

export const isTimeZone = memo((zone: string): boolean => {
  try {
    new Intl.DateTimeFormat('en-US', { timeZone: zone });
    return true;
  } catch {
    return false;
  }
});

/**
 * How far ahead a cron trigger's next fire is looked for: cron-parser finds it by stepping from day to day
 * (20-60 µs a step in a zone), so an expression that fires once in decades (`0 0 * 2 1#5`, the fifth Monday of
 * February) or never (`* * 31 4,6,9,11 *`) cost up to 10,000 steps, and one request of 20 such triggers held the
 * process for 7 s. A trigger is refused when it does not fire within this horizon (29 February, every four
 * years, does); one placed before is placed by a later reconcile once its time is within it.
 */
export const CRON_HORIZON_YEARS = 5;
const HORIZON_MS = CRON_HORIZON_YEARS * 366 * 86_400_000;
/** How long "no fire within the horizon" is taken as still true. */
const NONE_KEPT_MS = 3_600_000;

/**
 * The last next fire computed for each expression and zone, and the time it was computed from (and the
 * zone's UTC offset then): it is the answer for every time from then until it (no fire lies between), so the
 * status route, the ticker and the reconcile of many triggers step through no days again. Not across a clock
 * change: cron-parser, stepping from within a skipped hour, passes over the fire it gives from before it.
 * Bounded; the oldest entry is dropped first.
 */
const nextFires = new Map<string, { from: number; offset: string; next: number | null }>();

const offsetFormat = memo((zone: string) => new Intl.DateTimeFormat('en-US', { timeZone: zone || 'UTC', timeZoneName: 'longOffset' }));
/** Zones that are UTC under another name: their offset never changes, so it is not formatted (a few µs a call). */
const UTC_ZONES = new Set(['', 'UTC', 'Etc/UTC', 'GMT', 'Etc/GMT', 'Universal', 'Etc/Universal', 'Zulu', 'Etc/Zulu']);

function offsetAt(zone: string | undefined, at: number): string {
  if (UTC_ZONES.has(zone ?? '')) return 'GMT+00:00';
  return offsetFormat(zone ?? '')
    .formatToParts(at)
    .find((p) => p.type === 'timeZoneName')!.value;
}

/**
 * The next time a cron trigger fires after `from`, or null when it does not fire within CRON_HORIZON_YEARS
 * (or never does).
 */
export function nextCronFire(schedule: string, timezone: string | undefined, from: Date): Date | null {
  const key = `${schedule}\n${timezone ?? ''}`;
  const at = from.getTime();
  const known = nextFires.get(key);
  let offset: string;
  try {
    offset = offsetAt(timezone, at);
  } catch {
    return null; // not a time zone
  }
  if (known && at >= known.from && known.offset === offset && (known.next === null ? at < known.from + NONE_KEPT_MS : at < known.next)) {
    return known.next === null ? null : new Date(known.next);
  }
  let next: number | null;
  try {
    next = CronExpressionParser.parse(schedule, { tz: timezone || undefined, currentDate: from, endDate: new Date(at + HORIZON_MS) })
      .next()
      .getTime();
  } catch {
    next = null; // past the horizon, never (cron-parser's loop limit), or not an expression
  }
  // a time of day the autumn's clock change gives twice is a fire once, at its first pass, for a schedule of
  // set hours (as cron does): cron-parser gave the second pass too when asked from inside it (the periodic
  // reconcile, an automation changed then), and `30 2 * * *` in Europe/Paris fired twice that night
  for (let skipped = 0; next !== null && skipped < FIRE_CHECK_STEPS && hasSetHours(schedule) && repeatsEarlierTime(timezone, next); skipped++) {
    try {
      next = CronExpressionParser.parse(schedule, { tz: timezone || undefined, currentDate: new Date(next), endDate: new Date(at + HORIZON_MS) })
        .next()
        .getTime();
    } catch {
      next = null;
    }
  }
  nextFires.delete(key);
  if (nextFires.size >= 10_000) nextFires.delete(nextFires.keys().next().value!);
  nextFires.set(key, { from: at, offset, next });
  return next === null ? null : new Date(next);
}

/** The last time a cron trigger fired at or before `at`, or null when it did not (or it is not an expression). */
export function prevCronFire(schedule: string, timezone: string | undefined, at: Date): Date | null {
  try {
    return new Date(
      CronExpressionParser.parse(schedule, { tz: timezone || undefined, currentDate: new Date(at.getTime() + 1) })
        .prev()
        .getTime(),
    );
  } catch {
    return null;
  }
}

/** The minutes of an offset as `offsetAt` writes it (GMT+05:30, GMT-03:00, GMT). */
function offsetMinutes(offset: string): number {
  const m = /([+-])(\d\d):(\d\d)/.exec(offset);
  return m ? (m[1] === '-' ? -1 : 1) * (Number(m[2]) * 60 + Number(m[3])) : 0;
}

/** True when the zone's clocks went back in the hours before `at` and showed its time of day once already, before the change. */
function repeatsEarlierTime(zone: string | undefined, at: number): boolean {
  if (UTC_ZONES.has(zone ?? '')) return false;
  const now = offsetMinutes(offsetAt(zone, at));
  const before = offsetMinutes(offsetAt(zone, at - FIRE_CHECK_BACK_MS));
  return before > now && offsetMinutes(offsetAt(zone, at - (before - now) * 60_000)) === before;
}

/** A schedule that names its hours (not every hour): its fire in the repeated hour of an autumn night is made once. */
const hasSetHours = (schedule: string) => {
  try {
    return fieldsOf(schedule).hour.values.length < 24;
  } catch {
    return false;
  }
};

/** How far before a time `isCronFire` starts walking the schedule: more than any zone's clock change (2 h). */
const FIRE_CHECK_BACK_MS = 3 * 3600_000;
/** The fires it walks at most from there (a schedule firing every second has 10,800 in 3 h: it is answered by the first check). */
const FIRE_CHECK_STEPS = 200;

/**
 * True when `at` is a time the schedule gives. Asked from the millisecond before, cron-parser can miss a
 * fire the clock change of a spring night moved (`30 2 * * *` in Europe/Paris gives 01:30Z that day, from
 * the evening before; from 01:29:59.999Z, already in summer time, it gives the next day's): the schedule is
 * then walked from a few hours before.
 */
export function isCronFire(schedule: string, timezone: string | undefined, at: number): boolean {
  if (nextCronFire(schedule, timezone, new Date(at - 1))?.getTime() === at) return true;
  let next = nextCronFire(schedule, timezone, new Date(at - FIRE_CHECK_BACK_MS))?.getTime();
  for (let i = 0; next !== undefined && next < at && i < FIRE_CHECK_STEPS; i++) next = nextCronFire(schedule, timezone, new Date(next))?.getTime();
  return next === at;
}

const MAX_DAYS = [31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];

/** A schedule's fields, parsed once for its check and its shortest gap (throws for what is not an expression). */
const fieldsOf = memo((schedule: string) => CronExpressionParser.parse(schedule, { tz: 'UTC' }).fields, 500);

const cronError = memo((schedule: string): string | null => {
  const fields = schedule.trim().split(/\s+/);
  if (!schedule.trim().startsWith('@') && (fields.length < 5 || fields.length > 6)) {
    return `expected 5 fields (minute hour day month weekday) or 6 with seconds first, got ${fields.length}`;
  }
  // cron-parser draws an H ("some value") again at every parse, and BullMQ parses at every tick: the
  // schedule would move each time, firing at random times and a random number of times
  // an H on its own, wherever it stands (H, H(0-5), */H, 0-H): not the H of a day's name (THU)
  if (fields.some((f) => /(^|[^a-z])h($|[^a-z])/i.test(f))) return 'H (a hashed value) is not supported: name the minute, hour, ... to fire at';
  let parsed;
  try {
    parsed = fieldsOf(schedule);
  } catch (err) {
    return `not a valid cron expression: ${(err as Error).message}`;
  }
  // a day of the month that no month named has (31 April) is known without stepping through the years
  const days = (parsed.dayOfMonth.values as readonly (number | string)[]).filter((d): d is number => typeof d === 'number');
  if (!parsed.dayOfMonth.isWildcard && !parsed.dayOfMonth.hasLastChar && parsed.dayOfWeek.isWildcard && days.length) {
    const first = Math.min(...days);
    if ((parsed.month.values as readonly number[]).every((m) => first > MAX_DAYS[m - 1]!)) return 'never fires: no month it names has that day';
  }
  return null;
});

/**
 * The shortest time between two fires of a cron expression on the clock, from its seconds, minutes and hours
 * (no stepping through dates: an expression's days only space its fires further apart), the step from a
 * day's last fire to the next day's first included; null when it fires once a day at most. A clock change
 * may shorten one gap of the year by its hour.
 */
const shortestGapSeconds = memo((schedule: string): number | null => {
  const f = fieldsOf(schedule);
  const sorted = (values: readonly (number | string)[]) => values.filter((v): v is number => typeof v === 'number').sort((a, b) => a - b);
  const [hours, minutes, seconds] = [sorted(f.hour.values), sorted(f.minute.values), sorted(f.second.values)];
  if (hours.length * minutes.length * seconds.length < 2) return null;
  let first = -1;
  let last = -1;
  let gap = Infinity;
  for (const h of hours)
    for (const m of minutes)
      for (const s of seconds) {
        const t = h * 3600 + m * 60 + s;
        if (last >= 0) gap = Math.min(gap, t - last);
        else first = t;
        last = t;
      }
  return Math.min(gap, first + 86_400 - last);
}, 500);

/**
 * What is wrong with a file_change glob: its syntax, any glob its braces make (`{..,a}/x` is `../x` too)
 * leaving the workspace, or any it makes that can never fire (or, for a `!` glob, exclude). The watcher sees
 * files only, never a folder as such (`src/` matches nothing), and never looks into IGNORED_FOLDERS: such a
 * glob was stored (201) and stayed silent.
 */
function globError(glob: string): string | null {
  const syntax = globSyntaxError(glob);
  if (syntax) return syntax;
  const expanded = expandBraces(glob);
  for (const one of expanded) {
    if (path.isAbsolute(one) || /^[A-Za-z]:[\\/]/.test(one)) return 'must be relative to the workspace root';
    if (one.split(/[\\/]/).includes('..')) return 'must not climb out of the workspace root with ..';
  }
  // refused only when none of the globs its braces make can match: `{src,node_modules}/**` fires for src
  const silent = expanded.map((one) => {
    const shown = one === glob ? `"${glob}"` : `"${glob}" (as "${one}")`;
    // `!src/gen/` too: it would exclude nothing, and src/gen's files would fire
    if (one.endsWith('/')) return `${shown} ends in /, and never matches: changes are seen as files, not folders; write "${one}**" for the files under it`;
    // an exclusion of what is never seen excludes nothing, and harms nothing
    if (glob.startsWith('!')) return null;
    const folder = literalSegmentsOf(one).find((name) => name !== null && IGNORED_FOLDERS.includes(name));
    return folder
      ? `${shown} never matches: ${folder} is not watched (nothing named ${IGNORED_FOLDERS.join(', ')} is, at any depth, nor anything in it)`
      : null;
  });
  return silent.every((why) => why !== null) ? silent[0]! : null;
}

export function validateTriggers(triggers: Trigger[], at = '/body/triggers', opts: { cronMinIntervalSeconds?: number } = {}): FieldError[] {
  const errors: FieldError[] = [];
  triggers.forEach((t, i) => {
    // the schema says so too; a trigger that is not an object would break every query of the triggers
    if (typeof t !== 'object' || t === null || Array.isArray(t)) {
      errors.push({ path: `${at}/${i}`, message: 'must be an object with a type' });
      return;
    }
    if (t.type === 'cron') {
      const bad = cronError(t.schedule);
      if (bad) errors.push({ path: `${at}/${i}/schedule`, message: bad });
      if (!isTimeZone(t.timezone)) errors.push({ path: `${at}/${i}/timezone`, message: `"${t.timezone}" is not an IANA time zone` });
      else if (bad) return;
      else if (!nextCronFire(t.schedule, t.timezone, new Date()))
        errors.push({ path: `${at}/${i}/schedule`, message: `does not fire within the next ${CRON_HORIZON_YEARS} years` });
      else if (opts.cronMinIntervalSeconds) {
        const gap = shortestGapSeconds(t.schedule);
        if (gap !== null && gap < opts.cronMinIntervalSeconds)
          errors.push({
            path: `${at}/${i}/schedule`,
            message: `fires every ${gap} s; the shortest interval allowed is ${opts.cronMinIntervalSeconds} s (SERVICE_CRON_MIN_INTERVAL_SECONDS)`,
          });
      }
    } else if (t.type === 'file_change') {
      t.paths.forEach((glob, j) => {
        const bad = globError(glob);
        if (bad) errors.push({ path: `${at}/${i}/paths/${j}`, message: bad });
      });
    }
  });
  return errors;
}
