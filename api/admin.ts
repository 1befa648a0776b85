// /admin/queues (the BullMQ dashboard, bull-board) and /metrics (Prometheus text), behind SERVICE_ADMIN_KEYS.
import { createBullBoard } from '@bull-board/api';
import { BullMQAdapter } from '@bull-board/api/bullMQAdapter';
import { ExpressAdapter } from '@bull-board/express';
import { Router } from 'express';
import type { Metrics, Queues } from '../engine/platform/index.js';
import { requireAdmin } from './auth.js';

export const DASHBOARD_PATH = '/admin/queues';

export function adminRouter(opts: { queues: Queues; adminKeys: string[]; metrics: Metrics }): Router {
  const serverAdapter = new ExpressAdapter();
  serverAdapter.setBasePath(DASHBOARD_PATH);
  createBullBoard({
    queues: opts.queues.all().map((q) => new BullMQAdapter(q, { readOnlyMode: false })),
    serverAdapter,
    options: { uiConfig: { boardTitle: 'Automation queues' } },
  });
  const router = Router();
  router.use(DASHBOARD_PATH, requireAdmin(opts.adminKeys), serverAdapter.getRouter());
  router.get('/metrics', requireAdmin(opts.adminKeys), async (_req, res) => {
    res.type(opts.metrics.registry.contentType).send(await opts.metrics.registry.metrics());
  });
  return router;
}
