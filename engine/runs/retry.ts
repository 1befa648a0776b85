// Retry policies: how a run is tried again after a failed attempt (Temporal's and BullMQ's
// `attempts` count the first try too; so does ours). Interruptions by a deploy are not failures and
// do not count against it.
import type { AttemptRecord, RetryPolicy, RetryPolicyInput, Run, RunStatus } from '../platform/index.js';

const MAX_DELAY_MS = 15 * 60_000;

export function retryPolicyOf(input: RetryPolicyInput | null | undefined): RetryPolicy | null {
  if (!input || input.attempts <= 1) return null;
  return {
    attempts: input.attempts,
    backoff: { type: input.backoff?.type ?? 'exponential', delay_ms: input.backoff?.delay_ms ?? 1000 },
    on: input.on?.length ? [...new Set(input.on)] : ['failed'],
  };
}

/** Failed tries so far, the one that just ended included. */
const failuresOf = (attempts: AttemptRecord[]) => attempts.filter((a) => a.outcome !== 'interrupted').length + 1;

/** Whether the run's retry policy covers an attempt that ended with `status` (it then decides whether the run goes on). */
export const policyCovers = (run: Pick<Run, 'retry'>, status: RunStatus): boolean => Boolean(run.retry && (run.retry.on as RunStatus[]).includes(status));

/**
 * The delay before the next try when an attempt that ended with `status` is to be retried, or null
 * when the run ends here.
 */
export function retryDelayMs(run: Pick<Run, 'retry' | 'attempts'>, status: RunStatus): number | null {
  const policy = run.retry;
  if (!policy || !policyCovers(run, status)) return null;
  const failures = failuresOf(run.attempts);
  if (failures >= policy.attempts) return null;
  const { type, delay_ms } = policy.backoff;
  return Math.min(MAX_DELAY_MS, type === 'fixed' ? delay_ms : delay_ms * 2 ** (failures - 1));
}
