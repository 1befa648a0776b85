// /api/v1/automations and its templates. Bodies and queries arrive validated against openapi.yaml.
import { Router, type Request } from 'express';
import type { Engine } from '../../engine/index.js';
import { tenantOf } from '../auth.js';
import { sendJsonPage } from '../json-page.js';
import { acceptRun, idempotencyKeyOf } from './runs.js';
import type { components, operations } from '../schema.js';

// Request types come from api/openapi.yaml (npm run gen:types); passing them to the engine makes the
// compiler check that the contract and the engine agree.
type Schemas = components['schemas'];
type ListQuery = NonNullable<operations['listAutomations']['parameters']['query']>;

const location = (id: string) => `/api/v1/automations/${id}`;
const idOf = (req: Request) => String(req.params.id);

export function automationsRouter(engine: Engine): Router {
  const router = Router();
  const { automations, templates } = engine;

  router.get('/', async (req, res) => {
    const q = req.query as ListQuery;
    sendJsonPage(res, await automations.listJson(tenantOf(req), q));
  });

  router.post('/', async (req, res) => {
    const body = req.body as Schemas['AutomationDefinition'] | Schemas['TemplateInstantiation'];
    // an Idempotency-Key's retry answers the automation its first request made, as a run's retry answers its run
    const { automation, replayed } = await automations.createIdempotent(tenantOf(req), idempotencyKeyOf(req), body);
    if (replayed) res.setHeader('Idempotent-Replayed', 'true');
    res.status(201).location(location(automation.id)).json(automation);
  });

  router.post('/run', async (req, res) => {
    const body = req.body as operations['runAutomation']['requestBody']['content']['application/json'];
    const tenantId = tenantOf(req);
    // the automation is read (and must be enabled) only for a new key: a retry answers the run it started
    const request = () =>
      automations.runRequest(tenantId, body.automation_id, {
        inputs: body.inputs,
        trigger: { type: 'manual', request_id: String(req.id) },
        request_id: String(req.id),
      });
    const { run, replayed } = await engine.runs.createIdempotent(
      tenantId,
      idempotencyKeyOf(req),
      { automation_id: body.automation_id, inputs: body.inputs ?? {} },
      request,
    );
    await engine.overlap.fired(run);
    acceptRun(res, engine, run, replayed);
  });

  router.get('/:id/status', async (req, res) => {
    res.json(await automations.status(tenantOf(req), idOf(req)));
  });

  router.get('/:id/history', async (req, res) => {
    res.json(await automations.history(tenantOf(req), idOf(req), req.query as { limit?: number; cursor?: string }));
  });

  router.get('/templates', (_req, res) => {
    res.json({ data: templates.list() });
  });

  router.post('/templates/instantiate', async (req, res) => {
    const body = req.body as Schemas['TemplateInstantiation'];
    const { automation, replayed } = await automations.createIdempotent(tenantOf(req), idempotencyKeyOf(req), body);
    if (replayed) res.setHeader('Idempotent-Replayed', 'true');
    res.status(201).location(location(automation.id)).json(automation);
  });

  router.get('/:id', async (req, res) => {
    res.json(await automations.get(tenantOf(req), idOf(req)));
  });

  router.patch('/:id', async (req, res) => {
    res.json(await automations.update(tenantOf(req), idOf(req), req.body as Schemas['AutomationPatch']));
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
