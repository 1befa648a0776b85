// /admin/queues (the BullMQ dashboard, bull-board) and /metrics (Prometheus text), behind SERVICE_ADMIN_KEYS.
// A browser keeps the Basic credentials the dashboard was opened with and sends them with any request to
// this origin, a page of another site's included: the dashboard's changes (pause a queue, clean, retry,
// add a job) are taken from this origin only, and no other site may frame it.
import { createBullBoard } from '@bull-board/api';
import { BullMQAdapter } from '@bull-board/api/bullMQAdapter';
import { ExpressAdapter } from '@bull-board/express';
import { Router, type Express, type RequestHandler } from 'express';
import type { Metrics, Queues } from '../engine/platform/index.js';
import { requireAdmin } from './auth.js';
import { requestIdOf, toProblem } from './problem.js';
import { CsrfRefusedError, SAFE_METHODS } from './sign-in.js';

/** Headers of pages no other site may frame (clickjacking). */
export const NO_FRAMING = { 'X-Frame-Options': 'DENY', 'Content-Security-Policy': "frame-ancestors 'none'" };

/** Refuses a change a browser sends from another origin (CSRF); clients that are no browser send neither header. */
const sameOriginChanges: RequestHandler = (req, res, next) => {
  res.set(NO_FRAMING);
  if (SAFE_METHODS.has(req.method)) return next();
  const site = req.headers['sec-fetch-site'];
  const origin = req.headers.origin;
  let foreign = site !== undefined && site !== 'same-origin' && site !== 'none';
  if (origin !== undefined) {
    try {
      foreign ||= new URL(origin).host !== req.headers.host;
    } catch {
      foreign = true; // "null", or no URL
    }
  }
  if (foreign) throw new CsrfRefusedError('the queue dashboard takes changes from its own pages only');
  next();
};

/**
 * The dashboard's own API answers its errors in bull-board's JSON (`{"error":{"key":"ERRORS.QUEUE_NOT_FOUND"}}`,
 * a body parser's message): they go out as the service's problems, with a stable code and the request's id.
 */
const asProblems: RequestHandler = (req, res, next) => {
  const json = res.json.bind(res);
  res.json = (body: unknown) => {
    if (res.statusCode < 400) return json(body);
    const { error, message } = (body ?? {}) as { error?: { key?: unknown }; message?: unknown };
    const key =
      typeof error?.key === 'string'
        ? error.key
            .replace(/^ERRORS\./, '')
            .toLowerCase()
            .replaceAll('_', ' ')
        : null;
    const said = typeof message === 'string' ? message : key && !/internal server error/.test(key) ? key : 'the dashboard refused the request';
    const problem = toProblem(Object.assign(new Error(said), { status: res.statusCode }), requestIdOf(req), req.originalUrl);
    res.status(problem.status).type('application/problem+json');
    return json(problem);
  };
  next();
};

export const DASHBOARD_PATH = '/admin/queues';

export function adminRouter(opts: { queues: Queues; adminKeys: string[]; metrics: Metrics }): Router {
  const serverAdapter = new ExpressAdapter();
  serverAdapter.setBasePath(DASHBOARD_PATH);
  createBullBoard({
    queues: opts.queues.all().map((q) => new BullMQAdapter(q, { readOnlyMode: false })),
    serverAdapter,
    options: { uiConfig: { boardTitle: 'Automation queues' } },
  });
  const board = serverAdapter.getRouter() as Express;
  board.disable('x-powered-by');
  const router = Router();
  router.use(DASHBOARD_PATH, requireAdmin(opts.adminKeys), sameOriginChanges, asProblems, board);
  router.get('/metrics', requireAdmin(opts.adminKeys), async (_req, res) => {
    res.type(opts.metrics.registry.contentType).send(await opts.metrics.registry.metrics());
  });
  return router;
}
