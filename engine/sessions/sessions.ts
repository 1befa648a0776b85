// Sessions: the record every run streams into (kind `autonomy`/`vibe`, one per run made through the
// autonomy routes) and multi-agent sessions (kind `multi_agent`) with agents and a durable message log.
// An archived session is read-only. Every change is a conditional update and a `session.updated` event.
import type { Platform } from '../deps.js';
import {
  ConflictError,
  ValidationError,
  newId,
  pruneInPages,
  NotFoundError,
  afterStored,
  redisOrUnavailable,
  sha256Hex,
  MESSAGE_TEXT_MAX,
  scopes,
  untilTaken,
  type AgentRecord,
  type Budget,
  type MessagePart,
  type MessageRecord,
  type NewEvent,
  type Run,
  type Session,
  type SessionOutcome,
  type SessionStatus,
  type TaskRecord,
  type TaskStatus,
  type ToolName,
} from '../platform/index.js';
import { allowlistOf, budgetTooLong, IDEMPOTENCY_TTL_SECONDS, type RunLimits, type Runs, type ToolPolicy } from '../runs/index.js';
import { decodeCursor, encodeCursor, type AgentMembers, type NewMessage, type Page, type SessionQuery } from '../store/index.js';
import { ToolError, type SessionActions } from '../tools/index.js';
import { dagOrder } from './dag.js';
import { dagStateOf } from './dag-state.js';
import { assertMultiAgent, longer, TASK_LIMITS, tasksOf, type TaskInput } from './tasks.js';

export type SessionsDeps = Pick<Platform, 'store' | 'clock' | 'log' | 'events' | 'redis' | 'queues'> & {
  runs: Runs;
  limits: RunLimits;
  settings: ToolPolicy & {
    agent: unknown;
    sessionMaxTasks: number;
    sessionMaxAgents: number;
    /** days an archived session is kept once its work has ended (SERVICE_RUNS_KEPT_DAYS); 0 or absent: for good */
    runsKeptDays?: number;
  };
};

const LIVE: SessionStatus[] = ['idle', 'running', 'waiting', 'paused'];

/** How many writes one recount makes at most before it leaves the session to the next recount (or the reconciler). */
const RECOUNT_TRIES = 5;

/** Stale sessions the reconciler reads at a time, and at most in one pass of each status (the next pass goes on from there). */
const STALE_SESSIONS_PAGE = 200;
const STALE_SESSIONS_PER_PASS = 5 * STALE_SESSIONS_PAGE;
/** An agent's inbox is read this many messages a page, up to this many pages before a model call. */
const INBOX_PAGE = 200;
const INBOX_PAGES = 50;

/** Runs made through the autonomy routes have a session of their own. */
const hasRunSession = (run: Run): run is Run & { kind: 'autonomy' | 'vibe' } => run.kind === 'autonomy' || run.kind === 'vibe';

const OUTCOME_OF_RUN: Record<string, SessionOutcome> = { succeeded: 'succeeded', failed: 'failed', timed_out: 'failed', canceled: 'canceled' };

