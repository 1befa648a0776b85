// The command-line tool's HTTP client: one base URL and key, JSON in and out, problem+json errors turned
// into a CliError with the exit code CI scripts rely on, and a run's event stream followed across
// dropped connections (resumed with Last-Event-ID, so no line is lost or repeated).
import { createParser, type EventSourceMessage, type ParseError } from 'eventsource-parser';
import { visible } from './output.js';

/** Exit codes: documented in `automation-service --help` and the README. */
export const EXIT = { succeeded: 0, failed: 1, usage: 2, timedOut: 3, canceled: 4, unavailable: 5, interrupted: 130 } as const;

export class CliError extends Error {
  constructor(
    message: string,
    readonly exitCode: number,
  ) {
    super(message);
  }
}

/** A mistake in the command's own input found past commander's parsing (`gates run`'s folder, say): exit 2. */
export class UsageError extends Error {}

export type Problem = { title?: string; detail?: string; code?: string; status?: number; errors?: { path?: string; message?: string }[] };

/**
 * An answer of the service other than 2xx. A 429 (too many requests), or any answer that says when to ask
 * again (Retry-After: a 409 while the same Idempotency-Key's first request is still being handled), is the
 * service's state, not the command's mistake: 5, as a 5xx, which a CI step may retry.
 */
export class ApiError extends CliError {
  constructor(
    readonly status: number,
    readonly problem: Problem,
    /** the answer's Retry-After, in seconds, when it had one */
    readonly retryAfterSeconds?: number,
  ) {
    // every text of the answer is the server's (or a proxy's): shown, never obeyed by the terminal
    const text = (value: unknown) => visible(String(value ?? ''));
    const errors = (Array.isArray(problem.errors) ? problem.errors : []).map((e) => `\n  ${e?.path ? `${text(e.path)}: ` : ''}${text(e?.message)}`).join('');
    super(
      `${status} ${text(problem.code ?? problem.title ?? 'error')}: ${text(problem.detail ?? problem.title)}${errors}`,
      status >= 500 || status === 429 || retryAfterSeconds !== undefined ? EXIT.unavailable : EXIT.usage,
    );
  }
}

/** An answer's Retry-After in seconds (delta-seconds only); undefined without one. */
function retryAfterOf(res: Response): number | undefined {
  // (an empty one is none: Number('') is 0, which made a 400 a "retry at once", exit 5)
  const value = res.headers.get('retry-after')?.trim() ?? '';
  return /^\d{1,9}$/.test(value) ? Number(value) : undefined;
}

/** Answers worth trying again while following a stream: the service busy, restarting or behind a proxy that is. */
const RETRIED_STATUSES = new Set([429, 502, 503, 504]);
/** The longest Retry-After a follower waits out in one go. */
const RETRY_AFTER_MAX_MS = 60_000;

/** A URL as it may be printed: without a user name or password. */
function shownUrl(url: URL): string {
  const copy = new URL(url);
  copy.username = '';
  copy.password = '';
  return copy.toString();
}

/**
 * A redirect (3xx), never followed: fetch would send the request on, its body (a webhook secret, a run's
 * steps) and, within the origin, the API key, to wherever Location points, and take that address's answer
 * for the service's. 5, as an answer the tool cannot use; not retried while following a stream.
 */
export class RedirectError extends CliError {
  constructor(status: number, location: string | null, requested: URL, apiPath: string) {
    let to: URL | undefined;
    try {
      to = location ? new URL(location, requested) : undefined;
    } catch {
      // not a URL: named as it came
    }
    const where = to ? ` to ${shownUrl(to)}` : location ? ` to "${visible(location.slice(0, 200))}"` : ' without a Location';
    super(
      `the service at ${shownUrl(requested)} answered ${status}, a redirect${where}; requests are not sent on (they carry the API key and their body): ` +
        `set --url or SERVICE_URL to ${to ? baseOf(to, apiPath) : 'the service itself'}`,
      EXIT.unavailable,
    );
  }
}

/** A 2xx that is not an event stream where one was asked for: a proxy's page (a sign-in, an error), not the service. */
export class NotAStreamError extends CliError {
  constructor(status: number, type: string | null) {
    super(
      `the service answered ${status} with ${type ? `"${visible(type.slice(0, 100))}"` : 'no content type'}, not an event stream: is a proxy in front of it answering instead?`,
      EXIT.unavailable,
    );
  }
}

/** The service's base URL in a redirect's target: the target less the API path asked for (and its query), else the target. */
function baseOf(target: URL, apiPath: string): string {
  const base = new URL(shownUrl(target));
  if (!base.pathname.endsWith(apiPath)) return base.toString();
  base.pathname = base.pathname.slice(0, -apiPath.length) || '/';
  base.search = '';
  base.hash = '';
  return base.toString().replace(/\/$/, '');
}

