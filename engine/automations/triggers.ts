// Trigger rules the schema cannot express: a cron expression that parses, a real IANA time zone,
// file globs that stay inside the workspace. Triggers are validated here and fire in the run engine.
import path from 'node:path';
import { CronExpression, CronExpressionParser } from 'cron-parser';
import type { FieldError, Trigger } from '../platform/index.js';
import { IGNORED_FOLDERS } from './file-triggers.js';
import { expandBraces, expandedChars, globSyntaxError, literalSegmentsOf, MAX_GLOB_CHARS } from './globs.js';

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
 * The last next fire computed for each expression and zone, and the time it was computed from: it is the
 * answer for every time from then until it (the fires of a trigger are one set of instants, whatever time
 * they are asked from, so none lies between), and the status route, the ticker and the reconcile of many
 * triggers compute it once. Bounded; the oldest entry is dropped first.
 */
const nextFires = new Map<string, { from: number; next: number | null }>();

const offsetFormat = memo((zone: string) => new Intl.DateTimeFormat('en-US', { timeZone: zone || 'UTC', timeZoneName: 'longOffset' }));
/** Zones that are UTC under another name: their offset never changes, so it is not formatted (a few µs a call). */
const UTC_ZONES = new Set(['', 'UTC', 'Etc/UTC', 'GMT', 'Etc/GMT', 'Universal', 'Etc/Universal', 'Zulu', 'Etc/Zulu']);

function offsetAt(zone: string | undefined, at: number): string {
  if (UTC_ZONES.has(zone ?? '')) return 'GMT+00:00';
  return offsetFormat(zone ?? '')
    .formatToParts(at)
    .find((p) => p.type === 'timeZoneName')!.value;
}

const MINUTE_MS = 60_000;
const DAY_MS = 86_400_000;
/** More than any zone's clock change (2 h): a change further than this from a time moves none of its fires. */
const NEAR_MS = 3 * 3600_000;

/** The zone's offset at `at`, in ms to add to an instant for its wall clock. */
const offsetMsAt = (zone: string, at: number) => offsetMinutes(offsetAt(zone, at)) * MINUTE_MS;

/** The instant the zone's offset changes from what it is at `lo`, at or before `hi`, where it differs: clocks change on whole minutes. */
function changeBetween(zone: string, lo: number, hi: number): number {
  const before = offsetMsAt(zone, lo);
  let a = Math.floor(lo / MINUTE_MS);
  let b = Math.ceil(hi / MINUTE_MS);
  while (b - a > 1) {
    const mid = Math.floor((a + b) / 2);
    if (offsetMsAt(zone, mid * MINUTE_MS) === before) a = mid;
    else b = mid;
  }
  return b * MINUTE_MS;
}

/**
 * The next fire after `from` in a zone whose clocks change. cron-parser's own stepping in a zone is not
 * trusted across a change: from just before or inside one it gave a time in the past (`15,45 * * * *` in
 * Pacific/Chatham), skipped the day of a change at midnight (`0 0 * * *` in America/Santiago, Asia/Beirut,
 * America/Havana), or gave up ("loop limit exceeded", `0 2 * * *` in Australia/Lord_Howe) and the trigger left
 * the schedule. It is asked only for wall-clock times (the wall clock as UTC, which has no change), and each
 * is placed in the zone here: a wall time the spring change skips fires by the offset before it (02:30 in
 * Paris at 03:30 summer time, 00:00 in Santiago at 01:00), one the autumn change shows twice fires at its
 * first pass, for a schedule of set hours, and at both for a schedule of every hour.
 * Costs two to four cron steps and five offsets, and some twenty offsets near a change.
 */