export function sessionsOf(deps: SessionsDeps) {
  const { store, clock, events, runs } = deps;
  /** where the reconciler's last pass stopped reading stale sessions, by status */
  const staleAfter: Record<'running' | 'waiting', { updated_at: string; id: string } | undefined> = { running: undefined, waiting: undefined };

  async function mustGet(tenantId: string, id: string): Promise<Session> {
    const s = await store.sessions.get(tenantId, id);
    if (!s) throw new NotFoundError(`no session ${id}`);
    return s;
  }

  /** A session that may still change: archived ones answer 409. */
  const archivedError = (id: string) => new ConflictError(`session ${id} is archived and read-only`, { status: 'archived' });

  async function mustBeLive(tenantId: string, id: string): Promise<Session> {
    const s = await mustGet(tenantId, id);
    if (s.status === 'archived') throw archivedError(id);
    return s;
  }

  /** The session a message may be posted to (the caller's, multi-agent, not archived), with `to` one of its agents. */
  async function assertCanPost(tenantId: string, sessionId: string, to?: string | null): Promise<Session> {
    const session = await mustBeLive(tenantId, sessionId);
    // only a session task's run reads an inbox: a message to a run's session would be stored for nobody
    assertMultiAgent(session, 'messages');
    if (to && !(await store.agents.get(tenantId, sessionId, to))) throw new NotFoundError(`no agent ${to} in session ${sessionId}`);
    return session;
  }

  /** The event of a change already stored (a session's, a message's): a Redis away holds the caller no longer than its deadline. */
  const appendStored = async (sessionId: string, event: NewEvent): Promise<void> =>
    void (await afterStored(
      events.append(scopes.sessionTrace(sessionId).stream, event),
      deps.log,
      { session_id: sessionId, type: event.type },
      'a session event',
    ));

  const emit = (s: Session): Promise<void> => {
    const event: NewEvent = {
      type: 'session.updated',
      tenant_id: s.tenant_id,
      session_id: s.id,
      data: { status: s.status, outcome: s.outcome, title: s.title },
    };
    if (s.status !== 'archived' || s.outcome === null) return appendStored(s.id, event);
    // the trace's last event (an archived session never changes again): one Redis refused is tried again, as a
    // run's are, or the trace's readers would wait for it until the route gives up on it (TRIED_AFTER_COMMIT_MS)
    const about = { session_id: s.id, type: event.type };
    const append = () => events.append(scopes.sessionTrace(s.id).stream, event);
    const appended = append().catch((err: Error) => {
      deps.log.warn({ ...about, err: err.message }, 'Redis did not take the last event of a session; trying again');
      return untilTaken(append, deps.log, about, false);
    });
    return afterStored(appended, deps.log, about, 'a session event').then(() => undefined);
  };

  async function change(
    tenantId: string,
    id: string,
    changes: Partial<Session>,
    ifStatusIn: SessionStatus[],
    ifOutcome?: Session['outcome'],
  ): Promise<Session | null> {
    const updated = await store.sessions.update(tenantId, id, { ...changes, updated_at: clock.now().toISOString() }, ifStatusIn, ifOutcome);
    if (updated) await emit(updated);
    return updated;
  }

  /**
   * A multi-agent session's status and outcome follow its tasks. Its write is conditional on the status it
   * read, not on the counts: a recount whose counts were read before another change of the tasks (one
   * added, one ended) can land after that change's own recount, which found nothing to write, and leave
   * the session idle with a task running. So a recount that wrote reads again, until what it reads is what
   * the session says (every change of the tasks is followed by a recount of its own, so the last write is
   * always checked against the counts after it). It is conditional on the outcome it read too: two recounts
   * at once that read the same would both write it, and the trace got its end (an archived session's
   * outcome) twice.
   */
  async function recount(tenantId: string, sessionId: string): Promise<void> {
    for (let i = 0; i < RECOUNT_TRIES; i++) {
      const s = await store.sessions.get(tenantId, sessionId);
      if (!s || s.kind !== 'multi_agent') return;
      const counts = await store.tasks.counts(tenantId, sessionId);
      const counted = tasks.statusOf(s, counts);
      // an archived session stays archived and gets its outcome once every task has ended
      const next = s.status === 'archived' ? { status: s.status, outcome: counted.outcome } : counted;
      if (next.status === s.status && next.outcome === s.outcome) return;
      await change(tenantId, sessionId, next, [s.status], s.outcome);
    }
  }

  const tasks = tasksOf({ ...deps, dag: dagStateOf(deps.redis, deps.queues.prefix), recount, emitSession: emit });

  // a run session follows its run: running while it runs, idle with the run's outcome once it ends. It
  // is the session of that one run (made with it; a PATCH cannot pause it), so only an archived one, or
  // one already ended by a repeat of this hook, is not running: one conditional write, nothing read first.
  // An archived one stays archived and takes the outcome
  async function followRun(run: Run): Promise<void> {
    if (!hasRunSession(run)) return;
    const outcome = OUTCOME_OF_RUN[run.status] ?? null;
    // archived: once (no outcome yet), so that a repeat of the hook does not end the session's trace again
    if (!(await change(run.tenant_id, run.session_id, { status: 'idle', outcome }, ['running'])))
      await change(run.tenant_id, run.session_id, { outcome }, ['archived'], null);
  }
  // repeatable: a conditional write; a run's end whose process died before this hook ran leaves the session
  // running for good otherwise (nothing else moves a run session)
  runs.onRunFinished(followRun, { repeatable: true });

  // an autonomy or vibe run has a session of its own, stored in the same commit as the run (a commit after it when
  // the run takes an Idempotency-Key: a run another request's key refuses leaves no session behind)
  runs.storeWithRun(async (run) => {
    if (!hasRunSession(run)) return;
    const title = run.goal ? run.goal.split('\n')[0]!.slice(0, 200) : `${run.plan?.length ?? 0} step${run.plan?.length === 1 ? '' : 's'}`;
    await store.sessions.insert({
      id: run.session_id,
      tenant_id: run.tenant_id,
      title,
      goal: run.goal,
      kind: run.kind,
      status: 'running',
      outcome: null,
      metadata: { run_id: run.id },
      created_at: run.created_at,
      updated_at: run.created_at,
    });
  });

  /**
   * Every message of a session's log is written here: stored with the next seq, sent as a
   * `message.created` event on the trace, and given to the tasks waiting for input that it answers.
   * A run's own post (`byRun`) goes on once the store has it and the tasks it answers have their runs,
   * without waiting for its event to land: what the run appends next follows it in the log.
   */
  async function append(session: Session, m: Omit<NewMessage, 'id' | 'tenant_id' | 'session_id' | 'created_at'>, byRun = false): Promise<MessageRecord> {
    const message = await store.messages.append({
      ...m,
      id: newId('msg'),
      tenant_id: session.tenant_id,
      session_id: session.id,
      created_at: clock.now().toISOString(),
    });
    // archived after the caller's check: the archive's commit came first, and nothing is written past it
    if (!message) throw archivedError(session.id);
    // the trace carries the text's start: the whole message is in the store (GET .../messages), and the log, kept
    // in Redis for days, is not made to hold a megabyte a message
    const text = textOf(message);
    const told = appendStored(session.id, {
      type: 'message.created',
      tenant_id: session.tenant_id,
      session_id: session.id,
      ...(message.run_id ? { run_id: message.run_id } : {}),
      data: {
        role: message.role,
        text: text.length > EVENT_TEXT_MAX ? text.slice(0, EVENT_TEXT_MAX) : text,
        ...(text.length > EVENT_TEXT_MAX ? { text_truncated: true } : {}),
        message_id: message.id,
        seq: message.seq,
        from: message.from,
        to: message.to,
        kind: message.kind,
      },
    });
    if (message.kind !== 'input_request') await tasks.answer(session, message);
    if (!byRun) await told;
    return message;
  }

  /** An agent's time: more than the operator's maximum is refused, as a run's is. */
  const withinLimit = (seconds: number): number => {
    const tooLong = budgetTooLong(deps.limits, seconds, '/body/budget/seconds');
    if (tooLong) throw new ValidationError(`${tooLong.path}: ${tooLong.message}`, [tooLong]);
    return seconds;
  };
  /** An agent's budget: the default time when none is given. */
  const budgetOf = (asked: Partial<Budget> | undefined): Budget => {
    const seconds = withinLimit(asked?.seconds ?? deps.limits.defaultBudgetSeconds);
    return asked?.max_steps === undefined ? { seconds } : { seconds, max_steps: asked.max_steps };
  };

  /** A session as the API shows it: with its tasks' counts by status (a run's session has none). */
  async function withCounts(s: Session): Promise<Session & { task_counts: Record<TaskStatus, number> }> {
    const none = tasks.countsOf([]);
    return { ...s, task_counts: s.kind === 'multi_agent' ? { ...none, ...(await store.tasks.counts(s.tenant_id, s.id)) } : none };
  }

  const api = {
    get: mustGet,

    async create(tenantId: string, req: { title?: string; goal?: string; metadata?: Record<string, unknown> }): Promise<Session> {
      const now = clock.now().toISOString();
      const session: Session = {
        id: newId('ses'),
        tenant_id: tenantId,
        title: req.title ?? null,
        goal: req.goal ?? null,
        kind: 'multi_agent',
        status: 'idle',
        outcome: null,
        metadata: req.metadata ?? {},
        created_at: now,
        updated_at: now,
      };
      await store.sessions.insert(session);
      await emit(session);
      return session;
    },

    list(tenantId: string, q: Omit<SessionQuery, 'limit'> & { limit?: number }) {
      return store.sessions.list(tenantId, { ...q, limit: q.limit ?? 20 });
    },

    view: withCounts,

    /**
     * The session with its agents, its tasks in DAG order (each with its output's summary, not its result and steps:
     * 400 tasks of 256 KB outputs made one answer of 104 MB, and the cap of 10,000 one the process could not hold),
     * their counts by status, and its latest runs.
     */
    async detail(tenantId: string, id: string) {
      const session = await mustGet(tenantId, id);
      const [agents, all, latest] = await Promise.all([
        store.agents.list(tenantId, id),
        store.tasks.listSummaries(tenantId, id).then(dagOrder),
        store.runs.list(tenantId, { session_id: id, limit: 10 }),
      ]);
      return { ...session, task_counts: tasks.countsOf(all), usage: tasks.usageOf(all), agents, tasks: all, runs: latest.items };
    },

    /**
     * What a run may do to its tenant's sessions (never another tenant's): add a task or post a message
     * (the `session` tool); a session task's run also speaks as its agent in its own session and reads
     * that agent's inbox.
     */
    actionsFor(run: Run): SessionActions {
      const tenantId = run.tenant_id;
      const actions: SessionActions = {
        addTask: async (sessionId, task, opts) => {
          const session = await mustBeLive(tenantId, sessionId);
          const [added] = await tasks.add(session, [opts?.cut ? cutToLimits(taskInputOf(task)) : taskInputOf(task)]);
          return { id: added!.id };
        },
        postMessage: async (sessionId, message) => {
          textWithinLimit(message.text);
          // into its own session a task's run speaks as its agent (never as the system: it cannot answer itself)
          if (actions.own && sessionId === run.session_id) return actions.own.say(message);
          const session = await mustBeLive(tenantId, sessionId);
          // refused as the API refuses it: nothing reads an inbox in a run's session
          assertMultiAgent(session, 'messages');
          if (message.to && !(await store.agents.get(tenantId, sessionId, message.to)))
            throw new ToolError('invalid-args', `no agent ${message.to} in session ${sessionId}`);
          const posted = await append(
            session,
            {
              role: 'system',
              from: null,
              to: message.to ?? null,
              kind: 'text',
              parts: [{ type: 'text', text: message.text }],
              task_id: null,
              run_id: run.id,
              in_reply_to: null,
            },
            true,
          );
          return { id: posted.id, seq: posted.seq };
        },
      };
      if (run.trigger.type !== 'task') return actions;
      const taskId = run.trigger.task_id;
      const agentId = run.agent?.id ?? null;
      actions.own = {
        say: async ({ text, to, kind }) => {
          textWithinLimit(text);
          const session = await mustBeLive(tenantId, run.session_id);
          const agents = to === undefined ? [] : await store.agents.list(tenantId, session.id);
          // an id first (an agent named after another's id never takes its messages), then a name that one agent has
          const named = to === undefined ? [] : agents.filter((a) => a.name === to);
          const target = to === undefined ? null : (agents.find((a) => a.id === to) ?? (named.length === 1 ? named[0] : undefined));
          if (named.length > 1 && !target)
            throw new ToolError(
              'invalid-args',
              `${named.length} agents of this session are named ${to}: name one by its id (${named.map((a) => a.id).join(', ')})`,
            );
          if (to !== undefined && !target)
            throw new ToolError('invalid-args', `no agent ${to} in this session (${agents.map((a) => a.name).join(', ') || 'none'})`);
          const posted = await append(
            session,
            {
              role: 'agent',
              from: agentId,
              to: target?.id ?? null,
              kind: kind ?? 'text',
              parts: [{ type: 'text', text }],
              task_id: taskId,
              run_id: run.id,
              in_reply_to: null,
            },
            true,
          );
          return { id: posted.id, seq: posted.seq };
        },
        inbox: async (afterSeq) => {
          // every message since the last look, read a page at a time before the next model call (one page of 200,
          // other agents' messages among them, left the rest to a turn that may not come: the task answered
          // without a message to it), up to INBOX_PAGES pages a turn; the rest at the next
          const texts: string[] = [];
          let lastSeq = afterSeq;
          let names: Map<string, string> | undefined;
          for (let pages = 0; pages < INBOX_PAGES; pages++) {
            const page = await store.messages.list(tenantId, run.session_id, { afterSeq: lastSeq, limit: INBOX_PAGE });
            if (!page.length) break;
            lastSeq = page.at(-1)!.seq;
            // a reply goes to the author of what it replies to when that was this agent, whoever it is addressed to;
            // a reply to all goes to no other agent when it replies to one (another agent's question is not this
            // one's), to every agent when it replies to a person's or the system's message
            const replied = await tasks.repliedAmong({ tenant_id: tenantId, id: run.session_id }, page);
            const repliesTo = (m: MessageRecord) => (m.in_reply_to ? (replied.get(m.in_reply_to)?.from ?? null) : null);
            const mine = page.filter(
              (m) =>
                ((agentId !== null && (m.to === agentId || repliesTo(m) === agentId)) || (m.to === null && repliesTo(m) === null)) &&
                m.run_id !== run.id &&
                !(agentId && m.from === agentId),
            );
            if (mine.some((m) => m.from) && !names) names = new Map((await store.agents.list(tenantId, run.session_id)).map((a) => [a.id, a.name]));
            texts.push(
              ...mine.map(
                (m) =>
                  `Message from ${m.from ? `agent ${names?.get(m.from) ?? m.from}` : m.role}${m.to && m.to === agentId ? ' to you' : ''}${agentId && repliesTo(m) === agentId ? ' (a reply to your message)' : ''}: ${textOf(m)}`,
              ),
            );
            if (page.length < INBOX_PAGE) break;
          }
          return { texts, lastSeq };
        },
      };
      return actions;
    },

    /** Repairs session tasks left behind by a crash (the worker's reconcile loop). */
    async reconcile(olderThanMs = 10_000) {
      const repaired = await tasks.reconcile(olderThanMs);
      // a session whose last change was lost with its process (all its tasks ended, its outcome unset)
      const before = new Date(clock.now().getTime() - olderThanMs).toISOString();
      // a page at a time from where the last pass stopped, from the oldest again at the end: sessions that wait
      // for good (a task waiting for input) hold no place before the others
      for (const status of ['running', 'waiting'] as const) {
        for (let read = 0; read < STALE_SESSIONS_PER_PASS;) {
          const page = await store.sessions.listStale(status, before, STALE_SESSIONS_PAGE, staleAfter[status]);
          for (const s of page) if (s.kind === 'multi_agent') await recount(s.tenant_id, s.id);
          read += page.length;
          const last = page.at(-1);
          staleAfter[status] = page.length < STALE_SESSIONS_PAGE || !last ? undefined : { updated_at: last.updated_at, id: last.id };
          if (!staleAfter[status]) break;
        }
      }
      // an archived session whose work has ended is deleted SERVICE_RUNS_KEPT_DAYS later, with its agents, tasks,
      // messages and runs (as an ended run is): a page at a time, within a bound
      if (deps.settings.runsKeptDays) {
        const cutoff = new Date(clock.now().getTime() - deps.settings.runsKeptDays * 86_400_000).toISOString();
        // one a call: a session may hold 10,000 tasks and their runs
        await pruneInPages((limit) => store.sessions.pruneArchived(cutoff, limit), 1);
      }
      return repaired;
    },

    /** Adds one task or a whole DAG to a live session. */
    async addTasks(tenantId: string, sessionId: string, inputs: TaskInput[]) {
      const session = await mustBeLive(tenantId, sessionId);
      return tasks.add(session, inputs);
    },

    /**
     * A page of the session's tasks in DAG order, with their outputs: the order from every task without its output,
     * then the outputs of the page's tasks alone. The cursor names the page's last task; the next page is what
     * follows it in the order as it is then (a task added since keeps the order of those read before).
     */
    async tasks(tenantId: string, sessionId: string, q: { limit?: number; cursor?: string } = {}): Promise<Page<TaskRecord>> {
      await mustGet(tenantId, sessionId);
      const limit = q.limit ?? 100;
      const order = dagOrder(await store.tasks.listBriefs(tenantId, sessionId));
      const after = decodeCursor(q.cursor, 'tasks');
      const from = after === undefined ? 0 : order.findIndex((t) => t.id === after) + 1;
      // a cursor of a task this session does not have (another session's): no page of this one
      if (after !== undefined && from === 0)
        throw new ValidationError('not a cursor of this session’s tasks', [{ path: '/query/cursor', message: 'not a cursor of this list' }]);
      const ids = order.slice(from, from + limit).map((t) => t.id);
      const byId = new Map((await store.tasks.getMany(tenantId, sessionId, ids)).map((t) => [t.id, t]));
      const items = ids.flatMap((id) => byId.get(id) ?? []);
      return { items, next_cursor: from + limit < order.length && items.length ? encodeCursor(items.at(-1)!.id, 'tasks') : null };
    },

    /**
     * Title, goal and status. `paused` holds new work (running work finishes); `idle` or `running`
     * resumes it. Archiving is DELETE's.
     */
    async update(
      tenantId: string,
      id: string,
      patch: { title?: string; goal?: string; status?: 'paused' | 'idle' | 'running'; metadata?: Record<string, unknown> },
    ) {
      const current = await mustBeLive(tenantId, id);
      const changes: Partial<Session> = {};
      if (patch.title !== undefined) changes.title = patch.title;
      if (patch.goal !== undefined) changes.goal = patch.goal;
      if (patch.metadata !== undefined) changes.metadata = patch.metadata;
      if (patch.status !== undefined) {
        if (current.kind !== 'multi_agent')
          throw new ConflictError(`a ${current.kind} session follows its run; only multi-agent sessions are paused and resumed`);
        // a resume takes the status its tasks give (running while one is queued or running); `idle` or
        // `running` asked of a session that is not paused changes nothing (it flickered to idle and back)
        if (patch.status === 'paused') changes.status = 'paused';
        else if (current.status === 'paused') changes.status = tasks.statusOf({ ...current, status: 'idle' }, await store.tasks.counts(tenantId, id)).status;
      }
      if (!Object.keys(changes).length) return current; // nothing asked changes the session
      const updated = await change(tenantId, id, changes, LIVE);
      if (!updated) throw new ConflictError(`session ${id} changed meanwhile; retry`);
      if (current.status === 'paused' && updated.status !== 'paused') {
        await tasks.resume(updated);
        await recount(tenantId, id);
        return mustGet(tenantId, id);
      }
      if (changes.status) await recount(tenantId, id);
      return mustGet(tenantId, id);
    },

    /**
     * Archives the session, then ends what is in it: its queued and running runs are canceled, and every
     * task not yet ended is canceled (in Redis too, so nothing it would release starts). The session keeps
     * its outcome once its tasks have ended. Archiving an archived session whose work has all ended changes
     * nothing; one whose archiving was cut short (a failure, a crash) is finished by the next DELETE.
     */
    async archive(tenantId: string, id: string): Promise<Session> {
      const current = await mustGet(tenantId, id);
      if (current.status === 'archived' && current.outcome !== null) return current;
      // archived first: from here no task starts, no answer continues a task and no message is taken
      const archived = current.status === 'archived' ? current : await change(tenantId, id, { status: 'archived' }, LIVE);
      if (!archived) return mustGet(tenantId, id);
      try {
        for (const status of ['queued', 'running'] as const) {
          for (let cursor: string | undefined; ;) {
            const page = await store.runs.list(tenantId, { session_id: id, status, limit: 100, cursor });
            // it may have ended meanwhile
            await Promise.all(page.items.map((run) => runs.cancel(tenantId, run.id).catch(() => undefined)));
            if (!page.next_cursor) break;
            cursor = page.next_cursor;
          }
        }
        await tasks.cancelAll(archived);
      } finally {
        await recount(tenantId, id);
      }
      return mustGet(tenantId, id);
    },

    async addAgent(
      tenantId: string,
      sessionId: string,
      req: { name: string; role?: string; instructions?: string; tool_allowlist?: ToolName[]; budget?: Partial<Budget>; model?: string },
    ): Promise<AgentRecord> {
      const session = await mustBeLive(tenantId, sessionId);
      // a run's session has no tasks, so an agent in it would never be given work
      assertMultiAgent(session, 'agents');
      const now = clock.now().toISOString();
      const agent: AgentRecord = {
        id: newId('agt'),
        tenant_id: tenantId,
        session_id: sessionId,
        name: req.name,
        role: req.role ?? null,
        instructions: req.instructions ?? null,
        tool_allowlist: allowlistOf(deps.settings, req.tool_allowlist, null, '/body/tool_allowlist'),
        budget: budgetOf(req.budget),
        model: req.model ?? null,
        created_at: now,
        updated_at: now,
      };
      const max = deps.settings.sessionMaxAgents;
      const inserted = await store.agents.insert(agent, { maxHeld: max });
      if (inserted === 'archived') throw archivedError(sessionId);
      if (inserted === 'over-cap')
        throw new ConflictError(`a session holds at most ${max} agents (SERVICE_SESSION_MAX_AGENTS): give a task to one it has`, { max });
      return agent;
    },

    async agent(tenantId: string, sessionId: string, agentId: string): Promise<AgentRecord> {
      await mustGet(tenantId, sessionId);
      const agent = await store.agents.get(tenantId, sessionId, agentId);
      if (!agent) throw new NotFoundError(`no agent ${agentId} in session ${sessionId}`);
      return agent;
    },

    /**
     * Edits an agent: the fields given. Runs already made keep the snapshot they took (instructions in
     * their goal, tools, budget, model); runs made from now on take the agent as edited.
     */
    async updateAgent(
      tenantId: string,
      sessionId: string,
      agentId: string,
      patch: {
        name?: string;
        role?: string | null;
        instructions?: string | null;
        tool_allowlist?: ToolName[];
        budget?: { seconds?: number; max_steps?: number | null };
        model?: string | null;
      },
    ): Promise<AgentRecord> {
      await mustBeLive(tenantId, sessionId);
      const current = await store.agents.get(tenantId, sessionId, agentId);
      if (!current) throw new NotFoundError(`no agent ${agentId} in session ${sessionId}`);
      const changes: Partial<AgentRecord> = { updated_at: clock.now().toISOString() };
      if (patch.name !== undefined) changes.name = patch.name;
      if (patch.role !== undefined) changes.role = patch.role;
      if (patch.instructions !== undefined) changes.instructions = patch.instructions;
      if (patch.model !== undefined) changes.model = patch.model;
      if (patch.tool_allowlist !== undefined) changes.tool_allowlist = allowlistOf(deps.settings, patch.tool_allowlist, null, '/body/tool_allowlist');
      // merged (RFC 7396) by the write itself: the members of the budget given, the others keep their values
      // (a change of another member made at once included); max_steps null removes it
      if (patch.budget?.seconds !== undefined) withinLimit(patch.budget.seconds);
      const members: AgentMembers | undefined = patch.budget && { budget: { seconds: patch.budget.seconds, max_steps: patch.budget.max_steps } };
      const updated = await store.agents.update(tenantId, sessionId, agentId, changes, members);
      // no row written: the session was archived after the check (the agent itself is never removed)
      if (!updated) throw archivedError(sessionId);
      return updated;
    },

    async agents(tenantId: string, sessionId: string): Promise<AgentRecord[]> {
      await mustGet(tenantId, sessionId);
      return store.agents.list(tenantId, sessionId);
    },

    assertCanPost,

    /**
     * Appends a message to the session's log and tells its trace. People and the system inject `user` or `system`
     * messages. `once`: a key of the request (its Idempotency-Key) whose retry gets the message its first try posted,
     * not another, for IDEMPOTENCY_TTL_SECONDS: a spoken run's message is posted before its run is stored, and a
     * store that refused the run had its retry post the message twice.
     */
    async postMessage(
      tenantId: string,
      sessionId: string,
      req: { role: 'user' | 'system'; to?: string | null; kind?: string; parts: MessagePart[]; in_reply_to?: string | null },
      once?: string,
    ): Promise<MessageRecord> {
      // the API's schema holds a text part to MESSAGE_TEXT_MAX; a caller that is not the API (a transcript) is held to it here
      const tooLong = req.parts.findIndex((p) => p.type === 'text' && longer(p.text, MESSAGE_TEXT_MAX));
      if (tooLong >= 0)
        throw new ValidationError(`a message's text is at most ${MESSAGE_TEXT_MAX} characters`, [
          { path: `/body/parts/${tooLong}/text`, message: `at most ${MESSAGE_TEXT_MAX} characters` },
        ]);
      const session = await assertCanPost(tenantId, sessionId, req.to);
      // a reply names a message of this session: another session's, another tenant's or a made-up id is refused
      if (req.in_reply_to && !(await store.messages.get(tenantId, sessionId, req.in_reply_to)))
        throw new NotFoundError(`no message ${req.in_reply_to} in session ${sessionId}`);
      const posted = once ? `${deps.queues.prefix}:message-once:{${tenantId}}:${sha256Hex(`${sessionId}\n${once}`)}` : null;
      if (posted) {
        const id = await redisOrUnavailable(deps.redis, 'reading what a retried request posted', () => deps.redis.get(posted));
        const earlier = id ? await store.messages.get(tenantId, sessionId, id) : null;
        if (earlier) return earlier;
      }
      const message = await append(session, {
        role: req.role,
        from: null,
        to: req.to ?? null,
        kind: req.kind ?? 'text',
        parts: req.parts,
        task_id: null,
        run_id: null,
        in_reply_to: req.in_reply_to ?? null,
      });
      if (posted)
        await deps.redis
          .set(posted, message.id, 'EX', IDEMPOTENCY_TTL_SECONDS)
          .catch((err: Error) => deps.log.warn({ session_id: sessionId, err: err.message }, 'a retry of this request may post its message again'));
      return message;
    },

    async messages(tenantId: string, sessionId: string, q: { afterSeq?: number; limit?: number }) {
      await mustGet(tenantId, sessionId);
      const limit = q.limit ?? 50;
      const items = await store.messages.list(tenantId, sessionId, { afterSeq: q.afterSeq, limit: limit + 1 });
      const page = items.slice(0, limit);
      return { items: page, next_cursor: items.length > limit ? String(page.at(-1)!.seq) : null };
    },

    async runs(tenantId: string, sessionId: string, q: { limit?: number; cursor?: string }) {
      await mustGet(tenantId, sessionId);
      return store.runs.list(tenantId, { session_id: sessionId, limit: q.limit ?? 20, cursor: q.cursor });
    },
  };
  return api;
}

