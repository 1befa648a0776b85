// Starts the HTTP server on a runtime and stops it: no new connections, in-flight requests finish.
import type { AddressInfo, Socket } from 'node:net';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { Duplex } from 'node:stream';
import { answerClientError, type Logger } from '../engine/platform/index.js';
import { listenError, type Runtime } from '../engine/process/index.js';
import { createApp } from './app.js';
import { newRequestId } from './request-log.js';
import { hasBody } from './request-body.js';
import type { OpenStreams } from './sse.js';

/**
 * How long before the end of the grace period the connections of requests still in flight are cut: time for
 * the close to end and the store and Redis to close after it, with a loaded machine's late timers (a cut
 * 370 ms late left 136 ms of a 500 ms margin, too little: the process exited 1 with its work done).
 */
const CUT_MARGIN_MS = 1000;

/**
 * How long after a close begins a connection that has sent no byte yet is taken for a spare (a client's or a
 * balancer's, opened ahead of need) and closed: bytes a client wrote before the close began are read well within it.
 */
const SPARE_WAIT_MS = 500;

/**
 * The requests a connection may have unanswered at once (pipelined: sent before it read the answers to those
 * before them); one more closes it. Each answer waits in memory behind the one before it: 300 requests for the
 * 1 MB Redoc bundle, never read, held 330 MB for good. Browsers and common clients do not pipeline at all.
 */
const MAX_UNANSWERED_PER_CONNECTION = 16;

/**
 * How long at most an answer may wait to be written with no byte of it taken by the client (twice Node's socket
 * timeout, which every byte read and every write the socket gets done sets back) before its connection is closed: a client that
 * stops reading held its connection, and what was written for it, for good. A connection whose answer is still
 * being made (a long-poll, a slow handler) with nothing waiting to be written is not closed, nor is an event
 * stream read by its client between heartbeats; one that stops reading its stream is (sse.ts holds up to 2 MB
 * for it until then).
 */
const WRITE_STALL_MS = 60_000;

/** close(deadline): the end of the grace period (epoch ms; by default SERVICE_SHUTDOWN_GRACE_SECONDS from now). */
export type WebServer = { server: Server; url: string; close(deadline?: number): Promise<void> };

