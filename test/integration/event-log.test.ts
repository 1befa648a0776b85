// The event log (engine/platform/events.ts) on the real Redis: it keeps its last events, trims the oldest
// in steps, and knows, for a reader who resumes after an id, whether events after it were dropped.
import { expect } from 'chai';
import { Redis } from 'ioredis';
import { createEventLog, EventHub, ServiceUnavailableError, type EventLog } from '../../engine/platform/index.js';
import { deleteRedisPrefix, eventually, testRedisUrl, uniquePrefix } from '../support/harness.js';

describe('event log', function () {
  const prefix = uniquePrefix();
  let redis: Redis;
  let log: EventLog;
  const KEPT = 5;
  const append = (scope: string, n: number) =>
    Promise.all(Array.from({ length: n }, (_, i) => log.append(scope, { type: 'run.progress', tenant_id: 't', data: { i } } as never)));

  before(() => {
    redis = new Redis(testRedisUrl(), { maxRetriesPerRequest: null });
    log = createEventLog(redis, prefix, undefined, KEPT);
  });
  // A connection for a hub, whose reader (the connection the hub duplicates from it) is a real one, named
  // with this run's prefix so that a test finds it among the clients of a Redis other tests share;
  // `refuseId` has its first CLIENT ID refused, as Redis refuses it while a script runs.
  const readerName = `event-hub-${prefix}`;
  const hubRedis = (opts: { refuseId?: boolean } = {}) => {
    const source = new Redis(testRedisUrl(), { maxRetriesPerRequest: null });
    const refused = { count: 0 };
    const duplicate = source.duplicate.bind(source);
    source.duplicate = (options) => {
      const reader = duplicate({ ...options, connectionName: readerName });
      const client = reader.client.bind(reader) as (...args: unknown[]) => Promise<unknown>;
      reader.client = ((...args: unknown[]) => {
        if (opts.refuseId && refused.count === 0 && String(args[0]).toUpperCase() === 'ID') {
          refused.count++;
          return Promise.reject(new Error('BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.'));
        }
        return client(...args);
      }) as typeof reader.client;
      return reader;
    };
    return { source, refused };
  };
  const readerIds = async () =>
    String(await redis.client('LIST'))
      .split('\n')
      .filter((line) => line.includes(` name=${readerName} `))
      .map((line) => /^id=(\d+)/.exec(line)![1]!);
  after(async () => {
    await deleteRedisPrefix(prefix);
    redis.disconnect();
  });

  it('keeps every event until it holds a trim step more than it keeps, then only the last it keeps', async () => {
    const ids = (await append('a', 104)).map((e) => e.id);
    expect(await redis.xlen(log.key('a'))).to.equal(104);
    expect(await log.droppedAfter('a', '0-0')).to.equal(null);
    ids.push((await append('a', 1))[0]!.id);
    const kept = await log.after('a', '0-0');
    expect(kept.map((e) => e.id)).to.deep.equal(ids.slice(-KEPT));
    expect(kept.map((e) => (e.data as unknown as { i: number }).i)).to.deep.equal([100, 101, 102, 103, 0]);
  });

  it('tells a reader who resumes from before the newest event dropped where the log now begins', async () => {
    const ids = (await append('b', 110)).map((e) => e.id);
    const firstKept = ids[100]!; // the 105th append dropped 100; 5 more since
    const kept = await log.after('b', '0-0');
    expect(kept[0]!.id).to.equal(firstKept);
    // from the start, or from any event before the newest dropped: told where the log begins
    expect(await log.droppedAfter('b', '0-0')).to.equal(firstKept);
    expect(await log.droppedAfter('b', ids[0]!)).to.equal(firstKept);
    expect(await log.droppedAfter('b', ids[98]!)).to.equal(firstKept);
    // from the newest dropped (it read everything up to the trim) or later: nothing was missed
    expect(await log.droppedAfter('b', ids[99]!)).to.equal(null);
    expect(await log.droppedAfter('b', firstKept)).to.equal(null);
    expect(await log.droppedAfter('b', ids.at(-1)!)).to.equal(null);
  });

  it('has nothing dropped for a log that does not exist (never written, or expired)', async () => {
    expect(await log.droppedAfter('none', '0-0')).to.equal(null);
  });

  it('keeps no subscriber of a hub whose replay Redis refused: it would buffer its scope’s events for good', async () => {
    await append('h', 3);
    let refuse = true;
    const refusing = {
      ...log,
      after: (scope: string, afterId: string, count?: number) => {
        if (refuse) return Promise.reject(new Error('LOADING Redis is loading the dataset in memory'));
        return log.after(scope, afterId, count);
      },
    } as EventLog;
    const hub = new EventHub(redis, refusing);
    const scopes = (hub as unknown as { scopes: Map<string, unknown> }).scopes;
    try {
      const seen: string[] = [];
      let failed: unknown;
      await hub.subscribe('h', '0-0', (e) => seen.push(e.id)).catch((err: unknown) => (failed = err));
      expect(String(failed)).to.contain('LOADING');
      expect(scopes.size, 'the scope the refused replay read').to.equal(0);
      // the next reader (the client's reconnect) gets the whole log, and live events after it
      refuse = false;
      const sub = await hub.subscribe('h', '0-0', (e) => seen.push(e.id));
      expect(seen).to.have.length(3);
      await append('h', 1);
      for (let i = 0; i < 100 && seen.length < 4; i++) await new Promise((r) => setTimeout(r, 20));
      expect(seen).to.have.length(4);
      sub.close();
      expect(scopes.size).to.equal(0);
    } finally {
      await hub.close();
    }
  });

  it('reads live events for later subscribers when Redis refused to tell its reader’s client id', async () => {
    await append('i', 2);
    const { source, refused } = hubRedis({ refuseId: true });
    const hub = new EventHub(source, log);
    try {
      // the first subscriber's stream may end with the refusal (its client reconnects): the hub must not
      // be left running with no loop, every later stream getting its replay and then only heartbeats
      await hub
        .subscribe('i', '0-0', () => {})
        .then(
          (first) => first.close(),
          () => {},
        );
      const seen: string[] = [];
      const sub = await hub.subscribe('i', '0-0', (e) => seen.push(e.id));
      expect(seen).to.have.length(2);
      const [live] = await append('i', 1);
      await eventually(() => seen.includes(live!.id), 'the live event', 3000);
      expect(refused.count, 'CLIENT ID refused').to.equal(1);
      sub.close();
    } finally {
      await hub.close();
      source.disconnect();
    }
  });

  it('wakes its reader by the client id of its current connection, after Redis dropped the one before', async () => {
    const { source } = hubRedis();
    const hub = new EventHub(source, log);
    try {
      const sub = await hub.subscribe('j', '0-0', () => {});
      const killed = await eventually(async () => (await readerIds())[0], 'the reader to connect', 3000);
      await redis.client('KILL', 'ID', killed);
      await eventually(async () => (await readerIds()).some((id) => id !== killed), 'the reader to reconnect', 3000);
      await new Promise((r) => setTimeout(r, 100)); // its XREAD, resent, blocks again
      // a new scope is read at once (interrupt unblocks the XREAD), not after the BLOCK's second
      const seen: string[] = [];
      const other = await hub.subscribe('j2', '0-0', (e) => seen.push(e.id));
      const started = Date.now();
      const [live] = await append('j2', 1);
      await eventually(() => seen.includes(live!.id), 'the live event', 3000);
      expect(Date.now() - started, 'ms to the live event').to.be.below(500);
      other.close();
      sub.close();
      const closing = Date.now();
      await hub.close();
      expect(Date.now() - closing, 'ms to close').to.be.below(500);
    } finally {
      await hub.close();
      source.disconnect();
    }
  });

  it('answers a 503 when Redis does not tell in time whether a reader missed trimmed events, rather than no notice', async () => {
    const stalled = { ...log, droppedAfter: () => new Promise<string | null>(() => undefined) } as EventLog;
    const hub = new EventHub(redis, stalled);
    try {
      const err = await hub.droppedAfter('b', '0-0').catch((e: unknown) => e);
      expect(err).to.be.instanceOf(ServiceUnavailableError);
    } finally {
      await hub.close();
    }
  });
});

