// The event log: every state change is appended to a Redis Stream per scope (a run session, a
// session trace, an audit), capped by length. One EventHub per process reads the streams its
// subscribers watch with a single blocking connection and fans events out in memory, so a thousand
// SSE clients of one run cost one XREAD, not a thousand.
import type { NewEvent, ServiceEvent } from './event-types.js';
import type { Redis } from './redis.js';
import { redisBatch } from './redis-batch.js';
import { redisOrUnavailable } from './redis.js';

const TTL_SECONDS = 7 * 24 * 3600;

/** Compares stream ids ("ms-seq") numerically. */
export function compareIds(a: string, b: string): number {
  const [am = 0, as = 0] = a.split('-').map(Number);
  const [bm = 0, bs = 0] = b.split('-').map(Number);
  return am - bm || as - bs;
}

export type EventLog = {
  key(scope: string): string;
  /**
   * Appends an event. Appends are sent in the order they are called (the call itself, not its promise,
   * takes the event's place), so a caller may ask for several before waiting for any.
   */
  append(scope: string, event: NewEvent, outbox?: EventOutbox): Promise<ServiceEvent>;
  /**
   * Appends an event that spends `budget.bytes` of a budget (a counter under `budget.name`, kept
   * `budget.ttlSeconds`), in the same script: taken while the budget has room; past it, the first such
   * event of a scope is replaced by `budget.notice` (to say why nothing more comes), and from then on none
   * of the scope's is appended (null), so what was taken stays a prefix. Ordered with append's.
   */
  appendWithin(scope: string, event: NewEvent, budget: EventBudget): Promise<ServiceEvent | null>;
  /** events after `afterId` (exclusive), oldest first */
  after(scope: string, afterId: string, count?: number): Promise<ServiceEvent[]>;
  /** Up to `count` events after `afterId` (exclusive) and up to `before` (`+`, an id, or `(id` for exclusive), newest first. */
  newestFirst(scope: string, afterId: string, before: string, count: number): Promise<ServiceEvent[]>;
  /**
   * When events after `afterId` are no longer kept (the log keeps its last EVENTS_KEPT), the id of the
   * first event still kept (`0-0` when none is); null when nothing after `afterId` was dropped.
   */
  droppedAfter(scope: string, afterId: string): Promise<string | null>;
  /** The id of the newest event the log holds; `0-0` when it holds none. */
  lastId(scope: string): Promise<string>;
};

/**
 * A note kept with an appended event, in the same script: the event's place (outboxMember) in the sorted
 * set `key`, scored `at` (ms), until whoever the event is offered to is done with it (the notifications: their
 * deliveries stored) and removes it. An event whose process died before that is found there by a reconciler.
 */
export type EventOutbox = { key: string; at: number };

export type EventBudget = { name: string; bytes: number; limit: number; ttlSeconds: number; notice: NewEvent };

/** Events anyAfter reads at a time. */
const ANY_AFTER_PAGE = 20;

/** How many events a log keeps at least (it trims in steps of TRIM_STEP): the oldest go first. */
export const EVENTS_KEPT = 10_000;

/**
 * What an event carries of a value the run's record keeps whole (a step's arguments, a provider's answer, a
 * model turn, a vibe run's changed paths): at most this many bytes of JSON, cut past it. The event log lives in
 * the shared Redis, and a step's arguments alone may be 1 MB.
 */
export const EVENT_VALUE_MAX_BYTES = 4 * 1024;

function parseEntries(entries: [string, string[]][]): ServiceEvent[] {
  return entries.map(([id, fields]) => ({ id, ...(JSON.parse(fields[1]!) as Omit<ServiceEvent, 'id'>) }) as ServiceEvent);
}

// append and refresh the stream's TTL; appends go in the engine's Redis batch, so all events asked for
// in one turn of the event loop take one round trip, in the order they were asked for. Once the log holds
// TRIM_STEP more than it keeps, the oldest go, and the newest id dropped is noted as the stream's
// max-deleted-entry-id (Redis notes it for XDEL only, not for a trim), which droppedAfter reads. Redis
// before 7.0 has no such field (XSETID takes no MAXDELETEDID): there the note fails alone, not the append,
// and a reader is not told of a trim
const TRIM_STEP = 100;
const appendOf = (kept: number, body = 'ARGV[1]', answer = 'id', outbox = '') => `local id = redis.call('XADD', KEYS[1], '*', 'e', ${body})
redis.call('EXPIRE', KEYS[1], ${TTL_SECONDS})${outbox}
local over = redis.call('XLEN', KEYS[1]) - ${kept}
if over >= ${TRIM_STEP} then
  local dropped = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', over)
  redis.call('XTRIM', KEYS[1], 'MAXLEN', ${kept})
  redis.pcall('XSETID', KEYS[1], id, 'MAXDELETEDID', dropped[#dropped][1])
end
return ${answer}`;