/** `writeStallMs`: WRITE_STALL_MS but for tests. */
export async function startWebServer(
  rt: Runtime,
  opts: { port?: number; host?: string; validateResponses?: boolean; writeStallMs?: number } = {},
): Promise<WebServer> {
  const { config } = rt;
  const app = createApp({
    engine: rt.engine,
    hub: rt.hub,
    metrics: rt.metrics,
    sandbox: {
      kind: rt.sandbox.kind,
      process_limit: rt.sandbox.processLimit,
      memory_limit: rt.sandbox.memoryLimit,
      ...(rt.sandbox.kind === 'none' ? { warning: 'tool processes run unsandboxed, as the service' } : {}),
    },
    sseHeartbeatMs: config.sseHeartbeatSeconds * 1000,
    maxStreamsPerTenant: config.tenantMaxStreams,
    redis: rt.redis,
    store: rt.store,
    queues: rt.queues,
    log: rt.log,
    auth: config.auth,
    adminKeys: config.adminKeys,
    docs: !config.isProduction,
    validateResponses: opts.validateResponses,
    signIn: { corsOrigins: config.corsOrigins, redirectUrl: config.oidc?.redirectUrl ?? null, sessionMaxSeconds: config.sessions.maxSeconds },
  });
  const port = opts.port ?? config.port;
  // a request without Host is the app's to refuse (a problem with its request id, logged), not Node's bare 400
  // a request that comes on a connection closed already (past MAX_UNANSWERED_PER_CONNECTION, in the same read as
  // the one that closed it) is not served: nothing could be answered
  const server = createServer({ requireHostHeader: false }, (req, res) => {
    if (!req.socket.destroyed) app(req, res);
  });
  // SERVICE_AUTH=none serves this machine only: whoever reaches the port is its tenant
  const host = opts.host ?? (config.auth === 'none' ? '127.0.0.1' : undefined);
  if (host) server.listen(port, host);
  else server.listen(port);
  await new Promise<void>((resolve, reject) => {
    server.once('listening', resolve);
    server.once('error', (err) => reject(listenError(err, 'PORT', port)));
  });
  server.keepAliveTimeout = 65_000; // above common load balancers' idle timeouts
  server.on('clientError', (err: Error & { code?: string }, socket: Duplex) => answerClientError(err, socket, rt.log));
  // an Expect other than 100-continue is the app's to refuse, as a problem (api/app.ts), not Node's bare 417
  server.on('checkExpectation', (req, res) => server.emit('request', req, res));
  // once closing, no connection is kept alive: an answer not begun yet says `Connection: close`, and a connection
  // is closed once its answer is sent. Left idle, a keep-alive connection whose request was in flight when closing
  // began would hold close() open for keepAliveTimeout (closeIdleConnections() at the start sees only those idle then).
  let closing = false;
  const answering = new Set<ServerResponse>();
  /** each connection's answers not yet sent (a connection's first request makes its entry) */
  const unanswered = new WeakMap<Socket, Set<ServerResponse>>();
  const bodyIdleMs = config.bodyIdleSeconds * 1000;
  /**
   * Connections that have sent no request yet: a client's or a balancer's spare, opened ahead of need. Node's
   * closeIdleConnections() passes over them (a connection is idle once a request of it is complete), so each held
   * close() until the cut near the end of the grace period (a test service's close took 4 s for its client's).
   */
  const unused = new Set<Socket>();
  server.on('connection', (socket: Socket) => {
    unused.add(socket);
    socket.once('close', () => unused.delete(socket));
  });
  server.prependListener('request', (req, res) => {
    const socket = req.socket;
    let open = unanswered.get(socket);
    if (!open) {
      unused.delete(socket);
      const mine = (open = new Set());
      unanswered.set(socket, mine);
      // the answers queued behind others on a connection that closes are never sent, nor do they close
      socket.once('close', () => {
        for (const r of mine) answering.delete(r);
        mine.clear();
      });
    }
    if (socket.destroyed) return;
    if (open.size >= MAX_UNANSWERED_PER_CONNECTION) {
      rt.log.info({ unanswered: open.size }, 'a connection sent more requests than it read answers: closed');
      return void socket.destroy();
    }
    toOriginForm(req);
    whileBodyComes(req, res, bodyIdleMs, rt.log);
    if (closing) res.shouldKeepAlive = false;
    answering.add(res);
    open.add(res);
    res.once('finish', () => open.delete(res));
    res.once('close', () => {
      open.delete(res);
      answering.delete(res);
      if (closing) server.closeIdleConnections();
    });
  });
  // half the bound: Node lets a socket's first timeout pass when its client took part of the last write since
  // (Socket._onTimeout), and a stalled stream's client had (the kernel's buffers), so a client that stopped
  // reading was closed after twice the bound (120 s). Now after one to two halves: at most the bound
  server.timeout = (opts.writeStallMs ?? WRITE_STALL_MS) / 2;
  server.on('timeout', (socket: Socket) => whenSocketIdle(socket, unanswered.get(socket), rt.log));
  const bound = (server.address() as AddressInfo).port;
  const url = `http://${opts.host && opts.host !== '0.0.0.0' && opts.host !== '::' ? opts.host : 'localhost'}:${bound}`;
  return {
    server,
    url,
    async close(deadline = Date.now() + config.shutdownGraceSeconds * 1000) {
      closing = true;
      // requests that wait (an audit's long-poll) answer now what they would at their timeout
      (app.locals.closing as AbortController).abort();
      for (const res of answering) if (!res.headersSent) res.shouldKeepAlive = false;
      // requests still unanswered near the end of the grace period are cut, so that close() ends and the
      // store and Redis are closed before the exit
      const cut = setTimeout(
        () => {
          rt.log.warn('grace period ending: closing the connections of requests still in flight');
          server.closeAllConnections();
        },
        Math.max(0, deadline - Date.now() - CUT_MARGIN_MS),
      );
      // connections that have sent nothing a moment after (a request already on its way is read by then: closed
      // at once, one the client wrote as the stop began was lost) are spares; one whose first request has begun
      // to arrive is answered (Connection: close) or cut with the rest
      const spares = setTimeout(() => {
        for (const socket of unused) if (socket.bytesRead === 0) socket.destroy();
      }, SPARE_WAIT_MS);
      try {
        await new Promise<void>((resolve) => {
          server.close(() => resolve());
          // open event streams end now: their clients resume on another instance with Last-Event-ID
          (app.locals.streams as OpenStreams).closeAll();
          server.closeIdleConnections();
        });
      } finally {
        clearTimeout(cut);
        clearTimeout(spares);
      }
    },
  };
}

