// The API rate limit's own count, used when Redis is not connected: the same rule as Redis's count.
import { expect } from 'chai';
import { Redis } from 'ioredis';
import { apiRateLimitOf, ApiRateLimitedError } from '../../engine/auth/index.js';
import type { Queues } from '../../engine/platform/index.js';

describe('api rate limit, counted in the process', () => {
  it('counts a request in both budgets or in neither, so a key spent by its retries leaves its tenant the rest', async () => {
    const redis = new Redis({ lazyConnect: true }); // never connected: the process counts alone
    const limit = apiRateLimitOf({ redis, queues: { prefix: 'unit' } as Queues }, { perTenantPerMinute: 5, perKeyPerMinute: 2 });
    const refusal = (p: Promise<unknown>) =>
      p.then(
        () => null,
        (err: unknown) => err,
      );
    expect(await limit.consume('acme', 'k1')).to.include({ policy: 'key', remaining: 1 });
    expect(await limit.consume('acme', 'k1')).to.include({ policy: 'key', remaining: 0 });
    for (let i = 0; i < 10; i++) {
      const err = await refusal(limit.consume('acme', 'k1'));
      expect(err).to.be.instanceOf(ApiRateLimitedError);
      expect((err as ApiRateLimitedError).state).to.include({ policy: 'key', remaining: 0 });
    }
    // the ten refused requests did not count: the tenant has 3 left
    expect(await limit.consume('acme', 'k2')).to.include({ policy: 'key', remaining: 1 });
    expect(await limit.consume('acme', null)).to.include({ policy: 'tenant', remaining: 1 });
    expect(await limit.consume('acme', 'k3')).to.include({ policy: 'tenant', remaining: 0 });
    expect(((await refusal(limit.consume('acme', 'k4'))) as ApiRateLimitedError).state).to.include({ policy: 'tenant', remaining: 0 });
    expect(await limit.consume('other', 'k5')).to.include({ policy: 'key', remaining: 1 });
    redis.disconnect();
  });
});
