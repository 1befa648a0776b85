// Work a process takes a few of at once (an upload's temporary file, a pack's verification on the thread pool):
// one more is refused before it starts, 503 with Retry-After, and one tenant holds at most a share of the
// places (429 past that), so a tenant sending many at once, or slowly, leaves room for the others.
import { RateLimitedError, ServiceUnavailableError } from './errors.js';

export type Admission = {
  /** Runs `work` in a place of `tenantId`'s, or throws at once when the process or the tenant has none left. */
  hold<T>(tenantId: string, work: () => Promise<T>): Promise<T>;
};

/**
 * Places for `max` at once, a tenant's share `max / tenantShare` (at least one). `what` names the work in
 * the refusals ("uploads"), which tell the client to come back after `retryAfterSeconds`.
 */
export function admission(opts: { max: number; tenantShare: number; what: string; retryAfterSeconds: number }): Admission {
  const perTenant = Math.max(1, Math.ceil(opts.max / opts.tenantShare));
  let taken = 0;
  /** places taken per tenant (a tenant with none has no entry) */
  const byTenant = new Map<string, number>();
  return {
    async hold(tenantId, work) {
      const mine = byTenant.get(tenantId) ?? 0;
      if (mine >= perTenant)
        throw new RateLimitedError(`this tenant has ${mine} ${opts.what} in progress, the most it may have at once; try again shortly`, opts.retryAfterSeconds);
      if (taken >= opts.max)
        throw new ServiceUnavailableError(`the service is taking ${opts.max} ${opts.what} already; try again shortly`, opts.retryAfterSeconds);
      taken++;
      byTenant.set(tenantId, mine + 1);
      try {
        return await work();
      } finally {
        taken--;
        const left = byTenant.get(tenantId)! - 1;
        if (left) byTenant.set(tenantId, left);
        else byTenant.delete(tenantId);
      }
    },
  };
}
