// /api/v1/connections: the calling tenant's provider credentials. The credential goes in and never
// comes out: answers carry the connection's view only.
import { Router } from 'express';
import type { Engine } from '../../engine/index.js';
import { viewOf } from '../../engine/connections/index.js';
import type { ConnectionProvider } from '../../engine/platform/index.js';
import { tenantOf } from '../auth.js';
import type { components } from '../schema.js';

type ConnectionCreate = components['schemas']['ConnectionCreate'];
type ConnectionPatch = components['schemas']['ConnectionPatch'];

export function connectionsRouter(engine: Engine): Router {
  const router = Router();
  router.get('/', async (req, res) => {
    const q = req.query as { provider?: ConnectionProvider; limit?: number; cursor?: string };
    const page = await engine.connections.list(tenantOf(req), { provider: q.provider, limit: q.limit ?? 20, cursor: q.cursor });
    res.json({ data: page.items.map(viewOf), next_cursor: page.next_cursor });
  });
  router.post('/', async (req, res) => {
    const made = await engine.connections.create(tenantOf(req), req.body as ConnectionCreate);
    res.status(201).location(`/api/v1/connections/${made.id}`).json(viewOf(made));
  });
  router.get('/:id', async (req, res) => {
    res.json(viewOf(await engine.connections.get(tenantOf(req), String(req.params.id))));
  });
  router.patch('/:id', async (req, res) => {
    res.json(viewOf(await engine.connections.update(tenantOf(req), String(req.params.id), req.body as ConnectionPatch)));
  });
  router.delete('/:id', async (req, res) => {
    await engine.connections.remove(tenantOf(req), String(req.params.id));
    res.status(204).end();
  });
  router.post('/:id/test', async (req, res) => {
    res.json(await engine.connections.test(tenantOf(req), String(req.params.id)));
  });
  return router;
}