export type RequestOptions = {
  body?: unknown;
  query?: Record<string, string | number | undefined>;
  headers?: Record<string, string>;
  signal?: AbortSignal;
  /** how long this call may wait for the service's whole answer (default: the client's) */
  timeoutMs?: number;
};

/** How long one call (not a followed stream) waits for the service's whole answer by default. */
export const DEFAULT_REQUEST_TIMEOUT_MS = 60_000;

/**
 * The most of one answer the tool reads. The service's largest answers (a page of 100 records, a run with its
 * steps) are a few MB; read whole, an answer without end (a proxy's, or a service gone wrong) held all of itself
 * in memory: 400 MB took the process to 1.7 GB.
 */
export const ANSWER_MAX_BYTES = 16 * 1024 * 1024;

/**
 * The most of one event a stream holds while it comes: its line not yet ended, or its data lines before the
 * blank line that ends it. The service's largest event is about 400 KB; without a cap, a line that never ended
 * grew until the process ran out of memory (600 MB took it to 2.3 GB).
 */
export const EVENT_MAX_CHARS = 4 * 1024 * 1024;

/**
 * A stream that breaks the service's own protocol: an event that is not a JSON object with a type, or one
 * larger than the service ever sends. Not tried again: the next connection would resend the same event.
 */
export class StreamProtocolError extends CliError {
  constructor(what: string) {
    super(`the event stream sent ${what}: not the service's own stream (a proxy in between?)`, EXIT.unavailable);
  }
}

/** An answer's body as text, refused past `max` bytes: a length announced that large is refused before reading. */
async function textOf(res: Response, what: string, max = ANSWER_MAX_BYTES): Promise<string> {
  const tooLarge = () =>
    new CliError(
      `the answer to ${what} is larger than ${max / 1024 / 1024} MB, more than the service sends: is a proxy in front of it answering instead?`,
      EXIT.unavailable,
    );
  if (Number(res.headers.get('content-length')) > max) {
    await res.body?.cancel().catch(() => undefined);
    throw tooLarge();
  }
  if (!res.body) return '';
  const chunks: Uint8Array[] = [];
  let bytes = 0;
  const reader = res.body.getReader();
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      bytes += value.byteLength;
      if (bytes > max) throw tooLarge();
      chunks.push(value);
    }
  } finally {
    await reader.cancel().catch(() => undefined);
  }
  // (as res.text(): a byte order mark dropped)
  return new TextDecoder().decode(Buffer.concat(chunks));
}

/** How long a followed event stream may stay silent: three of the service's heartbeats at their default of 15 s. */
export const DEFAULT_IDLE_MS = 45_000;

export type ServiceEvent = { id: string; type: string; data: Record<string, any>; at?: string; run_id?: string };

/** The problem of an answer other than 2xx; its status text when it has none (a proxy's page, say: the status says enough). */
function problemOf(text: string, res: Response): Problem {
  try {
    const problem: unknown = JSON.parse(text);
    // (`null` or a number is JSON too: read as a problem, it ended the command with a TypeError)
    if (typeof problem === 'object' && problem !== null && !Array.isArray(problem)) return problem as Problem;
  } catch {
    // not JSON
  }
  return { title: res.statusText };
}

/** An event's data as the service sends it: a JSON object with a type (a stream.truncated notice has no data). */
function eventOf(text: string): ServiceEvent {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    throw new StreamProtocolError(`an event that is not JSON ("${visible(text.slice(0, 40))}")`);
  }
  const isObject = (v: unknown): v is Record<string, any> => typeof v === 'object' && v !== null && !Array.isArray(v);
  if (!isObject(value) || typeof value.type !== 'string' || (value.data !== undefined && !isObject(value.data)))
    throw new StreamProtocolError(`an event that is not an object with a type ("${visible(text.slice(0, 40))}")`);
  return { ...value, data: value.data ?? {} } as ServiceEvent;
}

/** A stream answered 204: nothing more will come of it. */
const NOTHING_MORE = Symbol('nothing more');

export class ApiClient {
  constructor(
    readonly baseUrl: string,
    private readonly key: string | undefined,
    private readonly fetchImpl: typeof fetch = fetch,
    /** how long one call waits by default, in ms */
    readonly timeoutMs = DEFAULT_REQUEST_TIMEOUT_MS,
  ) {}

  private headers(extra: Record<string, string> = {}): Record<string, string> {
    return { ...(this.key ? { authorization: `Bearer ${this.key}` } : {}), 'user-agent': 'automation-service-cli', ...extra };
  }

