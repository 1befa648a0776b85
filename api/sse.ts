// Server-sent events: `id:`, `event:`, `data:` lines, a heartbeat comment, resumable from
// Last-Event-ID, and closed after the terminal event. Events come from the process's EventHub. At
// each heartbeat the request's credential is checked again: a stream ends once its key is revoked or
// expired, or its session has ended (the client's reconnect is then refused with a 401).
import type { Request, Response } from 'express';
import { compareIds, EVENTS_KEPT, ValidationError, withTimeout, type EventHub, type Scope, type ServiceEvent } from '../engine/platform/index.js';

/** How long a stream waits to learn whether its reader missed trimmed events. */
const NOTICE_DEADLINE_MS = 1000;

/** The open streams of an app, so shutdown can end them: clients resume elsewhere with Last-Event-ID. */
export class OpenStreams {
  private readonly ends = new Set<() => void>();
  private closed = false;
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
  hub: EventHub;
  /** which log to read, and which event ends the stream */
  scope: Scope;
  afterId: string;
  heartbeatMs: number;
  status?: number;
  headers?: Record<string, string>;
  /**
   * The scope's last event is in the log (its run or session has ended): a client that has already
   * seen it is answered 204, which tells EventSource to stop reconnecting, instead of an empty stream
   * held open for good.
   */
  ended?: boolean;
};

export function lastEventIdOf(req: Request): string {
  const header = req.headers['last-event-id'];
  const query = (req.query as { last_event_id?: string }).last_event_id;
  return (typeof header === 'string' && header) || query || '0-0';
}

export async function streamEvents(req: Request, res: Response, opts: SseOptions): Promise<void> {
  // a client gone while the route prepared (an audit started, a run stored) gets nothing, and holds nothing
  if (req.socket.destroyed) return;
  if (opts.ended && !(await opts.hub.anyAfter(opts.scope.stream, opts.afterId, (e) => opts.scope.isLast(e)))) {
    res.status(204).end();
    return;
  }
  // the log keeps its last events only: a reader whose replay would start before them (a first look at a
  // long stream, a resume from an old id) is told what it missed, ahead of what is still there (a notice,
  // not an event of the log: it has no id, so a reconnect is unchanged). Asked before anything is held
  // open, and bounded: a Redis that does not answer costs the notice, not the stream
  const [firstKept, newest] = await Promise.all([
    withTimeout(opts.hub.droppedAfter(opts.scope.stream, opts.afterId), NOTICE_DEADLINE_MS, 'the log answered').catch(() => null),
    withTimeout(opts.hub.lastId(opts.scope.stream), NOTICE_DEADLINE_MS, 'the log answered').catch(() => null),
  ]);
  // an id after every event of the log was never one of its events: every event to come (the scope's end
  // included) would be taken as seen, and the stream held open for good
  if (newest && newest !== '0-0' && opts.afterId !== '0-0' && compareIds(opts.afterId, newest) > 0)
    throw new ValidationError('Last-Event-ID is after the last event of this stream', [
      { path: '/header/last-event-id', message: `must be an id this stream sent (its newest is ${newest})` },
    ]);
  if (req.socket.destroyed) return;
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
    return;
  }
  res.flushHeaders();
  res.write('retry: 2000\n\n');
  if (firstKept)
    res.write(
      `event: stream.truncated\ndata: ${JSON.stringify({
        type: 'stream.truncated',
        after: opts.afterId,
        first_kept: firstKept === '0-0' ? null : firstKept,
        message: `events after ${opts.afterId} were dropped (the stream keeps its last ${EVENTS_KEPT}); read the resource for its state`,
      })}\n\n`,
    );
  let ended = false;
  let sub: { close(): void } | undefined;
  const heartbeat = setInterval(() => {
    res.write(': heartbeat\n\n');
    // a store or Redis that does not answer is not a revocation: the stream goes on, and asks again
    req.stillAuthorized?.().then(
      (ok) => ok || end(),
      () => undefined,
    );
  }, opts.heartbeatMs);
  const end = () => {
    if (ended) return;
    ended = true;
    clearInterval(heartbeat);
    forget();
    sub?.close();
    res.end();
  };
  const forget = opts.streams.add(end);
  req.on('close', end);
  // after the scope's last event nothing more is sent, even what arrived in the same read
  let last = false;
  const send = (e: ServiceEvent) => {
    if (ended || last) return;
    res.write(`id: ${opts.scope.eventId?.(e) ?? e.id}\nevent: ${opts.scope.eventName?.(e) ?? e.type}\ndata: ${JSON.stringify(e)}\n\n`);
    if (opts.scope.isLast(e)) {
      last = true;
      setImmediate(end);
    }
  };
  sub = await opts.hub.subscribe(opts.scope.stream, opts.afterId, send);
  if (ended) sub.close();
}