export type Sessions = ReturnType<typeof sessionsOf>;

/** The characters of a message's text its `message.created` event carries (the rest is read from the message). */
const EVENT_TEXT_MAX = 4000;

/** Refuses a text a message part may not hold, as the API refuses it (code points counted, as the schema does). */
function textWithinLimit(text: string): void {
  if (longer(text, MESSAGE_TEXT_MAX))
    throw new ToolError('invalid-args', `a message's text is at most ${MESSAGE_TEXT_MAX} characters; this one has ${[...text].length}`);
}

const textOf = (m: MessageRecord) => m.parts.map((p) => (p.type === 'text' ? p.text : JSON.stringify(p.data))).join('\n');

/** A task's title and goal cut to what a task may hold (code points, as the schema counts them), an ellipsis marking the cut. */
function cutToLimits(t: TaskInput): TaskInput {
  const cut = (text: string | undefined, max: number) => (text !== undefined && longer(text, max) ? `${[...text].slice(0, max - 1).join('')}…` : text);
  return { ...t, title: cut(t.title ?? undefined, TASK_LIMITS.title), goal: cut(t.goal ?? undefined, TASK_LIMITS.goal) };
}

/** A task the `session` tool adds: only the fields a task has, whatever else the arguments carry. */
function taskInputOf(t: Record<string, unknown>): TaskInput {
  const str = (v: unknown) => (typeof v === 'string' && v ? v : undefined);
  const deps = Array.isArray(t.depends_on) ? t.depends_on.filter((d): d is string => typeof d === 'string') : undefined;
  return { title: str(t.title), goal: str(t.goal), agent_id: str(t.agent_id), depends_on: deps };
}