  /** The service's URL for an API path, under the base URL's own path (a service behind a proxy's /automation/). */
  private url(path: string, query: RequestOptions['query'] = {}): string {
    const u = new URL(this.baseUrl);
    u.pathname = `${u.pathname.replace(/\/+$/, '')}${path}`;
    for (const [k, v] of Object.entries(query)) if (v !== undefined && v !== '') u.searchParams.set(k, String(v));
    return u.toString();
  }

  private async send(method: string, path: string, opts: RequestOptions, extra: Record<string, string> = {}): Promise<Response> {
    const base = new URL(this.baseUrl);
    // never printed back: the service takes its key as a header, not in the URL
    if (base.username || base.password)
      throw new CliError(`the service URL carries a user name or password (${shownUrl(base)}); give the API key with --key or SERVICE_API_KEY`, EXIT.usage);
    const body = opts.body === undefined ? undefined : JSON.stringify(opts.body);
    const headers = this.headers({ ...(body === undefined ? {} : { 'content-type': 'application/json' }), ...extra, ...opts.headers });
    const url = this.url(path, opts.query);
    let res: Response;
    try {
      // never followed: see RedirectError
      res = await this.fetchImpl(url, { method, headers, body, signal: opts.signal, redirect: 'manual' });
    } catch (err) {
      // the caller's own deadline ran out: its reason says what happened
      if (err instanceof CliError) throw err;
      const cause = (err as { cause?: { code?: string; message?: string } }).cause;
      throw new CliError(
        `cannot reach the service at ${shownUrl(base)}: ${cause?.code ?? cause?.message ?? (err as Error).message} (set --url or SERVICE_URL)`,
        EXIT.unavailable,
      );
    }
    if (res.status >= 300 && res.status < 400) {
      await res.body?.cancel().catch(() => undefined);
      throw new RedirectError(res.status, res.headers.get('location'), new URL(url), path);
    }
    return res;
  }

  /** One call; the parsed JSON answer (null for 204), or an ApiError. */
  async request<T = any>(method: string, path: string, opts: RequestOptions = {}): Promise<T> {
    // a service that froze, or a connection that died without a word, would hold the call for minutes
    const ms = opts.timeoutMs ?? this.timeoutMs;
    const deadline = new AbortController();
    const timer = setTimeout(
      () => deadline.abort(new CliError(`the service did not answer ${method} ${path} within ${ms / 1000} s (--request-timeout)`, EXIT.unavailable)),
      ms,
    );
    let res: Response;
    let text: string;
    try {
      res = await this.send(method, path, { ...opts, signal: opts.signal ? AbortSignal.any([opts.signal, deadline.signal]) : deadline.signal });
      text = await textOf(res, `${method} ${path}`);
    } catch (err) {
      throw deadline.signal.aborted ? (deadline.signal.reason as CliError) : err;
    } finally {
      clearTimeout(timer);
    }
    if (!res.ok) throw new ApiError(res.status, problemOf(text, res), retryAfterOf(res));
    try {
      return (text ? JSON.parse(text) : null) as T;
    } catch {
      throw new CliError(
        `the service answered ${res.status} with something that is not JSON (a proxy in between?): ${visible(text.slice(0, 80))}`,
        EXIT.unavailable,
      );
    }
  }

