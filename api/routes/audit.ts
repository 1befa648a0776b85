// /api/v1/autonomy/workspace-audit: run the audit and answer its report (or a 202 past the timeout),
// stream it per phase (resumable: the event ids name the report), and fetch a recent report.
import { Ajv2020, type ValidateFunction } from 'ajv/dist/2020.js';
import { Router, type Request, type Response } from 'express';
import { scopes, unsafeJson, ValidationError, type AuditPhase, type EventHub } from '../../engine/platform/index.js';
import type { Engine } from '../../engine/index.js';
import { tenantOf } from '../auth.js';
import type { components } from '../schema.js';
import { loadSpec } from '../spec.js';
import { lastEventIdOf, streamEvents, type OpenStreams } from '../sse.js';

type AuditRequest = components['schemas']['AuditRequest'];

const BASE = '/api/v1/autonomy/workspace-audit';
const DEFAULT_TIMEOUT_SECONDS = 30;

const rootOf = (req: Request) => {
  const header = req.headers['x-service-workspace-root'];
  return typeof header === 'string' ? header : undefined;
};

/**
 * The stream's `layers` query, parsed, held to the schema the POST's `layers` is (AuditRequest's): a query
 * parameter of type string is all the request validator checks, so an empty list, 60 layers or unknown fields
 * started an audit the POST refuses.
 */
function layersOfQuery(text: string | undefined): AuditRequest['layers'] {
  if (text === undefined) return undefined;
  // the checks every JSON body gets (depth, lone surrogates, numbers past a double), as the POST's layers get them
  const unsafe = unsafeJson(Buffer.from(text), 'the layers query');
  if (unsafe) throw new ValidationError(`layers: ${unsafe.detail}`, [{ path: '/query/layers', message: unsafe.rule }]);
  let layers: unknown;
  try {
    layers = JSON.parse(text);
  } catch {
    throw new ValidationError('layers: not valid JSON', [{ path: '/query/layers', message: 'must be a JSON list of layers' }]);
  }
  validateLayers ??= new Ajv2020({ allErrors: true, strict: false }).compile({
    $ref: '#/components/schemas/AuditRequest/properties/layers',
    components: loadSpec().components,
  });
  if (!validateLayers(layers))
    throw new ValidationError(
      'layers: not valid',
      (validateLayers.errors ?? []).map((e) => ({ path: `/query/layers${e.instancePath}`, message: e.message ?? 'is not valid' })),
    );
  return layers as AuditRequest['layers'];
}
let validateLayers: ValidateFunction | undefined;

/** `closing`: aborted when the server closes (a long-poll then answers its 202 at once, as past its timeout). */
export function auditRouter(engine: Engine, opts: { hub: EventHub; heartbeatMs: number; streams: OpenStreams; closing: AbortSignal }): Router {
  const router = Router();

  router.post('/workspace-audit/run', async (req, res) => {
    const body = (req.body ?? {}) as AuditRequest;
    const tenantId = tenantOf(req);
    const started = await engine.audits.start(tenantId, {
      root: rootOf(req),
      workspace: body.workspace,
      phases: body.phases,
      layers: body.layers,
      trigger: { type: 'api', request_id: String(req.id) },
    });
    // the wait ends with the client (a closed connection stops waiting) or with the server: closing, it answers
    // the 202 now, where the client can fetch the report from another instance; the audit goes on either way.
    // Left waiting, the answer was cut at the end of the grace period, its report id never told.
    const gone = new AbortController();
    res.on('close', () => gone.abort());
    if (req.socket.destroyed) gone.abort();
    const report = await engine.audits.wait(tenantId, started.report_id, {
      timeoutMs: (body.timeout_seconds ?? DEFAULT_TIMEOUT_SECONDS) * 1000,
      signal: AbortSignal.any([gone.signal, opts.closing]),
      keepRunning: true,
    });
    if (report.status !== 'running') {
      res.json(report);
      return;
    }
    const location = `${BASE}/${report.report_id}`;
    res
      .status(202)
      .location(location)
      // this audit's stream from its start: a first connection cannot send Last-Event-ID, and without one the
      // stream starts another audit
      .json({
        report_id: report.report_id,
        status: 'running',
        location,
        stream: `${BASE}/stream?last_event_id=${report.report_id}/0-0`,
        phases: report.phases,
      });
  });

  router.get('/workspace-audit/stream', async (req, res) => {
    const tenantId = tenantOf(req);
    // a tenant at its streams' limit is refused before an audit is started for a stream it would not get: the
    // stream's place is taken first (given back by the stream, or at the end here when no stream follows)
    const place = opts.streams.enter(tenantId);
    try {
      await auditStream(req, res, tenantId, place);
    } catch (err) {
      place();
      throw err;
    }
  });

  /** The audit stream's answer: `place` is the tenant's place for it, given back here when no stream follows. */
  async function auditStream(req: Request, res: Response, tenantId: string, place: () => void) {
    const resumeFrom = lastEventIdOf(req);
    let reportId: string;
    let afterId = '0-0';
    if (resumeFrom !== '0-0') {
      // a reconnecting client: its audit, where it left off (the validator checked the id's shape)
      [reportId, afterId] = resumeFrom.split('/') as [string, string];
      // a client that saw the report reconnects as EventSource does after any close: 204 tells it to stop
      if (!(await engine.audits.hasMore(tenantId, reportId, afterId))) {
        place();
        res.status(204).end();
        return;
      }
    } else {
      // HEAD is safe: a link checker or `curl -I` starts no audit. It gets the stream's headers, no report id
      if (req.method === 'HEAD') {
        place();
        res.status(200).set({ 'Content-Type': 'text/event-stream; charset=utf-8', 'Cache-Control': 'no-cache, no-transform' }).end();
        return;
      }
      const q = req.query as { workspace?: string; phases?: AuditPhase[]; layers?: string };
      reportId = (
        await engine.audits.start(tenantId, {
          root: rootOf(req),
          workspace: q.workspace,
          workspaceAt: '/query/workspace',
          phases: q.phases,
          layers: layersOfQuery(q.layers),
          layersAt: '/query/layers',
          trigger: { type: 'api', request_id: String(req.id) },
        })
      ).report_id;
    }
    await streamEvents(req, res, {
      streams: opts.streams,
      tenantId: tenantOf(req),
      hub: opts.hub,
      scope: scopes.audit(reportId),
      afterId,
      heartbeatMs: opts.heartbeatMs,
      headers: { 'X-Report-Id': reportId, 'Content-Location': `${BASE}/${reportId}` },
      place,
      // a report gone before its end (Redis lost it) will never end the stream: it ends, and a reconnect is told so;
      // one finished whose end the log lacks is given it, and the stream ends with it
      stillThere: () => engine.audits.stillThere(tenantId, reportId),
    });
  }

  router.get('/workspace-audit/:report_id', async (req, res) => {
    res.json(await engine.audits.get(tenantOf(req), String(req.params.report_id)));
  });

  return router;
}
