// Server-sent events: `id:`, `event:`, `data:` lines, a heartbeat comment, resumable from
// Last-Event-ID, and closed after the terminal event. Events come from the process's EventHub. Each
// second the request's credential is checked again: a stream ends once its key is revoked or expired,
// or its session has ended (the client's reconnect is then refused with a 401).
import type { Request, Response } from 'express';
import { compareIds, EVENTS_KEPT, RateLimitedError, ValidationError, type EventHub, type Scope, type ServiceEvent } from '../engine/platform/index.js';

/** How far ahead of this process's clock an event id may be (another process's, whose clock runs ahead). */
const FUTURE_ID_MARGIN_MS = 60_000;
/** What a stream holds for a reader beyond what its socket took, and what live events wait for it (see streamEvents). */
const BUFFERED_MAX_BYTES = 1024 * 1024;
/** Events read from the log at a time for a reader catching up: a step.output event may be 400 KB of JSON (64 KB of escaped text). */
const CATCH_UP_PAGE = 10;

/** How often an open stream checks again the key or sign-in that opened it. */
const AUTHORIZATION_RECHECK_MS = 1000;

/** How long a tenant at its streams' limit is told to wait before it opens another. */
const STREAMS_FULL_RETRY_SECONDS = 5;

/**
 * The open streams of an app, so shutdown can end them (clients resume elsewhere with Last-Event-ID), and
 * each tenant's count of them in this process, held to `maxPerTenant`: a stream holds a socket, a heartbeat
 * and up to two buffers of BUFFERED_MAX_BYTES for a reader that does not read.
 */
export class OpenStreams {
  private readonly ends = new Set<() => void>();
  private readonly perTenant = new Map<string, number>();
  private closed = false;
  constructor(private readonly maxPerTenant = Infinity) {}
  /**
   * A place for one more stream of the tenant, or a 429 when it has its limit open; the answer gives it back
   * (once). A route that starts work for a stream (a run, an audit) takes it first.
   */
  enter(tenantId: string): () => void {
    const n = this.perTenant.get(tenantId) ?? 0;
    if (n >= this.maxPerTenant)
      throw new RateLimitedError(
        `this tenant has ${n} event streams open on this server, the most it may (SERVICE_TENANT_MAX_STREAMS): close one first`,
        STREAMS_FULL_RETRY_SECONDS,
      );
    this.perTenant.set(tenantId, n + 1);
    let left = false;
    return () => {
      if (left) return;
      left = true;
      const now = (this.perTenant.get(tenantId) ?? 1) - 1;
      if (now > 0) this.perTenant.set(tenantId, now);
      else this.perTenant.delete(tenantId);
    };
  }
  /** A stream opened once all were closed (it was still being prepared) is ended at once: the server is closing. */
  add(end: () => void): () => void {
    if (this.closed) {
      queueMicrotask(end);
      return () => undefined;
    }
    this.ends.add(end);
    return () => this.ends.delete(end);
  }
  get size(): number {
    return this.ends.size;
  }
  closeAll(): void {
    this.closed = true;
    for (const end of [...this.ends]) end();
  }
}

export type SseOptions = {
  streams: OpenStreams;
  /** whose stream it is: a tenant holds a limited number open */
  tenantId: string;
  hub: EventHub;
  /** which log to read, and which event ends the stream */
  scope: Scope;
  afterId: string;
  heartbeatMs: number;
  status?: number;
  headers?: Record<string, string>;
  /**
   * Whether what the stream follows still exists, asked at each heartbeat: a stream whose scope is gone (an
   * audit whose report Redis lost) ends, rather than sending heartbeats for good. A failure to answer is not gone.
   * `lastSent`: the id of the last event this reader was sent.
   */
  stillThere?: (lastSent: string) => Promise<boolean>;
  /**
   * The scope's last event is in the log (its run or session has ended): a client that has already
   * seen it is answered 204, which tells EventSource to stop reconnecting, instead of an empty stream
   * held open for good.
   */
  ended?: boolean;
  /**
   * The tenant's place for this stream (`streams.enter`), when the route took it before it started the
   * stream's work (a run, an audit): two requests at once cannot both pass the limit and start work for a
   * stream one of them will not get. Without it the stream takes its own place.
   */
  place?: () => void;
  /**
   * The log was begun by this request (a run it just made): nothing of it can have been trimmed, and the reader
   * starts at its start, so the checks that ask Redis before the stream opens are skipped. While Redis is away
   * the stream opens at once and its events come when Redis does, rather than a 503 whose retry makes another run.
   */
  fresh?: boolean;
};

/** A Last-Event-ID header the request sends (it takes over from the query's last_event_id), or null. */
const lastEventIdHeader = (req: Request): string | null => {
  const header = req.headers['last-event-id'];
  return typeof header === 'string' && header ? header : null;
};

