// /api/v1/api-keys: the calling tenant's keys, made (shown once), listed and revoked.
import { Router } from 'express';
import type { Engine } from '../../engine/index.js';
import type { ApiKeyRecord } from '../../engine/platform/index.js';
import { tenantOf } from '../auth.js';
import type { components } from '../schema.js';

type ApiKeyCreate = components['schemas']['ApiKeyCreate'];
type ApiKeyView = components['schemas']['ApiKey'];

/** A key as the API shows it: never its hash. */
function view(k: ApiKeyRecord): ApiKeyView {
  return {
    id: k.id,
    label: k.label,
    source: k.source,
    created_at: k.created_at,
    expires_at: k.expires_at ?? null,
    revoked_at: k.revoked_at ?? null,
    revoked_reason: k.revoked_reason ?? null,
    last_used_at: k.last_used_at ?? null,
    created_by: k.created_by ?? null,
  };
}

export function apiKeysRouter(engine: Engine): Router {
  const router = Router();
  router.get('/', async (req, res) => {
    const q = req.query as { limit?: number; cursor?: string };
    const page = await engine.apiKeys.page(tenantOf(req), { limit: q.limit ?? 50, cursor: q.cursor });
    res.json({ data: page.items.map(view), next_cursor: page.next_cursor });
  });
  router.post('/', async (req, res) => {
    const body = (req.body ?? {}) as ApiKeyCreate; // the body is optional
    // a key outlives the session that made it: who made it stays on it
    const created_by = req.apiKeyId ? `key:${req.apiKeyId}` : req.signedIn ? `person:${req.signedIn.sub}` : null;
    const maker = req.apiKeyId ? await engine.apiKeys.get(tenantOf(req), req.apiKeyId) : null;
    const made = await engine.apiKeys.create(tenantOf(req), {
      label: body.label,
      expires_at: body.expires_at,
      source: 'api',
      created_by,
      not_after: maker?.expires_at ?? null,
    });
    res.status(201).json({ key: made.key, api_key: view(made.record) });
  });
  router.delete('/:id', async (req, res) => {
    await engine.apiKeys.revoke(tenantOf(req), String(req.params.id), { cascade: (req.query as { cascade?: boolean }).cascade === true });
    res.status(204).end();
  });
  return router;
}
