// /api/v1/notification-endpoints and /api/v1/notification-deliveries: the tenant's outbound
// notifications. A new endpoint's signing secret is in the answer that makes it, and never again.
import { Router } from 'express';
import type { Engine } from '../../engine/index.js';
import { endpointView } from '../../engine/connections/index.js';
import type { NotificationDelivery } from '../../engine/platform/index.js';
import { tenantOf } from '../auth.js';
import type { components } from '../schema.js';

type Schemas = components['schemas'];

const deliveryView = ({ tenant_id: _t, ...rest }: NotificationDelivery) => rest;

export function notificationEndpointsRouter(engine: Engine): Router {
  const router = Router();
  router.get('/', async (req, res) => {
    res.json({ data: (await engine.notifications.list(tenantOf(req))).map(endpointView) });
  });
  router.post('/', async (req, res) => {
    const { endpoint, secret } = await engine.notifications.create(tenantOf(req), req.body as Schemas['NotificationEndpointCreate']);
    res
      .status(201)
      .location(`/api/v1/notification-endpoints/${endpoint.id}`)
      .json({ secret, endpoint: endpointView(endpoint) });
  });
  router.get('/:id', async (req, res) => {
    res.json(endpointView(await engine.notifications.get(tenantOf(req), String(req.params.id))));
  });
  router.patch('/:id', async (req, res) => {
    res.json(endpointView(await engine.notifications.update(tenantOf(req), String(req.params.id), req.body as Schemas['NotificationEndpointPatch'])));
  });
  router.delete('/:id', async (req, res) => {
    await engine.notifications.remove(tenantOf(req), String(req.params.id));
    res.status(204).end();
  });
  router.post('/:id/rotate-secret', async (req, res) => {
    const body = (req.body ?? {}) as Schemas['NotificationEndpointRotate'];
    const { endpoint, secret } = await engine.notifications.rotateSecret(tenantOf(req), String(req.params.id), body.keep_previous_seconds);
    res.json({ secret, endpoint: endpointView(endpoint) });
  });
  router.get('/:id/deliveries', async (req, res) => {
    const q = req.query as { limit?: number; cursor?: string };
    const page = await engine.notifications.deliveries(tenantOf(req), String(req.params.id), { limit: q.limit ?? 20, cursor: q.cursor });
    res.json({ data: page.items.map(deliveryView), next_cursor: page.next_cursor });
  });
  return router;
}

export function notificationDeliveriesRouter(engine: Engine): Router {
  const router = Router();
  router.post('/:id/replay', async (req, res) => {
    res.status(202).json(deliveryView(await engine.notifications.replay(tenantOf(req), String(req.params.id))));
  });
  return router;
}