describe('event log: appends within a budget', function () {
  const prefix = uniquePrefix();
  let redis: Redis;
  let log: EventLog;
  const output = (scope: string, text: string) =>
    ({ type: 'step.output', tenant_id: 't', session_id: scope, data: { index: 0, stream: 'stdout', text } }) as never;
  const within = (scope: string, text: string) =>
    log.appendWithin(scope, output(scope, text), {
      name: 'output:t',
      bytes: Buffer.byteLength(text),
      limit: 10,
      ttlSeconds: 60,
      notice: output(scope, '[spent]'),
    });

  before(() => {
    redis = new Redis(testRedisUrl(), { maxRetriesPerRequest: null });
    log = createEventLog(redis, prefix);
  });
  after(async () => {
    await deleteRedisPrefix(prefix);
    redis.disconnect();
  });

  it('takes events while the budget has room; past it, each scope is told once, and nothing more is appended', async () => {
    const texts = async (scope: string) => (await log.after(scope, '0-0')).map((e) => (e.data as unknown as { text: string }).text);
    // asked for together, in one round trip: taken in the order asked
    const answers = await Promise.all(['abcd', 'efgh', 'ijk', 'lm', 'no'].map((t) => within('a', t)));
    expect(answers.map((e) => (e ? (e.data as unknown as { text: string }).text : null))).to.deep.equal(['abcd', 'efgh', '[spent]', null, null]);
    expect(await texts('a')).to.deep.equal(['abcd', 'efgh', '[spent]']);
    // 'lm' would fit the 2 bytes left, but a scope told the budget is spent gets nothing more: its output stays a prefix
    expect(await within('b', 'xyz')).to.deep.include({ type: 'step.output' });
    expect(await texts('b')).to.deep.equal(['[spent]']);
    expect(await within('b', 'x')).to.equal(null);
    // events outside the budget are not held by it
    await log.append('a', output('a', 'plain'));
    expect((await texts('a')).at(-1)).to.equal('plain');
    const budget = `${prefix}:budget:output:t`;
    expect(await redis.get(budget)).to.equal('8');
    expect(await redis.ttl(budget)).to.be.within(1, 60);
    // a new budget (the next day's): a scope told already still gets nothing, so its output stays a prefix
    const nextDay = (scope: string, text: string) =>
      log.appendWithin(scope, output(scope, text), { name: 'output:t:next', bytes: 1, limit: 10, ttlSeconds: 60, notice: output(scope, '[spent]') });
    expect(await nextDay('a', 'p')).to.equal(null);
    expect(await nextDay('c', 'q')).to.deep.include({ type: 'step.output' });
    expect(await texts('c')).to.deep.equal(['q']);
  });
});