/**
 * A request whose body stops coming held its connection, and whatever reads it (the JSON parser, an upload's
 * stream), until Node's request timeout (300 s): one whose body sends nothing for `idleMs` (to twice that) is
 * answered 408 and its connection closed, and the reading fails, so nothing it asked for is done. A check of
 * the request's own, on the bytes its connection has read, until its body is all in or it ends: the socket's
 * timeout, shared by the requests of a connection, was set back by an earlier request's body ending (a
 * pipelined request that stalled was never answered) and left cleared on a kept-alive connection whose body
 * the route never read (it was never closed). Listening for the body's chunks would start it flowing before
 * its reader is there.
 */
function whileBodyComes(req: IncomingMessage, res: ServerResponse, idleMs: number, log: Logger): void {
  if (!hasBody(req)) return;
  const socket = req.socket;
  let read = socket.bytesRead;
  const check = setInterval(() => {
    // all of it is in, read or not yet (a handler that reads it late is not a body that stopped coming); or its
    // connection is gone, which a request answered before its body was all in no longer hears (Node detaches it)
    if (req.complete || socket.destroyed) return done();
    // bytes wait to be read: the service is not reading (Node stops reading the socket once they pass the
    // stream's mark), not the client that stopped sending
    if (socket.bytesRead !== read || req.readableLength > 0) {
      read = socket.bytesRead;
      return;
    }
    done();
    // the request ends with its connection: its readers (an upload's stream, a parser) hear its close. Answered,
    // it is no longer the connection's, and closing the socket alone never ended it: an upload stalled past its
    // 408 kept its place and its temp file until the process stopped (8 such uploads held a tenant's every place)
    const end = () => {
      socket.destroy();
      req.destroy();
    };
    // answered already (the route did not read the body) and the rest of it does not come: the connection goes
    if (res.headersSent) return void end();
    const requestId = (req as IncomingMessage & { id?: string }).id ?? newRequestId();
    log.info({ req_id: requestId, idle_ms: idleMs }, 'a request body sent nothing for too long: answered 408');
    const body = JSON.stringify({
      type: '/problems/request-timeout',
      title: 'Request Timeout',
      status: 408,
      code: 'request-timeout',
      detail: `The request body sent nothing for ${idleMs / 1000} s.`,
      request_id: requestId,
    });
    res.shouldKeepAlive = false;
    res.writeHead(408, { 'Content-Type': 'application/problem+json; charset=utf-8', 'Content-Length': Buffer.byteLength(body), 'X-Request-Id': requestId });
    res.end(body, end);
  }, idleMs);
  // a check on a connection: it never holds the process open (a closed server's test process lingered 60 s)
  check.unref();
  const done = () => clearInterval(check);
  req.once('end', done);
  req.once('close', done);
}

/**
 * A connection's socket timeout (half WRITE_STALL_MS, or keepAliveTimeout once its answers are sent): `open` is its
 * answers not yet sent, none for a connection that has not sent a request yet (Node's headers timeout answers
 * that one 408). Answers owed with nothing waiting to be written are still being made: the connection stays.
 */
function whenSocketIdle(socket: Socket, open: Set<ServerResponse> | undefined, log: Logger): void {
  if (!open || (open.size > 0 && socket.writableLength === 0)) return;
  if (open.size > 0)
    log.info({ unanswered: open.size, stalled_ms_at_most: 2 * (socket.timeout ?? 0) }, 'a client took no byte of its answer for too long: connection closed');
  socket.destroy();
}

/** scheme://authority of an absolute-form request target; the authority may hold userinfo (user@host) */
const ABSOLUTE_FORM = /^[A-Za-z][A-Za-z0-9+.-]*:\/\/([^/?#]*)/;

/**
 * An absolute-form target (`GET http://host/api/v1/me`, the form a client sends to a proxy) is answered as
 * the origin-form request it names, its authority taking the place of Host (RFC 9112 §3.2.2): everything
 * that reads the URL (routing, the validator's route lookup, the CSRF rule, the log) sees the path as it was
 * written, as it would in origin form. The validator's lookup, which reads the URL as sent, found no route for
 * it (a 404 for every such request). Host is not made up for a request that sent none: that one is refused.
 */
function toOriginForm(req: IncomingMessage): void {
  const url = req.url ?? '/';
  if (url.startsWith('/')) return;
  const absolute = ABSOLUTE_FORM.exec(url);
  if (!absolute) return;
  const rest = url.slice(absolute[0].length);
  req.url = rest.startsWith('/') ? rest : `/${rest}`;
  const authority = absolute[1]!.slice(absolute[1]!.lastIndexOf('@') + 1);
  if (authority && req.headers.host !== undefined) req.headers.host = authority;
}