function zonedNextFire(schedule: string, zone: string, from: number, until: number): number | null {
  const expression = new CronExpression(fieldsOf(schedule), { tz: 'UTC', currentDate: new Date(from), endDate: new Date(until + DAY_MS) });
  /** The first wall time of the schedule after `wall` (a wall clock read as UTC). */
  const wallNext = (wall: number): number | null => {
    try {
      expression.reset(new Date(wall));
      return expression.next().getTime();
    } catch {
      return null; // past the horizon
    }
  };
  const setHours = hasSetHours(schedule);
  const offset = (at: number) => offsetMsAt(zone, at);

  /** The first fire after `from` around the change at `at` (`o1` before it, `o2` after), none lying between `from` and the change's day. */
  function aroundChange(from: number, at: number, o1: number, o2: number, depth: number): number | null {
    if (from < at) {
      const w = wallNext(from + o1);
      if (w !== null && w - o1 < at) return w - o1;
    }
    let best: number | null = null;
    // spring: the wall times the change skips fire by the offset before it, and may come after a time past the gap
    if (o2 > o1) {
      const w = wallNext(Math.max(from + o1, at + o1 - 1));
      if (w !== null && w < at + o2) best = w - o1;
    }
    // autumn: a schedule of set hours does not fire again at the wall times the change shows a second time
    const w = wallNext(Math.max(from + o2, (setHours && o2 < o1 ? at + o1 : at + o2) - 1));
    if (w !== null) {
      const after = w - o2 < at + 2 * DAY_MS ? w - o2 : placeWall(w, Math.max(from, at), depth + 1);
      if (after !== null && (best === null || after < best)) best = after;
    }
    return best;
  }

  /** The first fire after `from` from the wall time `w`, the schedule's first after `from`'s, far from a change at `from`. */
  function placeWall(w: number, from: number, depth: number): number | null {
    // an offset is at most 14 h: a day either side of the wall time read as UTC is before and after its instant
    const before = offset(w - DAY_MS);
    const after = offset(w + DAY_MS);
    if (before === after) return w - before;
    if (depth > 20) return null; // a change a day from each other, twenty times: no zone does that
    const at = changeBetween(zone, w - DAY_MS, w + DAY_MS);
    return aroundChange(Math.max(from, Math.min(w - before, w - after) - 1), at, before, after, depth);
  }

  const o = offset(from);
  const early = offset(from - NEAR_MS);
  if (early !== o) return aroundChange(from, changeBetween(zone, from - NEAR_MS, from), early, o, 0);
  const late = offset(from + NEAR_MS);
  if (late !== o) return aroundChange(from, changeBetween(zone, from, from + NEAR_MS), o, late, 0);
  const w = wallNext(from + o);
  return w === null ? null : placeWall(w, from, 0);
}

/**
 * The next time a cron trigger fires after `from`, or null when it does not fire within CRON_HORIZON_YEARS
 * (or never does). Clock changes in its zone as cron does them for a schedule of set hours (zonedNextFire).
 */
export function nextCronFire(schedule: string, timezone: string | undefined, from: Date): Date | null {
  const key = `${schedule}\n${timezone ?? ''}`;
  const at = from.getTime();
  const known = nextFires.get(key);
  if (known && at >= known.from && (known.next === null ? at < known.from + NONE_KEPT_MS : at < known.next)) {
    return known.next === null ? null : new Date(known.next);
  }
  if (!isTimeZone(timezone || 'UTC')) return null;
  const until = at + HORIZON_MS;
  let next: number | null;
  try {
    next = UTC_ZONES.has(timezone ?? '')
      ? new CronExpression(fieldsOf(schedule), { tz: 'UTC', currentDate: from, endDate: new Date(until) }).next().getTime()
      : zonedNextFire(schedule, timezone!, at, until);
  } catch {
    next = null; // past the horizon, never (cron-parser's loop limit), or not an expression
  }
  if (next !== null && (next > until || next <= at)) next = null;
  nextFires.delete(key);
  if (nextFires.size >= 10_000) nextFires.delete(nextFires.keys().next().value!);
  nextFires.set(key, { from: at, next });
  return next === null ? null : new Date(next);
}

/**
 * The last time a cron trigger fired at or before `at` and at or after `since`, or null when it did not (or
 * it is not an expression). Found with nextCronFire, so the clock-change rules hold (cron-parser's own `prev`
 * in a zone took the day before a spring change's moved fire, the autumn's second pass, and on some change
 * days gave nothing after seconds of stepping): the first window before `at` that holds a fire, its length
 * doubled from a minute, is walked to its last fire.
 */
