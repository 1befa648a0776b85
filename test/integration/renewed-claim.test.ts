// A claim on a piece of work (engine/platform/redis.ts renewedClaim: a gate run's seal, an audit's assembly) on
// the real Redis: held however long its work takes, and let go within its lifetime by a holder that died.
import { expect } from 'chai';
import { Redis } from 'ioredis';
import { renewedClaim } from '../../engine/platform/index.js';
import { deleteRedisPrefix, testRedisUrl, uniquePrefix } from '../support/harness.js';

describe('a renewed claim', () => {
  let redis: Redis;
  let prefix: string;
  beforeEach(() => {
    redis = new Redis(testRedisUrl());
    prefix = uniquePrefix();
  });
  afterEach(async () => {
    await deleteRedisPrefix(prefix);
    redis.disconnect();
  });

  it('is held while its work runs past its lifetime, let go after, and lapses within its lifetime when its holder died', async () => {
    const claim = renewedClaim(redis, `${prefix}:claim`, 300);
    const token = await claim.take();
    expect(token).to.be.a('string');
    // its work takes three lifetimes: nobody else takes it meanwhile
    let other: string | null = 'not asked';
    await claim.holding(token!, async () => {
      await new Promise((r) => setTimeout(r, 900));
      other = await claim.take();
    });
    expect(other, 'taken by another while its work ran').to.equal(null);
    await claim.release(token!);
    const again = await claim.take();
    expect(again, 'free once let go').to.be.a('string');
    // a holder that died renews nothing: the claim is free again within its lifetime
    await new Promise((r) => setTimeout(r, 400));
    expect(await claim.take(), 'lapsed').to.be.a('string');
    // a release by a token that no longer holds it takes nothing from the holder now
    await claim.release(again!);
    expect(await claim.take(), 'still held by the one that took it after the lapse').to.equal(null);
  });
});
