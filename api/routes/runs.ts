// /api/v1/runs and the run-starting routes' shared answer.
import { Router, type Request, type Response } from 'express';
import type { Engine } from '../../engine/index.js';
import type { Run } from '../../engine/store/index.js';
import { tenantOf } from '../auth.js';

export const runLocation = (id: string) => `/api/v1/runs/${id}`;
export const eventsUrl = (sessionId: string) => `/api/v1/autonomy/streaming/${sessionId}/events`;

/** 202 with the run, where to read it and where to watch it. */
export function acceptRun(res: Response, run: Run, replayed: boolean): void {
  if (replayed) res.setHeader('Idempotent-Replayed', 'true');
  res
    .status(202)
    .location(runLocation(run.id))
    .json({ run_id: run.id, session_id: run.session_id, status: run.status, events_url: eventsUrl(run.session_id), run });
}

export const idempotencyKeyOf = (req: Request) => req.get('idempotency-key') || undefined;

export function runsRouter(engine: Engine): Router {
  const router = Router();
  router.get('/:id', async (req, res) => {
    res.json(await engine.runs.get(tenantOf(req), String(req.params.id)));
  });
  router.post('/:id/cancel', async (req, res) => {
    const run = await engine.runs.cancel(tenantOf(req), String(req.params.id));
    res.status(run.status === 'canceled' ? 200 : 202).json(run);
  });
  return router;
}