export function lastCronFire(schedule: string, timezone: string | undefined, at: Date, since: number): Date | null {
  const end = at.getTime();
  for (let window = 60_000; ; window *= 2) {
    const from = Math.max(since, end - window);
    let next = nextCronFire(schedule, timezone, new Date(from - 1))?.getTime();
    if (next !== undefined && next <= end) {
      let last = next;
      while ((next = nextCronFire(schedule, timezone, new Date(last))?.getTime()) !== undefined && next <= end) last = next;
      return new Date(last);
    }
    if (from <= since) return null;
  }
}

/** The minutes of an offset as `offsetAt` writes it (GMT+05:30, GMT-03:00, GMT). */
function offsetMinutes(offset: string): number {
  const m = /([+-])(\d\d):(\d\d)/.exec(offset);
  return m ? (m[1] === '-' ? -1 : 1) * (Number(m[2]) * 60 + Number(m[3])) : 0;
}

/** A schedule that names its hours (not every hour): its fire in the repeated hour of an autumn night is made once. */
const hasSetHours = (schedule: string) => {
  try {
    return fieldsOf(schedule).hour.values.length < 24;
  } catch {
    return false;
  }
};

/** True when `at` is a time the schedule gives (a fire the spring clock change moved included). */
export function isCronFire(schedule: string, timezone: string | undefined, at: number): boolean {
  return nextCronFire(schedule, timezone, new Date(at - 1))?.getTime() === at;
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

/** The times of day (seconds after midnight, sorted) a cron expression fires at: its seconds, minutes and hours. */
function timesOfDay(schedule: string): number[] {
  const f = fieldsOf(schedule);
  const sorted = (values: readonly (number | string)[]) => values.filter((v): v is number => typeof v === 'number').sort((a, b) => a - b);
  const [hours, minutes, seconds] = [sorted(f.hour.values), sorted(f.minute.values), sorted(f.second.values)];
  const out: number[] = [];
  for (const h of hours) for (const m of minutes) for (const s of seconds) out.push(h * 3600 + m * 60 + s);
  return out;
}

/**
 * The shortest time between two fires of a cron expression on the clock, from its seconds, minutes and hours
 * (no stepping through dates: an expression's days only space its fires further apart), the step from a
 * day's last fire to the next day's first included; null when it fires once a day at most. A clock change
 * may shorten one gap of the year by its hour.
 */
const shortestGapSeconds = memo((schedule: string): number | null => {
  const times = timesOfDay(schedule);
  if (times.length < 2) return null;
  let gap = times[0]! + 86_400 - times.at(-1)!;
  for (let i = 1; i < times.length; i++) gap = Math.min(gap, times[i]! - times[i - 1]!);
  return gap;
}, 500);

/**
 * Days compared when two triggers of one zone are: 28 years, the calendar's cycle (in this century), so every
 * date falls on every weekday (13 March on a Friday, 29 February on a Tuesday) within them.
 */
const DAYS_COMPARED = 28 * 366;

/**
 * Which of the DAYS_COMPARED days from `start` (a UTC midnight, read as a date of the trigger's zone) a cron
 * expression fires on, by its month, day-of-month and weekday fields (either of the last two when both are
 * set, as cron does). A day rule beyond plain values (L, #) is taken as every day of its months: more days, so
 * a closeness it hides is never missed.
 */
function fireDays(schedule: string, start: number): Uint8Array {
  const f = fieldsOf(schedule);
  const plain = (values: readonly (number | string)[]) => values.every((v) => typeof v === 'number');
  const special = !plain(f.dayOfMonth.values) || !plain(f.dayOfWeek.values) || f.dayOfMonth.hasLastChar || f.dayOfWeek.hasLastChar || !!f.dayOfWeek.nthDay;
  const flags = (values: readonly (number | string)[], size: number, of = (v: number) => v) => {
    const on = new Uint8Array(size);
    for (const v of values) if (typeof v === 'number') on[of(v)] = 1;
    return on;
  };
  const [months, dates, weekdays] = [flags(f.month.values, 13), flags(f.dayOfMonth.values, 32), flags(f.dayOfWeek.values, 7, (d) => d % 7)];
  const [anyDate, anyWeekday] = [f.dayOfMonth.isWildcard, f.dayOfWeek.isWildcard];
  const days = new Uint8Array(DAYS_COMPARED);
  // the calendar walked a day at a time (a Date a day took 5 ms a trigger)
  const first = new Date(start);
  let [year, month, date, weekday] = [first.getUTCFullYear(), first.getUTCMonth() + 1, first.getUTCDate(), first.getUTCDay()];
  const lengthOf = (y: number, m: number) => (m === 2 && (y % 4 !== 0 || (y % 100 === 0 && y % 400 !== 0)) ? 28 : MAX_DAYS[m - 1]!);
  for (let i = 0; i < DAYS_COMPARED; i++) {
    if (months[month]) {
      const [onDate, onWeekday] = [dates[date] === 1, weekdays[weekday] === 1];
      days[i] = Number(special || (anyDate && anyWeekday) || (anyDate ? onWeekday : anyWeekday ? onDate : onDate || onWeekday));
    }
    weekday = (weekday + 1) % 7;
    if (++date > lengthOf(year, month)) [date, month] = [1, month + 1];
    if (month > 12) [month, year] = [1, year + 1];
  }
  return days;
}

/** The least distance between a number of one sorted list and one of another. */
function closest(a: readonly number[], b: readonly number[]): number {
  let best = Infinity;
  for (let i = 0, j = 0; i < a.length && j < b.length;) {
    best = Math.min(best, Math.abs(a[i]! - b[j]!));
    if (a[i]! < b[j]!) i++;
    else j++;
  }
  return best;
}

type CronTrigger = Extract<Trigger, { type: 'cron' }>;

/**
 * The two cron triggers of one automation that fire closest together, when closer than `limit` seconds (each
 * on its own was checked already). Two of one zone are compared on the days both fire (Monday's 09:00 and
 * Tuesday's are a day apart), a day's last fire with the next day's first included; two of different zones by
 * their times of day in UTC alone, at each offset their zones take in the coming year.
 */
function closestCronTriggers(crons: { t: CronTrigger; i: number }[], limit: number, now: number): { a: number; b: number; gap: number; zones: boolean } | null {
  const zoneOf = (t: CronTrigger) => (UTC_ZONES.has(t.timezone ?? '') ? 'UTC' : t.timezone!);
  const start = Math.floor(now / DAY_MS) * DAY_MS;
  const times = crons.map(({ t }) => timesOfDay(t.schedule));
  const days = new Map<number, Uint8Array>();
  const daysOf = (k: number) => days.get(k) ?? days.set(k, fireDays(crons[k]!.t.schedule, start)).get(k)!;
  /** some day the first fires on, and the second `shift` days later */
  const together = (x: Uint8Array, y: Uint8Array, shift: number) => x.some((on, d) => on && y[d + shift]);
  /**
   * The zone's spring changes in the coming year, as the times of day they skip: a fire in one is made at the
   * same time after it (02:30 in Paris at 03:30 that night), where another trigger of the zone may fire already
   */
  const springs = new Map<string, { from: number; by: number }[]>();
  const springsOf = (zone: string) => {
    const known = springs.get(zone);
    if (known) return known;
    const found: { from: number; by: number }[] = [];
    for (let w = 0; w < 26; w++) {
      const [lo, hi] = [now + w * 15 * DAY_MS, now + (w + 1) * 15 * DAY_MS];
      const [before, after] = [offsetMsAt(zone, lo), offsetMsAt(zone, hi)];
      if (after <= before) continue;
      const at = changeBetween(zone, lo, hi);
      found.push({ from: Math.round((((at + before) % DAY_MS) + DAY_MS) % DAY_MS) / 1000, by: (after - before) / 1000 });
    }
    springs.set(zone, found);
    return found;
  };
  /** the times of day moved as a spring change moves them, sorted */
  const sprung = (ts: number[], s: { from: number; by: number }) => ts.map((t) => (t >= s.from && t < s.from + s.by ? t + s.by : t)).sort((x, y) => x - y);
  const utc = new Map<number, number[][]>();
  /** the times of day in UTC, at each offset of the zone over the coming year */
  const utcTimes = (k: number) => {
    const known = utc.get(k);
    if (known) return known;
    const zone = zoneOf(crons[k]!.t);
    const offsets = new Set(Array.from({ length: 26 }, (_, w) => offsetMsAt(zone, now + w * 15 * DAY_MS) / 1000));
    const shifted = [...offsets].map((o) => times[k]!.map((t) => (((t - o) % 86_400) + 86_400) % 86_400).sort((x, y) => x - y));
    utc.set(k, shifted);
    return shifted;
  };
  for (let a = 0; a < crons.length; a++)
    for (let b = a + 1; b < crons.length; b++) {
      const [ta, tb] = [times[a]!, times[b]!];
      if (!ta.length || !tb.length) continue;
      const pair = (gap: number, zones: boolean) => ({ a: crons[a]!.i, b: crons[b]!.i, gap, zones });
      if (zoneOf(crons[a]!.t) === zoneOf(crons[b]!.t)) {
        const same = closest(ta, tb);
        if (same < limit && together(daysOf(a), daysOf(b), 0)) return pair(same, false);
        const aThenB = 86_400 - ta.at(-1)! + tb[0]!;
        if (aThenB < limit && together(daysOf(a), daysOf(b), 1)) return pair(aThenB, false);
        const bThenA = 86_400 - tb.at(-1)! + ta[0]!;
        if (bThenA < limit && together(daysOf(b), daysOf(a), 1)) return pair(bThenA, false);
        // the night the clocks go forward (02:00 and 03:00 in Paris are then one instant), on any day both fire: a
        // closeness only some spring night's date would show is taken as shown
        for (const s of springsOf(zoneOf(crons[a]!.t))) {
          const gap = closest(sprung(ta, s), sprung(tb, s));
          if (gap < limit && together(daysOf(a), daysOf(b), 0)) return pair(gap, false);
        }
        continue;
      }
      for (const x of utcTimes(a))
        for (const y of utcTimes(b)) {
          const gap = Math.min(closest(x, y), x[0]! + 86_400 - y.at(-1)!, y[0]! + 86_400 - x.at(-1)!);
          if (gap < limit) return pair(gap, true);
        }
    }
  return null;
}

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
  // every file event is matched against every glob of the automations watching its root: what one automation's
  // globs cost is bounded in all (each glob alone is, by its braces; 20 triggers of 50 globs of 64 expansions
  // held the watching process 8 s for one event)
  const globs = triggers.flatMap((t) => (t?.type === 'file_change' && Array.isArray(t.paths) ? t.paths : []));
  if (!errors.length && globs.length) {
    const chars = expandedChars(globs);
    if (chars > MAX_GLOB_CHARS)
      errors.push({
        path: at,
        message: `its file_change globs come to ${chars} characters with their braces expanded, over the ${MAX_GLOB_CHARS} an automation may match each file against: fewer globs, or a glob with fewer braces`,
      });
  }
  // the limit bounds how often an automation fires, not each of its triggers: five triggers of every 10 s,
  // 2 s apart, fired every 2 s under a limit of 10
  const crons = triggers.flatMap((t, i) => (t?.type === 'cron' ? [{ t, i }] : []));
  if (opts.cronMinIntervalSeconds && !errors.length && crons.length > 1) {
    const near = closestCronTriggers(crons, opts.cronMinIntervalSeconds, Date.now());
    if (near)
      errors.push({
        path: `${at}/${near.b}/schedule`,
        message: `fires ${near.gap} s from a fire of trigger ${near.a}; an automation's cron triggers together may fire no closer than ${opts.cronMinIntervalSeconds} s (SERVICE_CRON_MIN_INTERVAL_SECONDS)${near.zones ? '; triggers of different time zones are compared by their times of day' : ''}`,
      });
  }
  return errors;
}