// KEYS[2]: the budget's counter of bytes; KEYS[3]: the scope's note that it was told the budget is spent,
// kept as long as its log (a day's budget ends, the scope's output does not come back after its notice).
// ARGV: the event, the notice, its bytes, the limit, the counter's TTL. Answers {id, 1 when the notice
// was appended}, or 0 when nothing was (a batch operation answers something, never nil).
const appendWithinOf = (kept: number) => `local body, notice = ARGV[1], 0
if redis.call('EXISTS', KEYS[3]) == 1 then return 0 end
if tonumber(redis.call('GET', KEYS[2]) or '0') + tonumber(ARGV[3]) > tonumber(ARGV[4]) then
  redis.call('SET', KEYS[3], 1, 'EX', ${TTL_SECONDS})
  body, notice = ARGV[2], 1
else
  redis.call('INCRBY', KEYS[2], ARGV[3])
  redis.call('EXPIRE', KEYS[2], ARGV[5])
end
${appendOf(kept, 'body', '{id, notice}')}`;

// KEYS[2]: the outbox; ARGV[2]: the time (ms) it scores the event with; ARGV[3]: the event's scope. The
// member is the scope and the id, a line apart (outboxMember)
const OUTBOX_NOTE = `
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[3] .. '\\n' .. id)`;

/** An event's member in an outbox (EventOutbox), and back. */
export const outboxMember = (scope: string, id: string) => `${scope}\n${id}`;
export function outboxEntry(member: string): { scope: string; id: string } {
  const cut = member.lastIndexOf('\n');
  return { scope: member.slice(0, cut), id: member.slice(cut + 1) };
}

/** The Redis key of a scope's event log under a queue prefix (what else drops a scope's data drops it too). */
export const eventLogKey = (prefix: string, scope: string) => `${prefix}:events:${scope}`;

export function createEventLog(redis: Redis, prefix: string, clock: { now(): Date } = { now: () => new Date() }, kept = EVENTS_KEPT): EventLog {
  const key = (scope: string) => eventLogKey(prefix, scope);
  const batch = redisBatch(redis);
  const append = `event.append.${kept}`;
  batch.define(append, { keys: 1, args: 1, lua: appendOf(kept) });
  const appendNoted = `event.append-noted.${kept}`;
  batch.define(appendNoted, { keys: 2, args: 3, lua: appendOf(kept, 'ARGV[1]', 'id', OUTBOX_NOTE) });
  const appendWithin = `event.append-within.${kept}`;
  batch.define(appendWithin, { keys: 3, args: 5, lua: appendWithinOf(kept) });
  return {
    key,
    async append(scope, event, outbox) {
      const body = { ...event, at: clock.now().toISOString() };
      const id = await (outbox
        ? batch.call<string>(appendNoted, [key(scope), outbox.key], [JSON.stringify(body), outbox.at, scope])
        : batch.call<string>(append, [key(scope)], [JSON.stringify(body)]));
      return { id, ...body } as ServiceEvent;
    },
    async appendWithin(scope, event, budget) {
      const at = clock.now().toISOString();
      const [body, notice] = [
        { ...event, at },
        { ...budget.notice, at },
      ];
      const taken = await batch.call<[string, number] | 0>(
        appendWithin,
        [key(scope), `${prefix}:budget:${budget.name}`, `${key(scope)}:over-budget`],
        [JSON.stringify(body), JSON.stringify(notice), budget.bytes, budget.limit, budget.ttlSeconds],
      );
      if (!Array.isArray(taken)) return null;
      return { id: taken[0], ...(taken[1] ? notice : body) } as ServiceEvent;
    },
    async after(scope, afterId, count = 1000) {
      const entries = (await redis.xrange(key(scope), `(${afterId}`, '+', 'COUNT', count)) as [string, string[]][];
      return parseEntries(entries);
    },
    async newestFirst(scope, afterId, before, count) {
      const entries = (await redis.xrevrange(key(scope), before, `(${afterId}`, 'COUNT', count)) as [string, string[]][];
      return parseEntries(entries);
    },
    async droppedAfter(scope, afterId) {
      // XINFO STREAM: a flat list of names and values; `max-deleted-entry-id` is the newest id trimmed away (see appendOf)
      const info = (await redis.call('XINFO', 'STREAM', key(scope)).catch(() => null)) as unknown[] | null;
      if (!info) return null; // no log (yet, or expired): nothing was dropped that a reader could have missed
      const field = (name: string) => info[info.indexOf(name) + 1];
      const dropped = field('max-deleted-entry-id');
      if (typeof dropped !== 'string' || dropped === '0-0' || compareIds(dropped, afterId) <= 0) return null;
      const first = field('first-entry') as [string, unknown] | null;
      return first?.[0] ?? '0-0';
    },
    async lastId(scope) {
      const newest = (await redis.xrevrange(key(scope), '+', '-', 'COUNT', 1)) as [string, string[]][];
      return newest[0]?.[0] ?? '0-0';
    },
  };
}

