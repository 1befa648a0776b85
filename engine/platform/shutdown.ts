// Work a process stops as it shuts down (a deploy, a scale-in): its jobs go back to the queue for another worker.

/** Why work stopped when its process stops: a deploy, not the work's failure. */
export const SHUTDOWN_REASON = 'the worker shut down (a deploy or a scale-in)';

/** Aborts, with SHUTDOWN_REASON, every controller of the work a process runs (by what it is of); how many. */
export function interruptEvery(running: Map<string, Set<AbortController>>): number {
  let n = 0;
  for (const controllers of running.values())
    for (const c of controllers) {
      c.abort(SHUTDOWN_REASON);
      n++;
    }
  return n;
}
