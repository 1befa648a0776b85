// /api/v1/runs: a tenant's runs across automations and kinds, one run, cancel and re-run; and the
// run-starting routes' shared answer.
import { Router, type Request, type Response } from 'express';
import type { Engine } from '../../engine/index.js';
import type { Run } from '../../engine/platform/index.js';
import { tenantOf } from '../auth.js';
import type { operations } from '../schema.js';
import { runListView, runView } from '../views.js';

export const runLocation = (id: string) => `/api/v1/runs/${id}`;
export const eventsUrl = (sessionId: string) => `/api/v1/autonomy/streaming/${sessionId}/events`;

type ListQuery = NonNullable<operations['listRuns']['parameters']['query']>;

/** What a 202 for a stored run carries. */
export function acceptedRun(engine: Engine, run: Run) {
  return { run_id: run.id, session_id: run.session_id, status: run.status, events_url: eventsUrl(run.session_id), run: runView(run, engine.runs) };
}

/** Answers 202 for a stored run: Location, and Idempotent-Replayed when a key returned an earlier one. */
export function acceptRun(res: Response, engine: Engine, run: Run, replayed: boolean, body: object = acceptedRun(engine, run)): void {
  if (replayed) res.setHeader('Idempotent-Replayed', 'true');
  res.status(202).location(runLocation(run.id)).json(body);
}

export const idempotencyKeyOf = (req: Request) => req.get('idempotency-key') || undefined;

export function runsRouter(engine: Engine): Router {
  const router = Router();
  router.get('/', async (req, res) => {
    const q = req.query as ListQuery;
    const page = await engine.runs.list(tenantOf(req), q);
    res.json({ data: page.items.map((r) => runListView(r, engine.runs)), next_cursor: page.next_cursor });
  });
  router.get('/:id', async (req, res) => {
    res.json(runView(await engine.runs.get(tenantOf(req), String(req.params.id)), engine.runs));
  });
  router.post('/:id/cancel', async (req, res) => {
    const run = await engine.runs.cancel(tenantOf(req), String(req.params.id));
    res.status(run.status === 'canceled' ? 200 : 202).json(runView(run, engine.runs));
  });
  router.post('/:id/rerun', async (req, res) => {
    const { run, replayed } = await engine.runs.rerun(tenantOf(req), String(req.params.id), idempotencyKeyOf(req), String(req.id));
    acceptRun(res, engine, run, replayed);
  });
  return router;
}
