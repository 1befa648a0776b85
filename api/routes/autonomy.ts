// /api/v1/autonomy: autonomy and vibe runs, their SSE streams, reliability hints, gate readiness and
// evidence packs.
import { pipeline } from 'node:stream/promises';
import { Router, type Request, type Response } from 'express';
import { isTerminal, scopes, TRIED_AFTER_COMMIT_MS, type EventHub, type Run, type RunKind, type Session } from '../../engine/platform/index.js';
import type { Engine } from '../../engine/index.js';
import { packTar } from '../../engine/evidence/index.js';
import type { RunRequest } from '../../engine/runs/index.js';
import { tenantOf } from '../auth.js';
import type { components } from '../schema.js';
import { lastEventIdOf, streamEvents, type OpenStreams, type SseOptions } from '../sse.js';
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

/** The most runs of a multi-agent session whose ends a reconnect to its run-session stream looks for. */
const MAX_ENDS_READ = 2000;

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
    extra: Pick<SseOptions, 'status' | 'headers' | 'ended' | 'place' | 'stillThere' | 'fresh'> = {},
  ) =>
    streamEvents(req, res, {
      streams: opts.streams,
      tenantId: tenantOf(req),
      hub: opts.hub,
      scope: scopes.runSession(sessionId),
      afterId,
      heartbeatMs: opts.heartbeatMs,
      ...extra,
    });

  /** The store's end of the stream's work is older than the retries of its last event's append: that event will not come. */
  const endTriedOut = (session: Session | null, run: Run) => Date.parse(session?.updated_at ?? run.finished_at ?? '') < Date.now() - TRIED_AFTER_COMMIT_MS;
  /**
   * An end the log will not get (lost with Redis's later data, or refused past its retries while the stream was
   * open) ends the stream when its retries are over: asked at each heartbeat, else it stayed open for good. An end
   * still ahead of what this reader was sent is the stream's to reach (a long replay of an old run is not cut
   * short); one behind it (read before the session took its outcome) is no end to wait for.
   */
  const stillThereOf =
    (tenantId: string, sessionId: string) =>
    async (lastSent: string): Promise<boolean> => {
      const scope = scopes.runSession(sessionId);
      const [now, nowRun] = await Promise.all([engine.sessions.get(tenantId, sessionId).catch(() => null), engine.runs.sessionRun(tenantId, sessionId)]);
      if (!((now ? now.outcome !== null : isTerminal(nowRun.status)) && endTriedOut(now, nowRun))) return true;
      return opts.hub.anyAfter(scope.stream, lastSent, (e) => scope.isLast(e));
    };

  const start = (kind: RunKind) => async (req: Request, res: Response) => {
    const { stream, ...work } = req.body as AutonomyRunRequest;
    // a tenant at its streams' limit is refused before a run is started for a stream it would not get: the
    // stream's place is taken first (given back by the stream, or below when no stream follows)
    const place = stream ? opts.streams.enter(tenantOf(req)) : undefined;
    let started: Awaited<ReturnType<typeof startAutonomyRun>>;
    try {
      started = await startAutonomyRun(engine, req, kind, work);
    } catch (err) {
      place?.();
      throw err;
    }
    const { run, replayed } = started;
    if (!place) return acceptRun(res, engine, run, replayed);
    try {
      await watch(req, res, run.session_id, '0-0', {
        headers: { Location: runLocation(run.id), ...(replayed ? { 'Idempotent-Replayed': 'true' } : {}) },
        place,
        // a run made by this request: its log is new (a replayed one's may be long, and trimmed)
        fresh: !replayed,
        // a replayed run's end lost with Redis's data, or this run's refused past its retries: the stream ends, as a GET's does
        stillThere: stillThereOf(run.tenant_id, run.session_id),
      });
    } catch (err) {
      // the run is stored and will run: a stream that could not open (Redis not answering, for a replayed run) is
      // answered as the request without `stream` is, 202 with the run and its events_url, not a 503 whose retry
      // starts another
      if (res.headersSent) throw err;
      acceptRun(res, engine, run, replayed);
    }
  };

  router.post('/run', start('autonomy'));
  router.post('/vibe/run', start('vibe'));

  /** The runs whose ends a run session's stream carries: a multi-agent session's (every task's run, up to MAX_ENDS_READ), or its one run. */
  const endedRuns = async (run: Run, session: { kind: string } | null): Promise<string[]> => {
    if (session?.kind !== 'multi_agent') return [run.id];
    const ids: string[] = [];
    for (let cursor: string | undefined; ids.length < MAX_ENDS_READ;) {
      const page = await engine.runs.list(run.tenant_id, { session_id: run.session_id, limit: 100, cursor });
      ids.push(...page.items.map((r) => r.id));
      if (!page.next_cursor) break;
      cursor = page.next_cursor;
    }
    return ids;
  };
  /** True when the log holds the run.finished of each of `runIds` (read newest first, until all are found). */
  const logHoldsEnds = (stream: string, runIds: string[]): Promise<boolean> => {
    const missing = new Set(runIds);
    return opts.hub.anyAfter(stream, '0-0', (e) => {
      if (e.type === 'run.finished' && e.run_id) missing.delete(e.run_id);
      return missing.size === 0;
    });
  };

  router.get('/streaming/:session_id/events', async (req, res) => {
    const sessionId = String(req.params.session_id);
    const run = await engine.runs.sessionRun(tenantOf(req), sessionId);
    // The stream has ended (a reconnect past its end is a 204) once the store says its work has ended and
    // the log holds its end: a session's outcome (autonomy, vibe, a multi-agent session's tasks), or the
    // run's own status for a run with no session record (an automation's); the run.finished of its run, or of
    // each run of a multi-agent session. The store is written before the log: a run.finished still to be
    // appended (Redis refused it; it is retried) keeps the stream open for it. A log that expired whole has
    // nothing left to send.
    const session = await engine.sessions.get(tenantOf(req), sessionId).catch(() => null);
    const scope = scopes.runSession(sessionId);
    const storeEnded = session ? session.outcome !== null : isTerminal(run.status);
    const ended =
      storeEnded &&
      (endTriedOut(session, run) || (await logHoldsEnds(scope.stream, await endedRuns(run, session))) || (await opts.hub.lastId(scope.stream)) === '0-0');
    await watch(req, res, sessionId, lastEventIdOf(req), { ended, stillThere: stillThereOf(tenantOf(req), sessionId) });
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
    const tenantId = tenantOf(req);
    const built = await engine.evidencePacks.build(tenantId, { workspace: q.workspace, subject: q.subject, since: q.since });
    if (q.format !== 'tar') {
      res.json(built.pack);
      return;
    }
    const head = built.pack.statement.predicate.ledger!;
    res.type('application/x-tar').set('content-disposition', `attachment; filename="evidence-${head.from_seq}-${head.to_seq}.tar"`);
    // HEAD: the headers a GET would get, without reading a payload for a body Node would drop
    if (req.method === 'HEAD') return void res.end();
    // streamed as the client takes it (hundreds of megabytes of artifacts at most): a client that goes away
    // destroys the tar, which stops the reads (problem.ts logs the client gone). A tar that fails midway cuts
    // the connection, so that no unfinished tar looks whole; problem.ts would take that for a client gone too.
    await pipeline(packTar(built.pack, built.entries, engine.evidencePacks.payloadsOf(tenantId, built)), res).catch((err: unknown) => {
      if ((err as { code?: unknown }).code === 'ERR_STREAM_PREMATURE_CLOSE') throw err;
      req.log.error({ err }, 'the evidence pack failed midway: its connection was cut');
    });
  });

  return router;
}
