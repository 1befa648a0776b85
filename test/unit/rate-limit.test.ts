// The API rate limit's own count, used when Redis is not connected or stalled: the same rule as Redis's
// count, going on from what Redis last said; and a process too busy to read Redis's answer in time still
// takes it.
import { spawn, type ChildProcess } from 'node:child_process';
import { expect } from 'chai';
import { Redis } from 'ioredis';
import { apiRateLimitOf, ApiRateLimitedError } from '../../engine/auth/index.js';
import type { Queues } from '../../engine/platform/index.js';
import { eventually, freePort, listening, testRedisUrl, uniquePrefix } from '../support/harness.js';

const refusal = (p: Promise<unknown>) =>
  p.then(
    () => null,
    (err: unknown) => err,
  );

describe('api rate limit, counted in the process', () => {
  it('counts a request in both budgets or in neither, so a key spent by its retries leaves its tenant the rest', async () => {
    const redis = new Redis({ lazyConnect: true }); // never connected: the process counts alone
    const limit = apiRateLimitOf({ redis, queues: { prefix: 'unit' } as Queues }, { perTenantPerMinute: 5, perKeyPerMinute: 2 });
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

describe('api rate limit, counted in Redis', function () {
  this.timeout(20_000);

  it('takes Redis’s answer that came while the process was busy past the deadline, and goes on asking Redis', async () => {
    const redis = new Redis(testRedisUrl());
    await redis.ping(); // connected: counted in Redis from the first request
    try {
      const deps = { redis, queues: { prefix: uniquePrefix() } as Queues };
      const settings = { perTenantPerMinute: 1_000_000, perKeyPerMinute: 5 };
      // two web processes: the key is spent through the other one, so only Redis knows it
      const limit = apiRateLimitOf(deps, settings);
      const other = apiRateLimitOf(deps, settings);
      for (let i = 0; i < 5; i++) await other.consume('acme', 'spent');
      const busyFor = (ms: number) => {
        const until = Date.now() + ms;
        while (Date.now() < until);
      };
      // a request's count sent, then this process busy for 300 ms (a large body parsed): Redis answers within a
      // millisecond, but its answer is read only after the 100 ms timer has fired
      const busy = refusal(limit.consume('acme', 'spent'));
      await new Promise((r) => setImmediate(r));
      busyFor(300);
      const err = await busy;
      expect(err, 'Redis’s refusal taken, not a count started in the process').to.be.instanceOf(ApiRateLimitedError);
      expect((err as ApiRateLimitedError).state).to.include({ policy: 'key', remaining: 0 });
      // busy before the count was even sent (the batch sends at the end of the loop's turn): the deadline runs from the sending
      const unsent = refusal(limit.consume('acme', 'spent'));
      busyFor(300);
      expect(await unsent, 'the refusal of a count sent late').to.be.instanceOf(ApiRateLimitedError);
      // and not taken for a stalled Redis: the next request's count is Redis's too
      for (let i = 0; i < 5; i++) await other.consume('acme', 'later');
      expect(await refusal(limit.consume('acme', 'later')), 'a key spent in the other process').to.be.instanceOf(ApiRateLimitedError);
      expect((await limit.consume('acme', 'fresh')).remaining).to.equal(4);
    } finally {
      redis.disconnect();
    }
  });

  describe('when Redis stops answering', () => {
    let server: ChildProcess;
    let redis: Redis;
    let stopped = false;
    before(async () => {
      const port = await freePort();
      server = spawn('redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'], { stdio: 'ignore' });
      await eventually(() => listening(port), 'the private redis-server to listen');
      redis = new Redis(`redis://127.0.0.1:${port}`, { maxRetriesPerRequest: null });
      await redis.ping(); // connected: counted in Redis from the first request
    });
    after(() => {
      if (stopped) server.kill('SIGCONT');
      redis?.disconnect();
      server?.kill('SIGKILL');
    });

    it('counts on in the process from the count Redis last gave: a budget Redis said was spent is not started again from 0', async () => {
      const limit = apiRateLimitOf({ redis, queues: { prefix: uniquePrefix() } as Queues }, { perTenantPerMinute: 8, perKeyPerMinute: 5 });
      for (let i = 0; i < 5; i++) await limit.consume('acme', 'spent');
      expect(await refusal(limit.consume('acme', 'spent'))).to.be.instanceOf(ApiRateLimitedError);
      server.kill('SIGSTOP');
      stopped = true;
      const at = Date.now();
      const err = await refusal(limit.consume('acme', 'spent'));
      expect(Date.now() - at, 'not held for Redis').to.be.below(1000);
      expect(err, 'the spent key refused while Redis is stopped').to.be.instanceOf(ApiRateLimitedError);
      expect((err as ApiRateLimitedError).state).to.include({ policy: 'key', remaining: 0 });
      expect(await refusal(limit.consume('acme', 'spent'))).to.be.instanceOf(ApiRateLimitedError);
      // the tenant goes on from Redis's 5 too: 3 left of its 8, whichever key spends them
      expect(await limit.consume('acme', 'other')).to.include({ policy: 'tenant', remaining: 2 });
      await limit.consume('acme', 'other');
      await limit.consume('acme', 'third');
      expect(((await refusal(limit.consume('acme', 'third'))) as ApiRateLimitedError).state).to.include({ policy: 'tenant', remaining: 0 });
      server.kill('SIGCONT');
      stopped = false;
    });
  });
});
