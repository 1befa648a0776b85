// Webhook intake (/webhooks/{tenant_id}/{kind}, no API key) and its management routes under
// /api/v1 (secrets, deliveries). The intake reads the raw bytes itself, before any parser, because
// signatures are over exactly what was sent.
import express, { Router, type NextFunction, type Request, type Response } from 'express';
import { TENANT_ID_PATTERN } from '../../config/env.js';
import { NotFoundError, WEBHOOK_PROVIDERS, WebhookRejectedError, type WebhookProvider } from '../../engine/platform/index.js';
import type { Engine } from '../../engine/index.js';
import { BODY_LIMIT_BYTES } from '../../engine/webhooks/index.js';
import { tenantOf } from '../auth.js';
import { refuseDeclaredOver } from '../body-limit.js';
import type { operations } from '../schema.js';

const isKind = (k: string): k is WebhookProvider => (WEBHOOK_PROVIDERS as readonly string[]).includes(k);

/** The tenant and kind an intake path names; a malformed tenant id or an unknown kind is no intake path (404). */
function intakeOf(req: Request): [string, WebhookProvider] {
  const tenantId = String(req.params.tenant_id);
  const kind = String(req.params.kind);
  if (!TENANT_ID_PATTERN.test(tenantId) || !isKind(kind)) throw new NotFoundError(`no webhook route ${req.path}`);
  return [tenantId, kind];
}

/** A body the intake could not read, as the provider's problem (webhook-payload-invalid); null for any other error. */
function unreadableBody(err: unknown): WebhookRejectedError | null {
  const e = err as { type?: unknown; encoding?: unknown; code?: unknown };
  if (e.type === 'encoding.unsupported')
    return new WebhookRejectedError(
      'webhook-payload-invalid',
      `the body's Content-Encoding "${String(e.encoding)}" is not one the intake reads (gzip, deflate, br)`,
    );
  // zlib's errors (Z_DATA_ERROR, Z_BUF_ERROR, ERR_BROTLI_...): what the sender compressed does not inflate
  if (typeof e.code === 'string' && /^(Z_|ERR_BROTLI|ERR_ZLIB)/.test(e.code))
    return new WebhookRejectedError('webhook-payload-invalid', 'the compressed body does not inflate with its Content-Encoding');
  return null;
}

export function webhookIntakeRouter(engine: Engine): Router {
  const router = Router();
  // every content type is read as bytes, inflated if the sender compressed it, never parsed here
  const rawSmall = express.raw({ type: () => true, limit: BODY_LIMIT_BYTES.codehost });
  const rawLarge = express.raw({ type: () => true, limit: BODY_LIMIT_BYTES.email });

  // one handler, not three: the intake is the hottest route, and each layer Express walks costs
  router.post('/webhooks/:tenant_id/:kind', (req: Request, res: Response, next: NextFunction) => {
    const [tenantId, kind] = intakeOf(req);
    if (refuseDeclaredOver(BODY_LIMIT_BYTES[kind], req, res, next)) return;
    const declared = Number(req.headers['content-length']) || 0;
    // a tenant without the kind's secret, a signature header missing, email credentials that are wrong: refused
    // as soon as the headers say so (an email body is up to 25 MB, and anyone can send one)
    engine.webhooks.refuseByHeaders(tenantId, kind, req.headers, declared).then(
      () => read(tenantId, kind, req, res, next),
      (err: unknown) => {
        // refused before its body is read: the connection closes after the answer (the body is never read)
        res.setHeader('Connection', 'close');
        next(err);
      },
    );
  });
  // the intake's path takes POST only: any other method is told so, as the API's paths tell it (405, Allow)
  router.all('/webhooks/:tenant_id/:kind', (req: Request) => {
    intakeOf(req);
    throw Object.assign(new Error(`${req.method} method not allowed`), { status: 405, headers: { Allow: 'POST' } });
  });

  /** Reads the body as bytes (inflated if compressed) and hands it to the intake. */
  function read(tenantId: string, kind: WebhookProvider, req: Request, res: Response, next: NextFunction): void {
    (kind === 'email' ? rawLarge : rawSmall)(req, res, (err?: unknown) => {
      if (err) {
        const unreadable = unreadableBody(err);
        if (!unreadable) return next(err);
        return void engine.webhooks.refuseUnreadable(tenantId, kind, req.headers, Number(req.headers['content-length']) || 0, unreadable).catch(next);
      }
      const body = Buffer.isBuffer(req.body) ? req.body : Buffer.alloc(0);
      engine.webhooks.receive(tenantId, kind, req.headers, body).then((receipt) => {
        if (receipt.delivery_id) res.setHeader('X-Delivery-Id', receipt.delivery_id);
        res.statusCode = receipt.status;
        // written directly: a provider never revalidates an acknowledgement, so no ETag is computed
        if (receipt.body) res.setHeader('Content-Type', 'application/json; charset=utf-8').end(JSON.stringify(receipt.body));
        else res.end();
      }, next);
    });
  }
  return router;
}

type DeliveriesQuery = NonNullable<operations['listWebhookDeliveries']['parameters']['query']>;
type DeliveriesPage = operations['listWebhookDeliveries']['responses']['200']['content']['application/json'];
type SecretPut = operations['putWebhookSecret']['requestBody']['content']['application/json'];

export function webhookSecretsRouter(engine: Engine): Router {
  const router = Router();
  router.get('/', async (req, res) => {
    res.json({ data: await engine.webhooks.secrets.list(tenantOf(req)) });
  });
  router.put('/:kind', async (req, res) => {
    const body = req.body as SecretPut;
    res.json(await engine.webhooks.secrets.put(tenantOf(req), req.params.kind as WebhookProvider, body.secrets));
  });
  router.delete('/:kind', async (req, res) => {
    await engine.webhooks.secrets.delete(tenantOf(req), req.params.kind as WebhookProvider);
    res.status(204).end();
  });
  return router;
}

export function webhookDeliveriesRouter(engine: Engine): Router {
  const router = Router();
  router.get('/', async (req, res) => {
    const q = req.query as DeliveriesQuery;
    const page = await engine.webhooks.list(tenantOf(req), { kind: q.kind, status: q.status, limit: q.limit ?? 20, cursor: q.cursor });
    // summaries: a delivery's body and event are answered by GET /{id} only (a page of them was up to 188 MB)
    const answer: DeliveriesPage = { data: page.items, next_cursor: page.next_cursor };
    res.json(answer);
  });
  router.get('/:id', async (req, res) => {
    res.json(await engine.webhooks.get(tenantOf(req), String(req.params.id)));
  });
  router.post('/:id/replay', async (req, res) => {
    res.json(await engine.webhooks.replay(tenantOf(req), String(req.params.id)));
  });
  return router;
}
