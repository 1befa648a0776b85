// The request id, the completion log line and the latency histogram of every request, in one
// middleware. The per-request child logger is made only when something logs through it: most
// requests log nothing but their completion line, and none at all below LOG_LEVEL=info.
import { randomUUID } from 'node:crypto';
import type { Express, Request, RequestHandler } from 'express';
import type { Logger, Metrics } from '../engine/platform/index.js';

declare module 'express-serve-static-core' {
  interface Request {
    /** the request's id: the caller's X-Request-Id when well formed, else a new one */
    id: string;
    /** a logger whose lines carry the request id (and, once authenticated, the tenant) */
    log: Logger;
  }
}

const REQUEST_ID = /^[A-Za-z0-9._:-]{1,128}$/;

/** A request id the service makes (for a request that brought none, or none well formed). */
export function newRequestId(): string {
  return randomUUID();
}
const BINDINGS = Symbol('log bindings');
const CHILD = Symbol('request logger');

type WithLog = Request & { [BINDINGS]?: Record<string, unknown>; [CHILD]?: Logger };

/** Adds fields to every later line of this request's log, and to its completion line. */
export function bindToRequestLog(req: Request, fields: Record<string, unknown>): void {
  const r = req as WithLog;
  r[BINDINGS] = { ...r[BINDINGS], ...fields };
  r[CHILD]?.setBindings(fields);
}

/**
 * `app` is the Express app whose requests get `req.log`: the getter sits on its request prototype
 * (`app.request`), so no request object is reshaped by defining a property on it.
 */
/**
 * The route a request matched, as its metric label: the router's mount and the route's own path. Read
 * from the URL, not `req.baseUrl`: Express puts `baseUrl` back as an error leaves a router, so every
 * route's error answers would share its sub-path (`/:id`). The mounts are literal paths and a route's
 * parameters take one segment each, so the mount is the URL's segments before the route's.
 */
function routeOf(req: Request): string {
  if (!req.route) return 'unmatched';
  const path = String(req.route.path);
  const segments = req.originalUrl.split('?')[0]!.split('/').filter(Boolean);
  const own = path.split('/').filter(Boolean).length;
  const mount = segments.slice(0, Math.max(0, segments.length - own));
  return `${mount.length ? `/${mount.join('/')}` : ''}${path}`;
}

export function requestLog(app: Express, opts: { log: Logger; httpDuration: Metrics['httpDuration']; quiet?: (path: string) => boolean }): RequestHandler {
  const { log, httpDuration } = opts;
  const loggerOf = (r: WithLog) => (r[CHILD] ??= log.child({ req_id: r.id, ...r[BINDINGS] }));
  Object.defineProperty(app.request, 'log', {
    configurable: true,
    get(this: WithLog) {
      return loggerOf(this);
    },
  });
  return (req, res, next) => {
    const given = req.headers['x-request-id'];
    const id = typeof given === 'string' && REQUEST_ID.test(given) ? given : newRequestId();
    req.id = id;
    res.setHeader('X-Request-Id', id);
    const started = performance.now();
    res.once('finish', () => {
      const ms = performance.now() - started;
      const route = routeOf(req);
      httpDuration.observe({ method: req.method, route, status: String(res.statusCode) }, ms / 1000);
      // a 503 says something the service depends on is away or not set up (the store, a provider): worth a look, not a failure of its own
      const level = res.statusCode === 503 ? 'warn' : res.statusCode >= 500 ? 'error' : 'info';
      if (!log.isLevelEnabled(level) || opts.quiet?.(req.path)) return;
      // method, path and status only: no headers, no bodies, no query strings (they may carry secrets)
      // a mounted sub-app (the queue dashboard) swaps the request's prototype: do not rely on req.log here
      loggerOf(req)[level](
        { req: { method: req.method, path: req.originalUrl.split('?')[0] }, res: { status: res.statusCode }, response_ms: Math.round(ms * 10) / 10 },
        'request completed',
      );
    });
    next();
  };
}