export function lastEventIdOf(req: Request): string {
  return lastEventIdHeader(req) ?? ((req.query as { last_event_id?: string }).last_event_id || '0-0');
}

export async function streamEvents(req: Request, res: Response, opts: SseOptions): Promise<void> {
  const leave = opts.place ?? opts.streams.enter(opts.tenantId);
  let open = false;
  try {
    open = await openStream(req, res, opts, leave);
  } finally {
    if (!open) leave();
  }
}

/** Answers the stream; true when it is open (its end gives back the tenant's place), false when it was answered at once. */
async function openStream(req: Request, res: Response, opts: SseOptions, leave: () => void): Promise<boolean> {
  // a client gone while the route prepared (an audit started, a run stored) gets nothing, and holds nothing
  if (req.socket.destroyed) return false;
  if (opts.ended && !(await opts.hub.anyAfter(opts.scope.stream, opts.afterId, (e) => opts.scope.isLast(e)))) {
    res.status(204).end();
    return false;
  }
  // the log keeps its last events only: a reader whose replay would start before them (a first look at a
  // long stream, a resume from an old id) is told what it missed, ahead of what is still there (a notice,
  // not an event of the log: it has no id, so a reconnect is unchanged). Asked before anything is held
  // open; a Redis that does not answer in time is a 503 the client retries, never a stream opened without
  // them (a gap it is not told of, or a Last-Event-ID from the future that would hold it open for good)
  const [firstKept, newest] = opts.fresh
    ? [null, '0-0']
    : await Promise.all([opts.hub.droppedAfter(opts.scope.stream, opts.afterId), opts.hub.lastId(opts.scope.stream)]);
  // an id from the future was never one of the log's events: every event to come (the scope's end included)
  // would be taken as seen, and the stream held open for good. The ids to come are times (Redis's clock): one
  // later than a minute from now is none of them. An id after the log's newest but not from the future is one
  // the log lost (Redis back from an older save, or a replica behind): the reader had it, and what comes after
  // it is sent (a 400 there was the end of an EventSource, which does not reconnect after one)
  if (opts.afterId !== '0-0' && Number(opts.afterId.split('-')[0]) > Date.now() + FUTURE_ID_MARGIN_MS)
    throw new ValidationError('Last-Event-ID is after the last event of this stream', [
      {
        path: lastEventIdHeader(req) !== null ? '/header/last-event-id' : '/query/last_event_id',
        message: newest === '0-0' ? 'must be an id this stream sent' : `must be an id this stream sent (its newest is ${newest})`,
      },
    ]);
  if (req.socket.destroyed) return false;
  res.status(opts.status ?? 200);
  res.set({
    'Content-Type': 'text/event-stream; charset=utf-8',
    'Cache-Control': 'no-cache, no-transform',
    Connection: 'keep-alive',
    'X-Accel-Buffering': 'no', // nginx: do not buffer the stream
    ...opts.headers,
  });
  // HEAD: the headers a GET would get, and the end at once (no stream is held open for no body)
  if (req.method === 'HEAD') {
    res.end();
    return false;
  }
  res.flushHeaders();
  res.write('retry: 2000\n\n');
  let ended = false;
  /** Tells the reader that events after `after` were trimmed from the log before it was sent them. */
  const truncated = (after: string, kept: string) =>
    !ended &&
    res.write(
      `event: stream.truncated\ndata: ${JSON.stringify({
        type: 'stream.truncated',
        after,
        first_kept: kept === '0-0' ? null : kept,
        message: `events after ${after} were dropped (the stream keeps its last ${EVENTS_KEPT}); read the resource for its state`,
      })}\n\n`,
    );
  // the first event kept that the reader was last told of (once a gap)
  let told = firstKept;
  if (firstKept) truncated(opts.afterId, firstKept);
  let sub: { close(): void } | undefined;
  // the key or sign-in that opened it, checked again each second (not each heartbeat, up to 300 s apart): a key
  // revoked or expired stops what reaches its stream within a second. A store or Redis that does not answer is not
  // a revocation: the stream goes on, and asks again; one check at a time
  let checking = false;
  const authorization = setInterval(() => {
    if (checking || !req.stillAuthorized) return;
    checking = true;
    req.stillAuthorized().then(
      (ok) => {
        checking = false;
        if (!ok) end();
      },
      () => (checking = false),
    );
  }, AUTHORIZATION_RECHECK_MS);
  const heartbeat = setInterval(() => {
    // a reader that is not reading has what it needs to know the stream is alive
    if (!congested()) res.write(': heartbeat\n\n');
    opts.stillThere?.(lastSent).then(
      (there) => there || end(),
      () => undefined,
    );
  }, opts.heartbeatMs);
  const end = () => {
    if (ended) return;
    ended = true;
    leave();
    clearInterval(heartbeat);
    clearInterval(authorization);
    forget();
    sub?.close();
    wake?.();
    res.end();
  };
  const forget = opts.streams.add(end);
  // the response's close, not the request's: a request whose body was read (a POST with stream: true) has
  // closed already, and would never tell that its client left
  res.on('close', end);
  // a write no guard stopped after the end ends this stream, not the process (an 'error' no one hears throws)
  res.on('error', end);

  // What a reader has not taken is held for it up to BUFFERED_MAX_BYTES, never more: a reader that does not
  // keep up (or does not read at all) would otherwise hold the whole log in this process's memory, once per
  // connection. Past that, nothing more is written until the socket drains, and what came meanwhile is read
  // again from the log, a page at a time, from the last event written (what is still kept; the events are
  // there, in order). Live events wait in `waiting`, bounded as well: when it overflows they are dropped and
  // read from the log too.
  const congested = () => res.writableLength > BUFFERED_MAX_BYTES;
  let lastSent = opts.afterId;
  // after the scope's last event nothing more is sent, even what arrived in the same read
  let last = false;
  let waiting: { e: ServiceEvent; frame: string }[] = [];
  let waitingBytes = 0;
  // the log has events this reader has not been sent and that are not in `waiting`: the replay, or an overflow
  let fromLog = newest !== '0-0' && compareIds(newest, opts.afterId) > 0;
  // counts overflows: a page read while one happened may miss what was dropped, and does not end the catch-up
  let overflows = 0;
  let pumping = false;
  let wake: (() => void) | undefined;

  const frameOf = (e: ServiceEvent) => `id: ${opts.scope.eventId?.(e) ?? e.id}\nevent: ${opts.scope.eventName?.(e) ?? e.type}\ndata: ${JSON.stringify(e)}\n\n`;
  const write = (e: ServiceEvent, frame = frameOf(e)) => {
    if (ended || last || compareIds(e.id, lastSent) <= 0) return;
    lastSent = e.id;
    res.write(frame);
    if (opts.scope.isLast(e)) {
      last = true;
      setImmediate(end);
    }
  };
  const drained = () =>
    new Promise<void>((resolve) => {
      wake = resolve;
      res.once('drain', resolve);
    }).finally(() => (wake = undefined));
  /** Writes what the reader has not had, in order, as fast as it reads. */
  const pump = async () => {
    if (pumping) return;
    pumping = true;
    try {
      while (!ended && !last) {
        if (congested()) {
          await drained();
          continue;
        }
        if (fromLog) {
          const seen = overflows;
          // a reader that fell behind (its socket full, or live events past what waits for it) may have been
          // passed by the log's trim meanwhile: told, never by a silent gap
          // asked after the page is read: a trim only takes the oldest, so nothing before the page was missed
          // unless it says so (asked before, a trim between the two would go untold)
          const page = await opts.hub.after(opts.scope.stream, lastSent, CATCH_UP_PAGE);
          const dropped = await opts.hub.droppedAfter(opts.scope.stream, lastSent);
          // the stream may have ended while the log was read (a key revoked, the process closing): nothing is
          // written after its end (a write after it was an error no one heard, which ended the process)
          if (ended || last) break;
          if (dropped && dropped !== told) truncated(lastSent, (told = dropped));
          let i = 0;
          // what the reader cannot take now is read again once it has (from the last event written)
          for (; i < page.length && !congested(); i++) write(page[i]!);
          // a short page written whole is the log's end: what came after it is in `waiting`, unless it overflowed meanwhile
          if (i === page.length && page.length < CATCH_UP_PAGE && seen === overflows) fromLog = false;
          continue;
        }
        const next = waiting.shift();
        if (!next) break;
        waitingBytes -= next.frame.length;
        write(next.e, next.frame);
      }
    } catch {
      // the log could not be read: the reader reconnects with Last-Event-ID and is sent the rest then
      end();
    } finally {
      pumping = false;
    }
  };
  const send = (e: ServiceEvent) => {
    if (ended || last) return;
    if (!fromLog && !pumping && !waiting.length && !congested()) return write(e);
    const frame = frameOf(e);
    waiting.push({ e, frame });
    waitingBytes += frame.length;
    if (waitingBytes > BUFFERED_MAX_BYTES) {
      waiting = [];
      waitingBytes = 0;
      fromLog = true;
      overflows++;
    }
    void pump();
  };
  // live from the log's newest event (what is before it is read at the reader's pace), or from the
  // reader's own when the log has nothing after it
  try {
    sub = await opts.hub.subscribe(opts.scope.stream, fromLog ? newest : opts.afterId, send);
  } catch {
    // its replay could not be read: the reader reconnects with Last-Event-ID and is sent the rest then
    end();
    return true;
  }
  if (ended) sub.close();
  else void pump();
  return true;
}
