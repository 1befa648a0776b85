// Which runs each worker process is executing right now, in Redis: every worker process writes its
// list at each beat, in a hash field of its own with the time it holds until. A run that another live
// process claims is not lost when its job is delivered again after its lock lapsed (Redis paused for
// longer than the lock, an event loop stalled), nor when its job vanished (Redis lost its data): that
// process still runs it, and ends it. A process that dies stops beating, and its claims lapse.
// After Redis lost its data the registry is incomplete until every live process has beaten again: it
// answers "cannot tell" until then, and nothing is judged lost meanwhile. Every time is Redis's own
// (TIME, in the scripts): the hosts' clocks may disagree, Redis's is one.
import { randomBytes } from 'node:crypto';
import type { Redis } from '../platform/index.js';

/** beats a claim outlives its last write by: a process is judged gone only after missing this many */
const LAPSE_BEATS = 6;
const BORN = '~born';

// KEYS[1] the registry; ARGV: this process, how long its claim holds (ms), its runs as JSON. Claims
// lapsed for longer than that again (their processes long gone) are dropped in the same step.
const BEAT = `local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local hold = tonumber(ARGV[2])
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local until_ms = tonumber(string.match(all[i + 1], '^(%d+) '))
  if all[i] ~= '${BORN}' and until_ms and until_ms < now - hold then redis.call('HDEL', KEYS[1], all[i]) end
end
redis.call('HSETNX', KEYS[1], '${BORN}', now)
redis.call('HSET', KEYS[1], ARGV[1], (now + hold) .. ' ' .. ARGV[3])
return now`;

// KEYS[1] the registry: Redis's time now, then every field and value
const READ = `local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return { tostring(now), redis.call('HGETALL', KEYS[1]) }`;

type ClaimsRedis = Redis & {
  runClaimsBeat(key: string, self: string, holdMs: number, runs: string): Promise<number>;
  runClaimsRead(key: string): Promise<[string, string[]]>;
};

export type RunClaims = ReturnType<typeof createRunClaims>;

export function createRunClaims(redis: Redis, prefix: string) {
  if (!('runClaimsBeat' in redis)) {
    redis.defineCommand('runClaimsBeat', { numberOfKeys: 1, lua: BEAT });
    redis.defineCommand('runClaimsRead', { numberOfKeys: 1, lua: READ });
  }
  const r = redis as ClaimsRedis;
  const key = `${prefix}:run-claims`;
  const self = randomBytes(8).toString('hex');
  let beatMs = 5000;

  return {
    /**
     * Beats every `everyMs` with the runs `executing()` names, until the returned stop is called (which
     * withdraws this process's claims).
     */
    start(executing: () => string[], everyMs: number): () => Promise<void> {
      beatMs = everyMs;
      // Redis away: the next beat writes again
      const write = () => r.runClaimsBeat(key, self, LAPSE_BEATS * beatMs, JSON.stringify(executing())).catch(() => undefined);
      void write();
      const timer = setInterval(write, everyMs);
      timer.unref();
      return async () => {
        clearInterval(timer);
        await redis.hdel(key, self).catch(() => 0);
      };
    },

    /**
     * The runs that live processes other than this one are executing; null when the registry is too
     * young to be complete (it was just made, or made again after Redis lost its data).
     */
    async elsewhere(): Promise<Set<string> | null> {
      const [nowText, flat] = await r.runClaimsRead(key);
      const now = Number(nowText);
      const all = new Map<string, string>();
      for (let i = 0; i < flat.length; i += 2) all.set(flat[i]!, flat[i + 1]!);
      if (!(now - Number(all.get(BORN)) >= LAPSE_BEATS * beatMs)) return null;
      const out = new Set<string>();
      for (const [field, value] of all) {
        if (field === BORN || field === self) continue;
        const at = value.indexOf(' ');
        if (Number(value.slice(0, at)) > now) for (const id of JSON.parse(value.slice(at + 1)) as string[]) out.add(id);
      }
      return out;
    },
  };
}
