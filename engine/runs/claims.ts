// Which runs each worker process is executing right now, in Redis: every worker process writes its
// list at each beat, in a hash field of its own with the time it holds until. A run that another live
// process claims is not lost when its job is delivered again after its lock lapsed (Redis paused for
// longer than the lock, an event loop stalled), nor when its job vanished (Redis lost its data): that
// process still runs it, and ends it. A process that dies stops beating, and its claims lapse.
// After Redis lost its data the registry is incomplete until every live process has beaten again: it
// answers "cannot tell" until then, and nothing is judged lost meanwhile.
import { randomBytes } from 'node:crypto';
import type { Clock, Redis } from '../platform/index.js';

/** beats a claim outlives its last write by: a process is judged gone only after missing this many */
const LAPSE_BEATS = 6;
const BORN = '~born';

export type RunClaims = ReturnType<typeof createRunClaims>;

export function createRunClaims(redis: Redis, prefix: string, clock: Clock) {
  const key = `${prefix}:run-claims`;
  const self = randomBytes(8).toString('hex');
  let beatMs = 5000;

  async function beat(runIds: string[]): Promise<void> {
    const now = clock.now().getTime();
    await redis
      .multi()
      .hsetnx(key, BORN, String(now))
      .hset(key, self, JSON.stringify({ until: now + LAPSE_BEATS * beatMs, runs: runIds }))
      .exec();
  }

  return {
    /**
     * Beats every `everyMs` with the runs `executing()` names, until the returned stop is called (which
     * withdraws this process's claims).
     */
    start(executing: () => string[], everyMs: number): () => Promise<void> {
      beatMs = everyMs;
      const write = () => beat(executing()).catch(() => undefined); // Redis away: the next beat writes again
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
      const all = await redis.hgetall(key);
      const now = clock.now().getTime();
      if (!(now - Number(all[BORN]) >= LAPSE_BEATS * beatMs)) return null;
      const out = new Set<string>();
      const lapsed: string[] = [];
      for (const [field, value] of Object.entries(all)) {
        if (field === BORN || field === self) continue;
        const claim = JSON.parse(value) as { until: number; runs: string[] };
        if (claim.until > now) for (const id of claim.runs) out.add(id);
        else lapsed.push(field);
      }
      if (lapsed.length) await redis.hdel(key, ...lapsed);
      return out;
    },
  };
}
