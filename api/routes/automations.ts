// /api/v1/automations and its templates. Bodies and queries arrive validated against openapi.yaml.
import { Router, type Request } from 'express';
import type { Engine } from '../../engine/index.js';
import type { AutomationDefinition, AutomationPatch, AutomationStatus } from '../../engine/model.js';
import { tenantOf } from '../auth.js';

type TemplateInstantiation = { template_id: string; variables?: Record<string, unknown>; name?: string };

const location = (id: string) => `/api/v1/automations/${id}`;
const idOf = (req: Request) => String(req.params.id);

export function automationsRouter(engine: Engine): Router {
  const router = Router();
  const { automations, templates } = engine;

  router.get('/', async (req, res) => {
    const q = req.query as { status?: AutomationStatus[]; include_archived?: boolean; limit?: number; cursor?: string };
    const page = await automations.list(tenantOf(req), q);
    res.json({ data: page.items, next_cursor: page.next_cursor });
  });

  router.post('/', async (req, res) => {
    const body = req.body as AutomationDefinition | TemplateInstantiation;
    const created = 'template_id' in body ? await automations.createFromTemplate(tenantOf(req), body) : await automations.create(tenantOf(req), body);
    res.status(201).location(location(created.id)).json(created);
  });

  router.get('/templates', (_req, res) => {
    res.json({ data: templates.list() });
  });

  router.post('/templates/instantiate', async (req, res) => {
    const created = await automations.createFromTemplate(tenantOf(req), req.body as TemplateInstantiation);
    res.status(201).location(location(created.id)).json(created);
  });

  router.get('/:id', async (req, res) => {
    res.json(await automations.get(tenantOf(req), idOf(req)));
  });

  router.patch('/:id', async (req, res) => {
    res.json(await automations.update(tenantOf(req), idOf(req), req.body as AutomationPatch));
  });

  router.delete('/:id', async (req, res) => {
    await automations.archive(tenantOf(req), idOf(req));
    res.status(204).end();
  });

  router.post('/:id/enable', async (req, res) => {
    res.json(await automations.enable(tenantOf(req), idOf(req)));
  });

  router.post('/:id/disable', async (req, res) => {
    res.json(await automations.disable(tenantOf(req), idOf(req)));
  });

  return router;
}
