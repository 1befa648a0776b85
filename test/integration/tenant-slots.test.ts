// A tenant's slots and line (engine/runs/concurrency.ts) on the real Redis: admission up to the limit,
// first come first served, no run in line twice, a run leaving the line, and a line kept as a list by an
// earlier version taken over in its order.
import { expect } from 'chai';
import { Redis } from 'ioredis';
import sinon from 'sinon';
import { createTenantSlots } from '../../engine/runs/index.js';
import { deleteRedisPrefix, testRedisUrl, uniquePrefix } from '../support/harness.js';

describe('tenant slots and line', () => {
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

  it('admits up to the limit, then lines runs up first come first served, each once', async () => {
    const slots = createTenantSlots(redis, prefix, 2);
    const admitted = [];
    for (const id of ['r1', 'r2', 'r3', 'r4', 'r5']) admitted.push(await slots.admit('t', id));
    expect(admitted).to.deep.equal([true, true, false, false, false]);
    // asked again (a retried request, the reconciler): an admitted run stays admitted, a waiting one keeps its place
    expect(await slots.admit('t', 'r1')).to.equal(true);
    expect(await slots.admit('t', 'r3')).to.equal(false);
    expect(await slots.line('t')).to.deep.equal(['r3', 'r4', 'r5']);
    expect([await slots.running('t'), await slots.waiting('t')]).to.deep.equal([2, 3]);
    // another tenant is not behind this one's line
    expect(await slots.admit('u', 'x1')).to.equal(true);
    // a waiting run that leaves (canceled) frees no slot and admits nothing; a running one admits the first in line
    expect(await slots.release('t', 'r4')).to.deep.equal({ admitted: [], parked: [] });
    expect(await slots.release('t', 'r1')).to.deep.equal({ admitted: ['r3'], parked: [] });
    expect(await slots.line('t')).to.deep.equal(['r5']);
    // released twice (a replay): nothing more is freed
    expect(await slots.release('t', 'r1')).to.deep.equal({ admitted: [], parked: [] });
    expect(await slots.admit('t', 'r6')).to.equal(false);
    expect(await slots.release('t', 'r2')).to.deep.equal({ admitted: ['r5'], parked: [] });
    expect(await slots.release('t', 'r3')).to.deep.equal({ admitted: ['r6'], parked: [] });
    expect(await slots.line('t')).to.deep.equal([]);
    // an empty line starts its places again, still in order
    await slots.admit('t', 'r7');
    await slots.admit('t', 'r8');
    expect(await slots.line('t')).to.deep.equal(['r7', 'r8']);
    const holders = await slots.holders();
    expect([...holders.get('t')!.admitted].sort()).to.deep.equal(['r5', 'r6']);
    expect([...holders.get('t')!.waiting]).to.deep.equal(['r7', 'r8']);
  });

  it('has room for a new run while fewer than maxWaiting wait, asking Redis only once this process saw the line near the cap', async () => {
    const here = createTenantSlots(redis, prefix, 1, 20);
    const elsewhere = createTenantSlots(redis, prefix, 1, 20);
    expect(await here.admit('t', 'r0')).to.equal(true);
    for (let i = 1; i <= 5; i++) await here.admit('t', `r${i}`);
    // another process fills the line: this one, which saw 5 waiting, does not ask (that is the cap's slack)
    for (let i = 6; i <= 20; i++) await elsewhere.admit('t', `r${i}`);
    expect(await here.hasRoom('t')).to.equal(true);
    expect(await elsewhere.hasRoom('t'), 'it saw 20 waiting: it asks, and the line is full').to.equal(false);
    // once this process sees the line near the cap (its own admission tells it), it asks too
    await here.admit('t', 'r21');
    expect(await here.hasRoom('t')).to.equal(false);
    // runs leave the line: the next look finds room
    for (const id of ['r1', 'r2', 'r3']) await elsewhere.release('t', id);
    expect(await here.hasRoom('t')).to.equal(true);
    expect(await here.hasRoom('u'), 'another tenant').to.equal(true);
  });

  it('names apart, once admitted, a run put in line whose job waits already (held at its start): its job is promoted, not added', async () => {
    const slots = createTenantSlots(redis, prefix, 1);
    expect(await slots.admit('t', 'r1')).to.equal(true);
    expect(await slots.admit('t', 'held', true)).to.equal(false);
    expect(await slots.admit('t', 'fresh')).to.equal(false);
    expect(await slots.release('t', 'r1')).to.deep.equal({ admitted: [], parked: ['held'] });
    expect(await slots.release('t', 'held')).to.deep.equal({ admitted: ['fresh'], parked: [] });
    // a parked run that leaves the line (canceled) is no longer parked
    expect(await slots.admit('t', 'gone', true)).to.equal(false);
    await slots.release('t', 'gone');
    expect(await redis.exists(`${prefix}:tenant:t:parked`)).to.equal(0);
  });

  it('takes over a line kept as a list, in its order, at the first operation on it', async () => {
    const slots = createTenantSlots(redis, prefix, 1);
    await redis.sadd(`${prefix}:tenant:t:running`, 'r0');
    await redis.rpush(`${prefix}:tenant:t:pending`, 'r1', 'r2', 'r3');
    expect(await slots.admit('t', 'r4')).to.equal(false);
    expect(await redis.type(`${prefix}:tenant:t:pending`)).to.equal('zset');
    expect(await slots.line('t')).to.deep.equal(['r1', 'r2', 'r3', 'r4']);
    expect(await slots.release('t', 'r0')).to.deep.equal({ admitted: ['r1'], parked: [] });
    // reading converts too (the reconciler may be first to touch a line after an upgrade)
    await redis.del(`${prefix}:tenant:t:pending`);
    await redis.rpush(`${prefix}:tenant:t:pending`, 'a', 'b');
    expect(await slots.waiting('t')).to.equal(2);
    expect((await slots.holders()).get('t')!.waiting).to.deep.equal(new Set(['a', 'b']));
  });

  it('finds the tenants holding slots from their list, looking through the keyspace only at its first pass (not at every pass)', async () => {
    const scan = sinon.spy(redis, 'scan');
    // what an earlier version left: a tenant's slot and line with no list of tenants
    await redis.sadd(`${prefix}:tenant:old:running`, 'o1');
    await redis.zadd(`${prefix}:tenant:old:pending`, 1, 'o2');
    const slots = createTenantSlots(redis, prefix, 1);
    expect(await slots.admit('t', 'r1')).to.equal(true);
    const first = await slots.holders();
    expect(scan.called, 'the first pass looks through the keyspace').to.equal(true);
    expect([...first.keys()].sort()).to.deep.equal(['old', 't']);
    expect((await redis.smembers(`${prefix}:slot-tenants`)).sort(), 'what the look found is listed').to.deep.equal(['old', 't']);
    scan.resetHistory();
    // a tenant admitted since, one restored by the reconciler (Redis lost its slot), one in line: found without a scan
    expect(await slots.admit('u', 'u1')).to.equal(true);
    await slots.restore('v', 'v1');
    expect(await slots.admit('t', 'r2')).to.equal(false);
    const later = await slots.holders();
    expect(scan.called, 'later passes read the list').to.equal(false);
    expect([...later.keys()].sort()).to.deep.equal(['old', 't', 'u', 'v']);
    expect([...later.get('t')!.waiting]).to.deep.equal(['r2']);
    // a tenant whose runs have all left is no longer listed: its last release takes it out
    await slots.release('t', 'r1');
    expect(await redis.sismember(`${prefix}:slot-tenants`, 't'), "r2 was admitted in r1's place").to.equal(1);
    await slots.release('t', 'r2');
    await slots.release('old', 'o1');
    await slots.release('old', 'o2');
    expect((await redis.smembers(`${prefix}:slot-tenants`)).sort()).to.deep.equal(['u', 'v']);
    // listed with nothing held (its last run left between a look and its listing): the pass takes it out
    await redis.sadd(`${prefix}:slot-tenants`, 'gone');
    expect([...(await slots.holders()).keys()].sort()).to.deep.equal(['u', 'v']);
    expect((await redis.smembers(`${prefix}:slot-tenants`)).sort()).to.deep.equal(['u', 'v']);
    expect(scan.called).to.equal(false);
  });

  it('keeps each operation cheap with a long line: no scan of the line per admission or release', async () => {
    /** A tenant whose line is `n` long (one run admitted, `n` waiting) */
    const lineOf = async (n: number) => {
      const tenant = `t${n}`;
      const slots = createTenantSlots(redis, prefix, 1);
      await slots.admit(tenant, 'first');
      for (let i = 0; i < n; i += 1000)
        await Promise.all(Array.from({ length: Math.min(1000, n - i) }, (_, j) => slots.admit(tenant, `r${String(i + j).padStart(6, '0')}`)));
      return { tenant, slots, n };
    };
    /** The time of 300 admissions and 300 releases of runs at the end of a line; each round leaves it as it was */
    const round = async ({ tenant, slots, n }: Awaited<ReturnType<typeof lineOf>>) => {
      const started = performance.now();
      for (let i = 0; i < 300; i++) await slots.admit(tenant, `late${i}`);
      for (let i = 0; i < 300; i++) await slots.release(tenant, `late${299 - i}`);
      const took = performance.now() - started;
      expect(await slots.waiting(tenant)).to.equal(n);
      return took;
    };
    const short = await lineOf(10);
    const long = await lineOf(40_000);
    await round(short); // warm
    // the rounds alternate, so a busy moment of the machine (CI runs test files side by side) falls on both
    // lines alike; the best of five of each is compared
    const shortRounds: number[] = [];
    const longRounds: number[] = [];
    for (let i = 0; i < 5; i++) {
      shortRounds.push(await round(short));
      longRounds.push(await round(long));
    }
    const [shortBest, longBest] = [Math.min(...shortRounds), Math.min(...longRounds)];
    // a scan of a 40,000-long line per operation (LPOS, LREM) costs about a millisecond each: over ten times the
    // round trip
    expect(longBest / shortBest, `${longBest.toFixed(1)} ms against ${shortBest.toFixed(1)} ms`).to.be.below(3);
  });
});
