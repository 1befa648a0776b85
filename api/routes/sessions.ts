// /api/v1/sessions: sessions, their agents, their message log, their runs and their live trace.
import { Router, type Request } from 'express';
import type { Engine } from '../../engine/index.js';
import { scopes, TaskGraphInvalidError, TRIED_AFTER_COMMIT_MS, ValidationError, type EventHub, type FieldError } from '../../engine/platform/index.js';
import { tenantOf } from '../auth.js';
import type { components, operations } from '../schema.js';
import { lastEventIdOf, streamEvents, type OpenStreams } from '../sse.js';
import { runListView } from '../views.js';

type Schemas = components['schemas'];
const idOf = (req: Request) => String(req.params.id);
const location = (id: string) => `/api/v1/sessions/${id}`;

export function sessionsRouter(engine: Engine, opts: { hub: EventHub; heartbeatMs: number; streams: OpenStreams }): Router {
  const router = Router();
  const { sessions } = engine;

  router.get('/', async (req, res) => {
    const q = req.query as NonNullable<operations['listSessions']['parameters']['query']>;
    const page = await sessions.list(tenantOf(req), q);
    res.json({ data: await Promise.all(page.items.map(sessions.view)), next_cursor: page.next_cursor });
  });

  router.post('/', async (req, res) => {
    const created = await sessions.create(tenantOf(req), (req.body ?? {}) as Schemas['SessionCreate']);
    res
      .status(201)
      .location(location(created.id))
      .json(await sessions.view(created));
  });

  router.get('/:id', async (req, res) => {
    const detail = await sessions.detail(tenantOf(req), idOf(req));
    res.json({ ...detail, runs: detail.runs.map((r) => runListView(r, engine.runs)) });
  });

  router.patch('/:id', async (req, res) => {
    res.json(await sessions.view(await sessions.update(tenantOf(req), idOf(req), req.body as Schemas['SessionPatch'])));
  });

  router.delete('/:id', async (req, res) => {
    res.json(await sessions.view(await sessions.archive(tenantOf(req), idOf(req))));
  });

  router.get('/:id/agents', async (req, res) => {
    res.json({ data: await sessions.agents(tenantOf(req), idOf(req)) });
  });

  router.post('/:id/agents', async (req, res) => {
    const agent = await sessions.addAgent(tenantOf(req), idOf(req), req.body as Schemas['AgentCreate']);
    res
      .status(201)
      .location(`${location(agent.session_id)}/agents/${agent.id}`)
      .json(agent);
  });

  router.get('/:id/agents/:agent_id', async (req, res) => {
    res.json(await sessions.agent(tenantOf(req), idOf(req), String(req.params.agent_id)));
  });

  router.patch('/:id/agents/:agent_id', async (req, res) => {
    res.json(await sessions.updateAgent(tenantOf(req), idOf(req), String(req.params.agent_id), req.body as Schemas['AgentPatch']));
  });

  router.get('/:id/tasks', async (req, res) => {
    const page = await sessions.tasks(tenantOf(req), idOf(req), req.query as { limit?: number; cursor?: string });
    res.json({ data: page.items, next_cursor: page.next_cursor });
  });

  router.post('/:id/tasks', async (req, res) => {
    const body = req.body as Schemas['TaskCreate'];
    const batch = 'tasks' in body && Array.isArray(body.tasks) ? body.tasks : null;
    const inputs = batch ?? [body as Schemas['TaskInput']];
    try {
      res.status(201).json({ data: await sessions.addTasks(tenantOf(req), idOf(req), inputs) });
    } catch (err) {
      throw batch ? err : asSingleTask(err);
    }
  });

  router.get('/:id/messages', async (req, res) => {
    const q = req.query as { limit?: number; cursor?: string };
    const page = await sessions.messages(tenantOf(req), idOf(req), { limit: q.limit, afterSeq: q.cursor ? Number(q.cursor) : undefined });
    res.json({ data: page.items, next_cursor: page.next_cursor });
  });

  router.post('/:id/messages', async (req, res) => {
    res.status(201).json(await sessions.postMessage(tenantOf(req), idOf(req), req.body as Schemas['MessageCreate']));
  });

  router.get('/:id/runs', async (req, res) => {
    const page = await sessions.runs(tenantOf(req), idOf(req), req.query as { limit?: number; cursor?: string });
    res.json({ data: page.items.map((r) => runListView(r, engine.runs)), next_cursor: page.next_cursor });
  });

  router.get('/:id/trace', async (req, res) => {
    const id = idOf(req);
    const session = await sessions.get(tenantOf(req), id);
    const scope = scopes.sessionTrace(id);
    const afterId = lastEventIdOf(req);
    await streamEvents(req, res, {
      streams: opts.streams,
      tenantId: tenantOf(req),
      hub: opts.hub,
      scope,
      afterId,
      heartbeatMs: opts.heartbeatMs,
      // archived with its outcome: the trace's last event is in the log. That event can be read a moment
      // before the session's record is committed, so a client naming it as its last has seen the end too
      // (an archived session never changes again)
      ended: (session.status === 'archived' && session.outcome !== null) || (await opts.hub.isAt(scope.stream, afterId, (e) => scope.isLast(e))),
      // an end the log will not get (its append refused past its retries while the trace was open) ends the trace
      // once those retries are over, asked at each heartbeat, as a run's stream ends: else it stayed open for good
      stillThere: async (lastSent) => {
        const now = await sessions.get(tenantOf(req), id).catch(() => null);
        const triedOut = now?.status === 'archived' && now.outcome !== null && Date.parse(now.updated_at) < Date.now() - TRIED_AFTER_COMMIT_MS;
        return !triedOut || opts.hub.anyAfter(scope.stream, lastSent, (e) => scope.isLast(e));
      },
    });
  });

  return router;
}

/**
 * The engine names a task's fields as a batch's (`/body/tasks/0/...`, the batch itself `/body/tasks`); a request
 * that sent one task has them at `/body/...`, and its errors point there, as the schema's own do.
 */
function asSingleTask(err: unknown): unknown {
  if (!(err instanceof TaskGraphInvalidError || err instanceof ValidationError)) return err;
  const errors: FieldError[] = err.errors.map((e) => ({ ...e, path: e.path.replace(/^\/body\/tasks(\/0)?(?=\/|$)/, '/body') }));
  const message = errors.map((e) => `${e.path}: ${e.message}`).join('; ');
  return err instanceof TaskGraphInvalidError ? new TaskGraphInvalidError(message, errors) : new ValidationError(message, errors);
}
