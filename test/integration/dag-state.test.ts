// The task DAG's state in Redis (engine/sessions/dag-state.ts), on the real Redis: its scripts block every
// other client while they run, so their cost must grow with the dependencies they touch, not their square.
import { expect } from 'chai';
import { Redis } from 'ioredis';
import { dagStateOf } from '../../engine/sessions/dag-state.js';
import { deleteRedisPrefix, testRedisUrl, uniquePrefix } from '../support/harness.js';

describe('the task DAG’s state in Redis', () => {
  let redis: Redis;
  const prefix = uniquePrefix();

  before(() => {
    redis = new Redis(testRedisUrl(), { maxRetriesPerRequest: null });
  });
  after(async () => {
    await deleteRedisPrefix(prefix);
    redis.disconnect();
  });

  /** A session whose first 99 tasks have succeeded. */
  async function endedSession(session: string): Promise<string[]> {
    const dag = dagStateOf(redis, prefix);
    const ended = Array.from({ length: 99 }, (_, i) => `done-${i}`);
    await dag.add(
      session,
      ended.map((id) => ({ id, depends_on: [], trigger_rule: 'all_success' as const })),
    );
    for (const id of ended) await dag.complete(session, id, 'succeeded');
    return ended;
  }

  it('adds 451 tasks of 100 dependencies each, 99 of them ended, without holding Redis for long, and releases them once', async () => {
    const dag = dagStateOf(redis, prefix);
    const session = `s-${Date.now()}-a`;
    const ended = await endedSession(session);
    const waiting = Array.from({ length: 450 }, (_, i) => ({ id: `t-${i}`, depends_on: [...ended, 'first'], trigger_rule: 'all_success' as const }));
    const started = performance.now();
    const change = await dag.add(session, [{ id: 'first', depends_on: [], trigger_rule: 'all_success' }, ...waiting]);
    const ms = performance.now() - started;
    // the script that decoded and rewrote a task's list once a dependency took 770-950 ms here, this one 30-70 ms
    expect(ms, `the add held Redis ${Math.round(ms)} ms`).to.be.below(250);
    expect(change.ready).to.deep.equal(['first']);
    // each waits on `first` alone: its end releases all 450, once
    const released = await dag.complete(session, 'first', 'succeeded');
    expect(released?.ready).to.have.length(450);
    expect(await dag.complete(session, 'first', 'succeeded')).to.equal(null);
    expect(await redis.hlen(`${prefix}:dag:{${session}}:sat`)).to.equal(0);
  });

  it('walks 99 lost ends into 300 dependents of them all in one add, without holding Redis for long', async () => {
    const dag = dagStateOf(redis, prefix);
    const session = `s-${Date.now()}-b`;
    const deps = Array.from({ length: 99 }, (_, i) => `dep-${i}`);
    await dag.add(
      session,
      deps.map((id) => ({ id, depends_on: [], trigger_rule: 'all_done' as const })),
    );
    const kids = Array.from({ length: 300 }, (_, i) => ({ id: `k-${i}`, depends_on: [...deps, 'last'], trigger_rule: 'all_done' as const }));
    await dag.add(session, [{ id: 'last', depends_on: [], trigger_rule: 'all_done' }, ...kids]);
    // Redis back from older data: the store has the 99 ended, Redis has them running; one add learns them all,
    // and its walk satisfies each of the 300 dependents 99 times
    const started = performance.now();
    const change = await dag.add(
      session,
      [],
      deps.map((id) => ({ id, status: 'failed' as const })),
    );
    const ms = performance.now() - started;
    expect(ms, `the add held Redis ${Math.round(ms)} ms`).to.be.below(250);
    expect(change).to.deep.equal({ ready: [], upstreamFailed: [] });
    const sat = JSON.parse((await redis.hget(`${prefix}:dag:{${session}}:sat`, 'k-0'))!) as string[];
    expect(sat).to.have.members(deps);
    expect((await dag.complete(session, 'last', 'failed'))?.ready).to.have.length(300);
  });
});
