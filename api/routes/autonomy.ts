// /api/v1/autonomy: autonomy and vibe runs, their SSE streams, reliability hints, gate readiness and
// evidence packs.
import { Router, type Request, type Response } from 'express';
import { isTerminal, scopes, type EventHub, type RunKind } from '../../engine/platform/index.js';
import type { Engine } from '../../engine/index.js';
import { packTar } from '../../engine/evidence/index.js';
import type { RunRequest } from '../../engine/runs/index.js';
import { tenantOf } from '../auth.js';
import type { components } from '../schema.js';
import { lastEventIdOf, streamEvents, type OpenStreams } from '../sse.js';
import { acceptRun, idempotencyKeyOf, runLocation } from './runs.js';

type AutonomyRunRequest = components['schemas']['AutonomyRunRequest'];

export type AutonomyWork = Omit<AutonomyRunRequest, 'stream'>;

/**
 * Stores an autonomy or vibe run started over HTTP (the request's Idempotency-Key returns an earlier one
 * whose `fingerprint` matches); its session record is stored with it. The voice route starts runs here too.
 */
export function startAutonomyRun(engine: Engine, req: Request, kind: RunKind, work: AutonomyWork, fingerprint: unknown = { kind, work }) {
  return engine.runs.createIdempotent(tenantOf(req), idempotencyKeyOf(req), fingerprint, autonomyRunRequest(req, kind, work));
}

/** The engine's request for an autonomy or vibe run asked for over HTTP. */
export function autonomyRunRequest(req: Request, kind: RunKind, work: AutonomyWork): RunRequest {
  return {
    kind,
    goal: work.goal,
    steps: work.steps?.map((s) => ({ ...s, args: s.args ?? {} })),
    tool_allowlist: work.tools,
    workspace: work.workspace,
    budget_seconds: work.budget_seconds,
    max_steps: work.max_steps,
    retry: work.retry,
    network: work.network,
    connections: work.connections,
    gates: work.gates,
    inputs: work.inputs,
    trigger: { type: 'api', request_id: String(req.id) },
    request_id: String(req.id),
  };
}

export function autonomyRouter(engine: Engine, opts: { hub: EventHub; heartbeatMs: number; streams: OpenStreams }): Router {
  const router = Router();

  const watch = (
    req: Request,
    res: Response,
    sessionId: string,
    afterId: string,
    extra: { status?: number; headers?: Record<string, string>; ended?: boolean } = {},
  ) =>
    streamEvents(req, res, {
      streams: opts.streams,
      hub: opts.hub,
      scope: scopes.runSession(sessionId),
      afterId,
      heartbeatMs: opts.heartbeatMs,
      ...extra,
    });

  const start = (kind: RunKind) => async (req: Request, res: Response) => {
    const { stream, ...work } = req.body as AutonomyRunRequest;
    const { run, replayed } = await startAutonomyRun(engine, req, kind, work);
    if (stream) await watch(req, res, run.session_id, '0-0', { headers: { Location: runLocation(run.id) } });
    else acceptRun(res, engine, run, replayed);
  };

  router.post('/run', start('autonomy'));
  router.post('/vibe/run', start('vibe'));

  router.get('/streaming/:session_id/events', async (req, res) => {
    const sessionId = String(req.params.session_id);
    const run = await engine.runs.sessionRun(tenantOf(req), sessionId);
    // The stream has ended (a reconnect past its end is a 204) once the store says its work has ended and
    // the log holds the end: a session's outcome (autonomy, vibe, a multi-agent session's tasks), or the
    // run's own status for a run with no session record (an automation's). The store is written before the
    // log: a run.finished still to be appended (Redis refused it; it is retried) keeps the stream open for
    // it. A log that expired whole has nothing left to send.
    const session = await engine.sessions.get(tenantOf(req), sessionId).catch(() => null);
    const scope = scopes.runSession(sessionId);
    const ended =
      (session ? session.outcome !== null : isTerminal(run.status)) &&
      ((await opts.hub.anyAfter(scope.stream, '0-0', scope.isLast)) || (await opts.hub.lastId(scope.stream)) === '0-0');
    await watch(req, res, sessionId, lastEventIdOf(req), { ended });
  });

  router.get('/reliability-context', async (req, res) => {
    res.json(await engine.runs.reliabilityContext(tenantOf(req)));
  });

  router.get('/smart-gates', async (req, res) => {
    const q = req.query as { workspace?: string };
    res.json(await engine.smartGates.snapshot(tenantOf(req), q.workspace));
  });

  router.get('/evidence-pack', async (req, res) => {
    const q = req.query as { workspace?: string; subject?: string; since?: string; format?: 'json' | 'tar' };
    const built = await engine.evidencePacks.build(tenantOf(req), { workspace: q.workspace, subject: q.subject, since: q.since });
    if (q.format !== 'tar') {
      res.json(built.pack);
      return;
    }
    const head = built.pack.statement.predicate.ledger!;
    res
      .type('application/x-tar')
      .set('content-disposition', `attachment; filename="evidence-${head.from_seq}-${head.to_seq}.tar"`)
      .send(await packTar(built.pack, built.entries, built.payloads));
  });

  return router;
}
