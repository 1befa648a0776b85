// Trigger rules the schema cannot express: a cron expression that parses, a real IANA time zone,
// file globs that stay inside the workspace. Triggers are validated here and fire in the run engine.
import path from 'node:path';
import { CronExpressionParser } from 'cron-parser';
import type { FieldError, Trigger } from '../platform/index.js';

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

const parsedCron = memo((key: string) => {
  const [schedule, tz] = key.split('\n') as [string, string];
  return CronExpressionParser.parse(schedule, { tz: tz || undefined });
}, 500);
const nextFires = new Map<string, number | null>();

/**
 * The next time a cron trigger fires after `from`, or null when the expression never fires. A cron
 * fires on whole seconds at the finest, so every `from` within one second has the same answer: it is
 * remembered for that second, and each expression is parsed once and stepped from `from` (parsing and
 * stepping in a zone cost 20-70 µs, a third of creating an automation).
 */
export function nextCronFire(schedule: string, timezone: string | undefined, from: Date): Date | null {
  const key = `${schedule}\n${timezone ?? ''}\n${Math.floor(from.getTime() / 1000)}`;
  let next = nextFires.get(key);
  if (next === undefined) {
    try {
      const expression = parsedCron(`${schedule}\n${timezone ?? ''}`);
      expression.reset(from);
      next = expression.next().getTime();
    } catch {
      next = null;
    }
    if (nextFires.size >= 2000) nextFires.delete(nextFires.keys().next().value!);
    nextFires.set(key, next);
  }
  return next === null ? null : new Date(next);
}

const cronError = memo((schedule: string): string | null => {
  const fields = schedule.trim().split(/\s+/);
  if (!schedule.trim().startsWith('@') && (fields.length < 5 || fields.length > 6)) {
    return `expected 5 fields (minute hour day month weekday) or 6 with seconds first, got ${fields.length}`;
  }
  // cron-parser draws an H ("some value") again at every parse, and BullMQ parses at every tick: the
  // schedule would move each time, firing at random times and a random number of times
  // an H on its own, wherever it stands (H, H(0-5), */H, 0-H): not the H of a day's name (THU)
  if (fields.some((f) => /(^|[^a-z])h($|[^a-z])/i.test(f))) return 'H (a hashed value) is not supported: name the minute, hour, ... to fire at';
  try {
    CronExpressionParser.parse(schedule, { tz: 'UTC' }).next();
    return null;
  } catch (err) {
    return `not a valid cron expression: ${(err as Error).message}`;
  }
});

function globError(glob: string): string | null {
  if (path.isAbsolute(glob) || /^[A-Za-z]:[\\/]/.test(glob)) return 'must be relative to the workspace root';
  if (glob.split(/[\\/]/).includes('..')) return 'must not climb out of the workspace root with ..';
  return null;
}

/**
 * The shortest time between two fires of a cron expression, over its next fires from now (an expression's
 * gaps repeat within its period; ten fires show a second-level or minute-level one): null when it never fires.
 */
const shortestGapSeconds = memo((key: string): number | null => {
  const expression = parsedCron(key);
  expression.reset(new Date());
  const fires: number[] = [];
  try {
    for (let i = 0; i < 11; i++) fires.push(expression.next().getTime());
  } catch {
    // no more fires
  }
  if (fires.length < 2) return null;
  return Math.min(...fires.slice(1).map((t, i) => (t - fires[i]!) / 1000));
}, 500);

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
      else if (!bad && opts.cronMinIntervalSeconds) {
        const gap = shortestGapSeconds(`${t.schedule}\n${t.timezone}`);
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