export type Subscription = { close(): void };

type Subscriber = { lastId: string; replaying: boolean; buffer: ServiceEvent[]; deliver: (e: ServiceEvent) => void };

/**
 * Fans events out to in-process subscribers. A subscriber gets every event after the id it names,
 * exactly once and in order: it is registered before its history is read, live events that arrive
 * meanwhile are buffered, and anything at or below what it has already seen is dropped.
 */
export class EventHub {
  private readonly scopes = new Map<string, { cursor: string; subs: Set<Subscriber> }>();
  private reader: Redis | undefined;
  private readerId: number | undefined;
  private running = false;
  private loop: Promise<void> | undefined;
  private wake: (() => void) | undefined;

  constructor(
    private readonly redis: Redis,
    private readonly log: EventLog,
  ) {}

  /** See EventLog.droppedAfter. Without Redis it is a 503 the client retries (redisOrUnavailable). */
  droppedAfter(scope: string, afterId: string): Promise<string | null> {
    return redisOrUnavailable(this.redis, 'reading the event log', () => this.log.droppedAfter(scope, afterId));
  }

  /** See EventLog.lastId. Without Redis it is a 503 the client retries (redisOrUnavailable), not a request held for the outage. */
  lastId(scope: string): Promise<string> {
    return redisOrUnavailable(this.redis, 'reading the event log', () => this.log.lastId(scope));
  }

  /** See EventLog.after: a page of the log, for a reader that reads it at its own pace. */
  after(scope: string, afterId: string, count: number): Promise<ServiceEvent[]> {
    return this.log.after(scope, afterId, count);
  }

  /**
   * True when the scope's log holds the event `id` and it matches: a reader's Last-Event-ID that was a
   * session trace's end. One read of one entry; an id that is not an entry's is false.
   */
  isAt(scope: string, id: string, match: (e: ServiceEvent) => boolean): Promise<boolean> {
    if (!/^\d+-\d+$/.test(id) || id === '0-0') return Promise.resolve(false);
    return redisOrUnavailable(this.redis, 'reading the event log', async () => {
      const [newest] = await this.log.newestFirst(scope, '0-0', id, 1);
      return newest?.id === id && match(newest);
    });
  }

  /**
   * True when an event after `afterId` (exclusive) in the scope's log matches. Asked before a stream is
   * opened: without Redis it is a 503 the client retries (redisOrUnavailable), not a request held open.
   */
  anyAfter(scope: string, afterId: string, match: (e: ServiceEvent) => boolean): Promise<boolean> {
    return redisOrUnavailable(this.redis, 'reading the event log', async () => {
      // newest first, a few at a time: what is looked for is a scope's end, among its last events, and a
      // page of a long log (its step.output events up to 400 KB each) is never held whole
      for (let before = '+'; ;) {
        const page = await this.log.newestFirst(scope, afterId, before, ANY_AFTER_PAGE);
        if (page.some(match)) return true;
        if (page.length < ANY_AFTER_PAGE) return false;
        before = `(${page.at(-1)!.id}`;
      }
    });
  }