  /**
   * Reads a server-sent event stream to its end, reconnecting with Last-Event-ID whenever the connection
   * drops before `isLast` says the last event came, or when nothing (not even the service's heartbeat) came
   * for `idleMs`; a 429 or 502-504 is tried again after its Retry-After. Gives up after `reconnectForMs`
   * without a connection that brought something new (see below). Returns the last event; null when the
   * service answers 204, that nothing more will
   * come (the stream's end was sent before, or its events are no longer kept): the resource says how it ended.
   */
  async follow(
    path: string,
    opts: {
      isLast: (e: ServiceEvent) => boolean;
      onEvent: (e: ServiceEvent) => void;
      onReconnect?: (attempt: number, why: string) => void;
      reconnectForMs?: number;
      idleMs?: number;
      signal?: AbortSignal;
    },
  ): Promise<ServiceEvent | null> {
    let lastId: string | undefined;
    let failingSince: number | undefined;
    // reconnects since an event last came: the wait between them grows only while none comes
    let tries = 0;
    for (;;) {
      let why: string;
      let retryAfterMs: number | undefined;
      try {
        // The clock starts again only for what shows the stream going on: an event not seen before, or, once
        // one came, the service's heartbeat (a step silent for minutes between two drops is not two minutes
        // without a connection). Any first byte did before: a stub that sent `retry: 2000` and closed, or an
        // answer that failed the same way each time, was tried every 250 ms for good. The wait between tries
        // grows until a new event comes.
        const last = await this.readStream(path, lastId, opts, {
          event: (id) => {
            lastId = id;
            failingSince = undefined;
            tries = 0;
          },
          heartbeat: () => {
            if (lastId) failingSince = undefined;
          },
        });
        if (last === NOTHING_MORE) return null;
        if (last) return last;
        why = 'the stream ended early';
      } catch (err) {
        if (
          err instanceof RedirectError ||
          err instanceof NotAStreamError ||
          err instanceof StreamProtocolError ||
          (err instanceof ApiError && !RETRIED_STATUSES.has(err.status))
        )
          throw err;
        if (opts.signal?.aborted) throw err;
        why = (err as Error).message;
        if (err instanceof ApiError && err.retryAfterSeconds !== undefined) retryAfterMs = Math.min(err.retryAfterSeconds * 1000, RETRY_AFTER_MAX_MS);
      }
      failingSince ??= Date.now();
      if (Date.now() - failingSince > (opts.reconnectForMs ?? 120_000))
        throw new CliError(`lost the event stream and could not reconnect: ${why}`, EXIT.unavailable);
      opts.onReconnect?.(++tries, why);
      await new Promise((r) => setTimeout(r, retryAfterMs ?? Math.min(250 * 2 ** Math.min(tries - 1, 5), 5000)));
    }
  }

  private async readStream(
    path: string,
    lastId: string | undefined,
    opts: { isLast: (e: ServiceEvent) => boolean; onEvent: (e: ServiceEvent) => void; idleMs?: number },
    /** told of an event with an id other than `lastId`, and of each heartbeat */
    seen: { event: (id: string) => void; heartbeat: () => void },
  ): Promise<ServiceEvent | typeof NOTHING_MORE | null> {
    // a service that froze, or a connection that died without a word (a NAT mapping or a proxy dropped it),
    // sends nothing, not even its heartbeat: without a deadline the read waits for the kernel's own, minutes
    // later. Nothing for idleMs, from the request to its answer's headers or between two reads, ends the
    // connection, and follow() reconnects
    const idleMs = opts.idleMs ?? DEFAULT_IDLE_MS;
    const silence = new AbortController();
    let timer: NodeJS.Timeout | undefined;
    const heard = () => {
      clearTimeout(timer);
      timer = setTimeout(() => silence.abort(new CliError(`the service sent nothing for ${idleMs / 1000} s`, EXIT.unavailable)), idleMs);
    };
    heard();
    try {
      const res = await this.send('GET', path, { signal: silence.signal }, { accept: 'text/event-stream', ...(lastId ? { 'last-event-id': lastId } : {}) });
      if (!res.ok) {
        throw new ApiError(res.status, problemOf(await textOf(res, `GET ${path}`), res), retryAfterOf(res));
      }
      if (res.status === 204) return NOTHING_MORE;
      // (its body, which would end at once, was read as a stream that dropped: reconnected every 250 ms, for good)
      const type = res.headers.get('content-type');
      if (!/^text\/event-stream\s*(;|$)/i.test(type ?? '')) {
        await res.body?.cancel().catch(() => undefined);
        throw new NotAStreamError(res.status, type);
      }
      if (!res.body) return null;
      let last: ServiceEvent | null = null;
      let broken: ParseError | undefined;
      const parser = createParser({
        maxBufferSize: EVENT_MAX_CHARS,
        onError: (err) => {
          if (err.type === 'max-buffer-size-exceeded') broken = err;
        },
        onComment: () => seen.heartbeat(),
        onEvent: (m: EventSourceMessage) => {
          if (last || !m.data) return;
          // an event sent again after the id it was asked to follow is nothing new: not printed twice
          if (m.id && m.id === lastId) return;
          const event = eventOf(m.data);
          if (m.id) seen.event((lastId = m.id));
          opts.onEvent(event);
          if (opts.isLast(event)) last = event;
        },
      });
      const decoder = new TextDecoder();
      const reader = res.body.getReader();
      try {
        while (!last) {
          const { value, done } = await reader.read();
          if (done) break;
          heard();
          parser.feed(decoder.decode(value, { stream: true }));
          if (broken) throw new StreamProtocolError(`an event or a line longer than ${EVENT_MAX_CHARS / 1024 / 1024} MB`);
        }
      } finally {
        await reader.cancel().catch(() => undefined);
      }
      return last;
    } finally {
      clearTimeout(timer);
    }
  }
}