  async subscribe(scope: string, afterId: string, deliver: (e: ServiceEvent) => void): Promise<Subscription> {
    const sub: Subscriber = { lastId: afterId, replaying: true, buffer: [], deliver };
    let entry = this.scopes.get(scope);
    if (!entry) {
      // the hub reads a new scope live from its current end; each subscriber replays what came before
      const [latest] = (await this.redis.xrevrange(this.log.key(scope), '+', '-', 'COUNT', 1)) as [string, string[]][];
      entry = this.scopes.get(scope) ?? { cursor: latest?.[0] ?? '0-0', subs: new Set() };
      this.scopes.set(scope, entry);
    }
    entry.subs.add(sub);
    const closed = { value: false };
    const close = () => {
      closed.value = true;
      const e = this.scopes.get(scope);
      e?.subs.delete(sub);
      if (e && e.subs.size === 0) this.scopes.delete(scope);
    };
    const emit = (e: ServiceEvent) => {
      if (closed.value || compareIds(e.id, sub.lastId) <= 0) return;
      sub.lastId = e.id;
      deliver(e);
    };
    sub.deliver = (e) => (sub.replaying ? sub.buffer.push(e) : emit(e));
    try {
      this.ensureReading();
      this.interrupt();
      for (;;) {
        const history = await this.log.after(scope, sub.lastId);
        history.forEach(emit);
        if (history.length < 1000) break;
      }
    } catch (err) {
      // a replay Redis refused (LOADING, BUSY, ...) leaves no subscriber behind, buffering its scope's events for good
      close();
      throw err;
    }
    sub.replaying = false;
    sub.buffer.splice(0).forEach(emit);
    return { close };
  }

  // Starts the read loop at once, with nothing to await: a start cannot fail, so no refused command can
  // leave the hub marked running with no loop, its subscribers getting their replay and never a live event.
  private ensureReading(): void {
    if (this.running) return;
    this.running = true;
    const reader = this.redis.duplicate({ connectionName: 'event-hub' });
    reader.on('error', () => {}); // the loop below sees failures and retries
    // interrupt and close unblock the reader by its client id, and each connection ioredis makes for it (it
    // reconnects, and resends the XREAD it was blocked in) is a new client with a new id: an id is forgotten
    // when its connection closes and asked for as the next one opens. CLIENT is one of the commands ioredis
    // sends before a connection is ready, so the answer comes ahead of the resent XREAD, not after its BLOCK.
    reader.on('close', () => {
      if (this.reader === reader) this.readerId = undefined;
    });
    reader.on('connect', () => this.askReaderId(reader));
    this.reader = reader;
    this.loop = this.read(reader);
  }

  // Redis may refuse to tell (BUSY while a script runs, a managed Redis that forbids CLIENT): the hub reads
  // all the same, and until the loop asks again and is told, a new scope waits out one BLOCK at most, and so
  // does close. Nobody awaits the answer: one asked as a connection opens is lost, never settled, if the
  // connection closes before it is ready.
  private askReaderId(reader: Redis): void {
    reader.client('ID').then(
      (id) => {
        if (this.reader === reader) this.readerId = Number(id);
      },
      () => {},
    );
  }

  /** Wakes the blocking XREAD so it picks up a scope just added. */
  private interrupt(): void {
    if (this.wake) this.wake();
    else if (this.readerId !== undefined) void this.redis.client('UNBLOCK', this.readerId).catch(() => {});
  }

  private async read(reader: Redis): Promise<void> {
    while (this.running) {
      // asked again when Redis refused it as the connection opened; sent ahead of the XREAD on the same
      // connection, so known before it blocks. A connection yet to open asks as it opens (ensureReading).
      if (this.readerId === undefined && reader.status === 'ready') this.askReaderId(reader);
      const scopes = [...this.scopes.entries()];
      if (scopes.length === 0) {
        await new Promise<void>((resolve) => (this.wake = resolve));
        this.wake = undefined;
        continue;
      }
      try {
        const keys = scopes.map(([s]) => this.log.key(s));
        const ids = scopes.map(([, e]) => e.cursor);
        const res = (await reader.xread('COUNT', 500, 'BLOCK', 1000, 'STREAMS', ...keys, ...ids)) as [string, [string, string[]][]][] | null;
        for (const [key, entries] of res ?? []) {
          const scope = scopes.find(([s]) => this.log.key(s) === key)?.[0];
          const entry = scope ? this.scopes.get(scope) : undefined;
          if (!entry) continue;
          const events = parseEntries(entries);
          entry.cursor = events[events.length - 1]?.id ?? entry.cursor;
          for (const e of events) for (const sub of entry.subs) sub.deliver(e);
        }
      } catch {
        if (!this.running) return;
        await new Promise((r) => setTimeout(r, 200));
      }
    }
  }

  async close(): Promise<void> {
    this.running = false;
    this.wake?.();
    if (this.readerId !== undefined) await this.redis.client('UNBLOCK', this.readerId).catch(() => {});
    await this.loop;
    this.reader?.disconnect();
    this.reader = undefined;
    this.readerId = undefined;
    this.scopes.clear();
  }
}
