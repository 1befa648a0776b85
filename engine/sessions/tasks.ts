// The tasks of a multi-agent session and the DAG dispatcher. A task becomes `queued` in Redis (Lua,
// dag-state.ts) when its last dependency is satisfied; it is then a run of kind `session_task`
// (created once per task: its idempotency key is the task), with the outputs of its dependencies as
// `inputs.upstream` and the task's `max_attempts` as the run's retry policy. The run's start and end
// move the task (hooks on the run lifecycle); every change is written to the store and sent as a
// `task.updated` event on the session's trace. A paused session holds its ready tasks: they start on resume.
import type { Platform } from '../deps.js';
import {
  AppError,
  ConflictError,
  isTerminal,
  scopes,
  TASK_STATUSES,
  TERMINAL_TASK_STATUSES,
  TaskGraphInvalidError,
  newId,
  afterStored,
  type AgentRecord,
  type MessageRecord,
  type Run,
  type Session,
  type SessionStatus,
  type Step,
  type TaskRecord,
  type LiveTaskStatus,
  type TaskStatus,
  type TriggerRule,
} from '../platform/index.js';
import { allowlistOf, requireAgentFor, serviceKey, type Runs, type StartVerdict, type ToolPolicy } from '../runs/index.js';
import { dagErrors } from './dag.js';
import type { DagState } from './dag-state.js';
import type { TaskBrief } from '../store/index.js';

/** Why a ready task's run is refused that will not pass by waiting: the operator's policy, its agent endpoint, its workspace. */
const UNSTARTABLE = new Set<string>(['agent-not-configured', 'tool-not-permitted', 'network-not-permitted', 'path-not-permitted', 'validation-failed']);

export type TaskInput = {
  id?: string;
  title?: string;
  goal?: string;
  steps?: Step[];
  agent_id?: string;
  depends_on?: string[];
  trigger_rule?: TriggerRule;
  max_attempts?: number;
};

type TasksDeps = Pick<Platform, 'store' | 'clock' | 'log' | 'events'> & {
  runs: Runs;
  settings: ToolPolicy & { agent: unknown; sessionMaxTasks: number };
  dag: DagState;
  /** tells the session that its tasks changed (status, outcome) */
  recount(tenantId: string, sessionId: string): Promise<void>;
  /** sends a change of the session that the store made with its tasks (a batch that reopened it) as its `session.updated` */
  emitSession(session: Session): Promise<void>;
};

/**
 * What a task keeps of its steps' outputs, as JSON, in all: it is in the task and in each dependent's
 * `inputs.upstream` (up to 100 dependencies in one run), so a task of 200 steps of 256 KB each would
 * otherwise put 50 MB in every dependent, and 5 GB in a run that depends on 100 of them.
 */
const OUTPUT_STEPS_MAX_BYTES = 256 * 1024;

/**
 * What a run's `inputs.upstream` holds in all, as JSON. Each dependency's output is up to OUTPUT_STEPS_MAX_BYTES,
 * and a run may have 100 of them: 100 tasks on the same 20 producers of 260 KB each wrote 520 MB of runs (each
 * one 5.2 MB) from 5 MB of outputs, and took the process from 305 MB to 1.4 GB.
 */
const UPSTREAM_MAX_BYTES = 1024 * 1024;

/** How many of the tasks that one change makes ready start at once: each start holds its dependencies' outputs. */
const STARTS_AT_ONCE = 8;

/** The idempotency key of a task's run (its first, or the nth, that an answer starts): the service's own. */
const runKey = (sessionId: string, taskId: string, nth?: number) => serviceKey(`task:${sessionId}:${taskId}${nth === undefined ? '' : `:${nth}`}`);

/** What one task may hold (api/openapi.yaml's TaskInput): a task the session tool adds is held to them too. */
export const TASK_LIMITS = { depends_on: 100, title: 200, goal: 20_000 };

/**
 * Refuses what only a multi-agent session takes (its agents, tasks and messages) in the session of an autonomy or
 * vibe run, which follows its one run: one refusal, worded alike whatever was asked of it.
 */
export function assertMultiAgent(session: Pick<Session, 'id' | 'kind'>, what: 'agents' | 'tasks' | 'messages'): void {
  if (session.kind === 'multi_agent') return;
  const run = `${session.kind === 'autonomy' ? 'an' : 'a'} ${session.kind} run`;
  throw new ConflictError(`session ${session.id} is the session of ${run}; ${what} go in multi-agent sessions`, { kind: session.kind });
}

/** Longer than `max` characters as the schema counts them (code points: an emoji is one). */
export const longer = (text: string, max: number) => text.length > max && [...text].length > max;

/** The dependencies of `tasks` that have ended, among `known`: what Redis learns with them, should it have lost them. */
function endedAmong(known: readonly TaskRecord[], tasks: readonly TaskRecord[]): TaskRecord[] {
  const deps = new Set(tasks.flatMap((t) => t.depends_on));
  return known.filter((t) => deps.has(t.id) && TERMINAL_TASK_STATUSES.includes(t.status));
}

/** How many tasks a session holds, of every status. */
const tasksIn = (counts: Partial<Record<TaskStatus, number>>) => Object.values(counts).reduce((sum, n) => sum + n, 0);

/** A batch that would take its session past SERVICE_SESSION_MAX_TASKS, which holds `held`. */
const tooMany = (max: number, held: number) => ({
  path: '/body/tasks',
  message: `a session holds at most ${max} tasks (SERVICE_SESSION_MAX_TASKS); this one has ${held}`,
});

/** The reconciler reads stale tasks this many at a time, up to this many pages a pass. */
const STALE_PAGE = 500;
const STALE_PAGES = 40;

const OUTCOME: Record<string, Extract<TaskStatus, 'succeeded' | 'failed' | 'canceled'>> = {
  succeeded: 'succeeded',
  failed: 'failed',
  timed_out: 'failed',
  canceled: 'canceled',
};

export function tasksOf(deps: TasksDeps) {
  const { store, clock, log, events, runs, dag } = deps;

  const emit = (t: TaskRecord) =>
    events.append(scopes.sessionTrace(t.session_id).stream, {
      type: 'task.updated',
      tenant_id: t.tenant_id,
      session_id: t.session_id,
      data: { task_id: t.id, status: t.status, attempt: t.attempts, run_id: t.run_ids.at(-1) ?? null },
    });

  type Move = { changes: Partial<TaskRecord>; from: TaskStatus[] };
  type TaskRef = Pick<TaskRecord, 'tenant_id' | 'session_id' | 'id'>;

  async function move(t: TaskRef, changes: Partial<TaskRecord>, from: TaskStatus[]): Promise<TaskRecord | null> {
    const { moved, told } = await moveTelling(t, changes, from);
    await told;
    return moved;
  }

  /**
   * A task's move, which answers once the store has it, with its `task.updated` asked for and not yet
   * landed (`told`). A DAG's hop (a task starting, a task ending and what it releases) goes on at once:
   * what it asks Redis for next follows the event in the log (appends keep the order they are asked in),
   * and shares its round trip instead of waiting one out.
   */
  async function moveTelling(t: TaskRef, changes: Partial<TaskRecord>, from: TaskStatus[]): Promise<{ moved: TaskRecord | null; told: Promise<unknown> }> {
    const moved = await store.tasks.update(t.tenant_id, t.session_id, t.id, { ...changes, updated_at: clock.now().toISOString() }, from);
    return { moved, told: moved ? emit(moved) : Promise.resolve() };
  }

  /**
   * A run of the task: its agent's snapshot and instructions, the outputs of its dependencies as
   * `inputs.upstream`, and `max_attempts` as its retry policy. Made once per key: the task's first run,
   * or the run an answer starts (`continues` the run that asked). The task moves to `queued` with its
   * run (`queued` says how, or null for a run that is not the task's next): once the run is stored, while
   * it is put in line, when it is made here; after it, when an earlier request made it.
   */
  async function startRun(
    session: Session,
    task: TaskRecord,
    key: string,
    trigger: Omit<Extract<Run['trigger'], { type: 'task' }>, 'type' | 'task_id'>,
    queued: (run: Run) => Move | null,
    opts: { known?: Map<string, TaskRecord>; failed?: number } = {},
  ): Promise<Run> {
    const agent = task.agent_id ? await store.agents.get(session.tenant_id, session.id, task.agent_id) : null;
    const upstream = await upstreamOf(session, task, opts.known);
    // a run that continues the task has what is left of its tries and steps, not a fresh allowance: the
    // tries that failed count against max_attempts, a run that asked for input does not
    const attempts = Math.max(1, task.max_attempts - (opts.failed ?? 0));
    const stepsUsed = trigger.continues ? (taskUsage(task).steps ?? 0) : 0;
    // none left: the continuation may answer, and a tool call of it ends the task with max-steps-reached (it was
    // given one more step at each answer)
    const maxSteps = agent?.budget.max_steps === undefined ? undefined : Math.max(0, agent.budget.max_steps - stepsUsed);
    // the task's move to queued, and its task.updated as soon as the write lands
    const moveQueued = async (r: Run): Promise<void> => {
      const how = queued(r);
      if (how) await move(task, how.changes, how.from);
    };
    let moving: Promise<void> | undefined;
    const { run } = await runs.createIdempotent(
      session.tenant_id,
      key,
      { task: task.id, key },
      {
        kind: 'session_task',
        session_id: session.id,
        goal: task.goal ? withInstructions(agent, task.goal) : null,
        steps: task.steps,
        tool_allowlist: agent?.tool_allowlist,
        budget_seconds: agent?.budget.seconds,
        max_steps: maxSteps,
        // a try that ran out of its budget is a failed try of the task as well
        retry: attempts > 1 ? { attempts, backoff: { type: 'fixed', delay_ms: 200 }, on: ['failed', 'timed_out'] } : null,
        inputs: { upstream, task: { id: task.id, title: task.title } },
        agent: agent ? { id: agent.id, name: agent.name, role: agent.role, model: agent.model } : null,
        trigger: { type: 'task', task_id: task.id, ...trigger },
      },
      (made) => (moving = moveQueued(made)),
    );
    await (moving ?? moveQueued(run));
    return run;
  }

  /**
   * The outputs of a task's dependencies, from one read of them (`known`, shared by the tasks one
   * completion releases). A dependency that Redis has ended but whose own hook has not yet
   * written its output (another worker, a moment behind) gives the output of its run.
   */
  async function upstreamOf(session: Session, task: TaskRecord, known?: Map<string, TaskRecord>): Promise<Record<string, unknown>> {
    if (!task.depends_on.length) return {};
    const tasks = known ?? new Map((await store.tasks.getMany(session.tenant_id, session.id, task.depends_on)).map((t) => [t.id, t]));
    const entries = await Promise.all(
      task.depends_on.map(async (dep) => {
        const t = tasks.get(dep);
        if (!t || TERMINAL_TASK_STATUSES.includes(t.status)) return [dep, t?.output ?? null] as const;
        const runId = t.run_ids.at(-1);
        const run = runId ? await store.runs.get(session.tenant_id, runId) : null;
        return [dep, run && isTerminal(run.status) ? await outputOf(run) : null] as const;
      }),
    );
    return Object.fromEntries(withinUpstreamCap(entries));
  }

  /**
   * What a finished run of a task leaves as the task's output (its dependents' `inputs.upstream`): its
   * steps' outputs, after those of the task's runs before it (`earlier`: it continues them after a question),
   * up to OUTPUT_STEPS_MAX_BYTES, the latest first; a step left out keeps its place with
   * `output: null, output_truncated: true` (its run keeps every output whole).
   */
  async function outputOf(run: Run, earlier: string[] = []): Promise<Record<string, unknown>> {
    // a task continued after its question: the steps of its runs before, in their order, then this run's
    const before = await Promise.all(
      earlier.map(async (id) => {
        const r = await store.runs.get(run.tenant_id, id);
        return r ? store.runs.steps(r.tenant_id, r.id, r.attempt) : [];
      }),
    );
    const steps = [...before.flat(), ...(await store.runs.steps(run.tenant_id, run.id, run.attempt))];
    const kept: { tool: string; output: unknown; output_truncated?: true }[] = new Array(steps.length);
    let left = OUTPUT_STEPS_MAX_BYTES;
    for (let i = steps.length - 1; i >= 0; i--) {
      const { tool, output } = steps[i]!;
      const bytes = Buffer.byteLength(JSON.stringify(output ?? null));
      if (bytes > left) kept[i] = { tool, output: null, output_truncated: true };
      else {
        left -= bytes;
        kept[i] = { tool, output };
      }
    }
    return {
      status: run.status,
      summary: run.summary,
      result: run.result?.final_answer === undefined ? run.result : { final_answer: run.result.final_answer },
      usage: run.usage,
      steps: kept,
    };
  }

  /**
   * Starts a ready task's run, unless its session is paused (then it waits, queued, for the resume). False
   * when there was nothing to do: the task had its run already, or has ended.
   */
  async function dispatch(session: Session, taskId: string, known?: Map<string, TaskRecord>): Promise<boolean> {
    const task = known?.get(taskId) ?? (await store.tasks.get(session.tenant_id, session.id, taskId));
    // a task is started once: pending, or queued by a pause and not started since
    if (!task || !(task.status === 'pending' || (task.status === 'queued' && !task.run_ids.length))) return false;
    if (session.status === 'archived') {
      await cancelTask(session, task.id);
      return true;
    }
    if (session.status === 'paused') {
      const held = await move(task, { status: 'queued' }, ['pending']);
      // a resume that listed the tasks before this one was held has ended the pause since: it starts now
      const now = held && (await store.sessions.get(session.tenant_id, session.id));
      if (now && now.status !== 'paused') await dispatch(now, held.id);
      return held !== null;
    }
    // a plan's agent step reads the inbox too, with or without an agent of the task: from when the task was added
    const trigger = { prior_attempts: 0, inbox_after: task.inbox_after ?? 0 };
    try {
      await startRun(
        session,
        task,
        runKey(session.id, task.id),
        trigger,
        (run) => ({ changes: { status: 'queued', run_ids: [run.id], attempts: run.attempt }, from: ['pending', 'queued'] }),
        { known },
      );
    } catch (err) {
      // what may pass (Redis, the store, another dispatch of it holding its key) leaves the task to the next try (the reconciler's)
      if (!(err instanceof AppError) || !UNSTARTABLE.has(err.code)) throw err;
      await failUnstartable(session, task, err);
    }
    return true;
  }

  /**
   * A ready task whose run is refused for a reason that will not pass (the operator's tool policy or
   * agent endpoint changed since the task was added, its workspace is gone): it fails with that reason,
   * and what waits on it follows, rather than the session waiting for it for good.
   */
  async function failUnstartable(session: Session, task: TaskRecord, err: AppError): Promise<void> {
    log.warn({ session_id: session.id, task_id: task.id, code: err.code, err: err.message }, 'a ready task could not be started; it fails');
    await endTask(task, 'failed', { output: { status: 'failed', error: { code: err.code, message: err.message } } }, session);
  }

  /**
   * A task's end: in Redis (first writer wins) and in the store, then what it releases (with `session`,
   * or the session as it is now), then its session's counts.
   */
  async function endTask(ref: TaskRef, outcome: Extract<TaskStatus, 'succeeded' | 'failed' | 'canceled'>, changes: Partial<TaskRecord>, session?: Session) {
    const change = await dag.complete(ref.session_id, ref.id, outcome);
    const { told } = await moveTelling(ref, { status: outcome, ...changes }, ['pending', 'queued', 'running', 'input_required']);
    // what it releases starts without waiting for its event, which the log has before theirs; an event
    // Redis refuses fails the end as before, once its dependents are on their way
    try {
      if (change && (change.ready.length || change.upstreamFailed.length)) {
        const current = session ?? (await store.sessions.get(ref.tenant_id, ref.session_id));
        // in an archived session (a run its archive canceled ended before the archive reached its tasks) what
        // the end releases is canceled with it: not started, nor upstream_failed as if a task had failed
        if (current?.status === 'archived') for (const id of [...change.ready, ...change.upstreamFailed]) await cancelTask(current, id);
        else if (current) await apply(current, change);
      }
      await deps.recount(ref.tenant_id, ref.session_id);
    } finally {
      await told;
    }
  }

  /** Cancels a task of an archived session, and what its end releases after it: nothing of it starts. */
  async function cancelTask(session: Session, taskId: string): Promise<void> {
    const change = await dag.complete(session.id, taskId, 'canceled');
    await move({ tenant_id: session.tenant_id, session_id: session.id, id: taskId }, { status: 'canceled' }, [
      'pending',
      'queued',
      'input_required',
      'running',
    ]);
    for (const id of [...(change?.ready ?? []), ...(change?.upstreamFailed ?? [])]) await cancelTask(session, id);
  }

  /** What a task waiting for input asked: the question's message, and how far its agent had read. */
  const questionOf = (t: TaskRecord) => (t.output?.input_required ?? null) as { message_id: string; seq: number; inbox_seq?: number } | null;
  /** Messages after this seq are new to the task's agent (those before were read by the run that asked). */
  const readUpTo = (q: { seq: number; inbox_seq?: number }) => q.inbox_seq ?? q.seq;

  /**
   * Does this message answer the task's question: a reply to it, or a message to its agent or a person's
   * message to all; never the agent's own, never another agent's broadcast, never a reply to another
   * question (another task's question is not this one's), and never a reply to all that replies to another
   * agent's message (it is that agent's, as its inbox has it). `replied`: the messages replied to, by id.
   */
  function answers(t: TaskRecord, m: MessageRecord, replied: ReadonlyMap<string, MessageRecord>): boolean {
    const q = questionOf(t);
    if (!q || m.seq <= readUpTo(q) || !mayAnswer(m)) return false;
    if (t.agent_id && m.from === t.agent_id) return false;
    if (m.in_reply_to === q.message_id) return true;
    const to = m.in_reply_to ? replied.get(m.in_reply_to) : undefined;
    if (to?.kind === 'input_request') return false;
    if (m.to === null && to?.from && to.from !== t.agent_id) return false;
    return (m.to !== null && m.to === t.agent_id) || (m.to === null && (m.role === 'user' || m.role === 'system'));
  }

  /** The messages these reply to, by id, read once each. */
  async function repliedAmong(session: Pick<Session, 'tenant_id' | 'id'>, messages: MessageRecord[]): Promise<Map<string, MessageRecord>> {
    const named = [...new Set(messages.flatMap((m) => (m.in_reply_to ? [m.in_reply_to] : [])))];
    const found = await Promise.all(named.map((id) => store.messages.get(session.tenant_id, session.id, id)));
    return new Map(found.flatMap((m) => (m ? [[m.id, m] as const] : [])));
  }

  /** Could this message answer any task: a reply, a message to an agent, or a person's to all (an agent's broadcast answers nobody). */
  const mayAnswer = (m: MessageRecord) => m.kind !== 'input_request' && (m.in_reply_to !== null || m.to !== null || m.role === 'user' || m.role === 'system');

  /** The token usage and steps of every run of the task so far (its output keeps the sum). */
  const taskUsage = (t: TaskRecord) => (t.output?.usage ?? {}) as Partial<Run['usage']>;
  const sumUsage = (before: Partial<Run['usage']>, run: Run['usage']): Run['usage'] => {
    const sum = {
      ...run,
      steps: run.steps + (before.steps ?? 0),
      model_turns: run.model_turns + (before.model_turns ?? 0),
      seconds: run.seconds + (before.seconds ?? 0),
    };
    for (const k of ['prompt_tokens', 'completion_tokens'] as const)
      if (before[k] !== undefined || run[k] !== undefined) sum[k] = (before[k] ?? 0) + (run[k] ?? 0);
    return sum;
  };
  /** What a run used over all its attempts: each earlier attempt (retried, lost or interrupted) keeps its own usage. */
  const runUsage = (run: Run): Run['usage'] => run.attempts.reduce((sum, a) => (a.usage && a.attempt < run.attempt ? sumUsage(a.usage, sum) : sum), run.usage);

  /**
   * The task's next run, which continues the conversation of the run that asked; the answer is in its
   * inbox. The task is read again first: an answer that arrives after the task has moved on does nothing.
   */
  async function continueTask(seenSession: Session, seen: TaskRecord): Promise<void> {
    const [task, session] = await Promise.all([
      store.tasks.get(seen.tenant_id, seen.session_id, seen.id),
      store.sessions.get(seenSession.tenant_id, seenSession.id),
    ]);
    const q = task && task.status === 'input_required' ? questionOf(task) : null;
    // archived since it was read: no run starts in a read-only session
    if (!task || !q || !session || session.status === 'archived') return;
    // the question answered is the one the task waits on: an answer read before another run asked again (a
    // slow read) continued the task past the new question, which nobody had answered
    if (q.message_id !== questionOf(seen)?.message_id) return;
    const asked = task.run_ids.at(-1)!;
    // each earlier run of the task ended by asking (it succeeded): its tries before that one failed
    const runs = await Promise.all(task.run_ids.map((id) => store.runs.get(task.tenant_id, id)));
    const failed = runs.reduce((n, r) => n + (r ? r.attempt - 1 : 0), 0);
    await startRun(
      session,
      task,
      runKey(session.id, task.id, task.run_ids.length + 1),
      { prior_attempts: task.attempts, continues: asked, inbox_after: readUpTo(q) },
      // a run made for an earlier question (the same key) has ended: it is not the task's next run
      (run) =>
        isTerminal(run.status)
          ? null
          : { changes: { status: 'queued', run_ids: [...task.run_ids, run.id], attempts: task.attempts + run.attempt }, from: ['input_required'] },
      { failed },
    );
    // a task that waited is queued again: its session is running, unless another task still waits
    await deps.recount(session.tenant_id, session.id);
  }

  /**
   * Starts the next run of each waiting task of the session that a message after its question answers (held while
   * the session is paused); answers how many started. The messages are read once, from the earliest question on,
   * each tested against every task still waiting: read once a task, 20 tasks waiting among 20,000 messages took a
   * reconciler pass 1.5 s. Each task is tried; the first failure is thrown once all have been.
   */
  async function continueAnswered(session: Session, tasks: readonly TaskRecord[]): Promise<number> {
    if (session.status === 'paused' || session.status === 'archived') return 0;
    const waiting = new Set(tasks.filter((t) => t.status === 'input_required' && questionOf(t)));
    // what a message can answer: the task whose question it replies to, the tasks of the agent it is to, or (a
    // person's to all) any; the rest are not tested
    const byQuestion = new Map<string, TaskRecord[]>();
    const byAgent = new Map<string, TaskRecord[]>();
    const add = (map: Map<string, TaskRecord[]>, key: string, t: TaskRecord) => {
      const list = map.get(key);
      if (list) list.push(t);
      else map.set(key, [t]);
    };
    for (const t of waiting) {
      add(byQuestion, questionOf(t)!.message_id, t);
      if (t.agent_id) add(byAgent, t.agent_id, t);
    }
    const candidates = (m: MessageRecord): Iterable<TaskRecord> =>
      m.to === null && (m.role === 'user' || m.role === 'system')
        ? [...waiting]
        : [...(m.in_reply_to ? (byQuestion.get(m.in_reply_to) ?? []) : []), ...(m.to ? (byAgent.get(m.to) ?? []) : [])];
    let started = 0;
    const failures: unknown[] = [];
    let after = Infinity;
    for (const t of waiting) after = Math.min(after, readUpTo(questionOf(t)!));
    while (waiting.size) {
      const page = await store.messages.list(session.tenant_id, session.id, { afterSeq: after, limit: 200 });
      const replied = await repliedAmong(session, page);
      const answered: TaskRecord[] = [];
      for (const m of page)
        for (const t of candidates(m))
          if (waiting.has(t) && answers(t, m, replied)) {
            waiting.delete(t);
            answered.push(t);
          }
      for (const t of answered)
        await continueTask(session, t).then(
          () => started++,
          (err: unknown) => failures.push(err),
        );
      if (page.length < 200) break;
      after = page.at(-1)!.seq;
    }
    if (failures.length) throw failures[0];
    return started;
  }

  /** where the reconciler's last pass stopped reading, by status */
  const staleAfter = new Map<LiveTaskStatus, TaskRecord>();

  /**
   * The tasks in a status not changed since `before`, page by page: at most STALE_PAGES a pass, from where the
   * pass before stopped, and from the oldest again once the end is reached (tasks that wait for good, however
   * many, hide none of the rest).
   */
  async function* stale(status: LiveTaskStatus, before: string): AsyncGenerator<TaskRecord> {
    for (let page = 0; page < STALE_PAGES; page++) {
      const tasks = await store.tasks.listStale(status, before, STALE_PAGE, staleAfter.get(status));
      if (tasks.length < STALE_PAGE) staleAfter.delete(status);
      else staleAfter.set(status, tasks.at(-1)!);
      yield* tasks;
      if (tasks.length < STALE_PAGE) return;
    }
  }

  /**
   * What a change of the DAG released: dependents that cannot run end, ready tasks start, STARTS_AT_ONCE at a time.
   * Two reads serve them all: the ready tasks, then the dependencies whose outputs they take.
   */
  async function apply(session: Session, change: { ready: string[]; upstreamFailed: string[] }): Promise<void> {
    for (const id of change.upstreamFailed)
      await move({ tenant_id: session.tenant_id, session_id: session.id, id }, { status: 'upstream_failed' }, ['pending', 'queued']);
    if (!change.ready.length) return;
    const ready = await store.tasks.getMany(session.tenant_id, session.id, change.ready);
    const deps = [...new Set(ready.flatMap((t) => t.depends_on))];
    const known = new Map([...ready, ...(await store.tasks.getMany(session.tenant_id, session.id, deps))].map((t) => [t.id, t]));
    await inTurns(change.ready, STARTS_AT_ONCE, (id) =>
      dispatch(session, id, known).catch((err: unknown) => log.error({ err, session_id: session.id, task_id: id }, 'a ready task could not be started')),
    );
  }

  /** The task's attempt of a run: its earlier runs' attempts, then this run's. */
  const attemptOf = (run: Run) => (run.trigger.type === 'task' ? (run.trigger.prior_attempts ?? 0) : 0) + run.attempt;

  /** A queued task's run that has not started (held at its start by the pause): offered to the workers now. */
  async function offerHeld(t: TaskBrief): Promise<void> {
    const run = await store.runs.get(t.tenant_id, t.run_ids.at(-1)!);
    if (run?.status === 'queued') await runs.offerNow(run);
  }

  /**
   * The pause, then the fence: a run of a paused session's task waits, queued, for the resume (however
   * early it was queued: a pause stops every task that has not started); a run of a task that already
   * ended in Redis does not start (it is canceled instead).
   */
  async function mayStart(run: Run): Promise<StartVerdict> {
    if (run.trigger.type !== 'task') return null;
    const session = await store.sessions.get(run.tenant_id, run.session_id);
    if (session?.status === 'paused') return { hold: `session ${run.session_id} is paused` };
    // a run of an archived session's task never starts (a retry, or one in line before the archive's cancel reached it)
    if (session?.status === 'archived') return { refuse: `session ${run.session_id} is archived` };
    return (await dag.start(run.session_id, run.trigger.task_id)) ? null : { refuse: `task ${run.trigger.task_id} has already ended` };
  }

  // queued and running count alike for the session's status: a start leaves it as it was
  async function onRunStarted(run: Run): Promise<void> {
    if (run.trigger.type !== 'task') return;
    const ref = { tenant_id: run.tenant_id, session_id: run.session_id, id: run.trigger.task_id };
    const { told } = await moveTelling(ref, { status: 'running', attempts: attemptOf(run) }, ['queued', 'running']);
    // the run's steps start once the store has the move: their events follow this one in the log
    told.catch((err: unknown) => log.error({ err, run_id: run.id, task_id: ref.id }, "a task's move to running was stored but its event was not appended"));
  }

  async function onRunFinished(run: Run): Promise<void> {
    if (run.trigger.type !== 'task') return;
    const ref = { tenant_id: run.tenant_id, session_id: run.session_id, id: run.trigger.task_id };
    // what the task's earlier runs used and did (a run that continues it adds to that)
    const task = run.trigger.continues ? await store.tasks.get(ref.tenant_id, ref.session_id, ref.id) : null;
    const usage = sumUsage(task ? taskUsage(task) : {}, runUsage(run));
    const asked = run.status === 'succeeded' ? run.result?.input_required : undefined;
    if (asked) {
      // the task waits, holding no worker; it has not ended, so Redis keeps it running and releases nobody
      const waiting = await move(
        ref,
        { status: 'input_required', output: { status: 'input_required', input_required: asked, run_id: run.id, usage }, attempts: attemptOf(run) },
        ['queued', 'running'],
      );
      const session = waiting && (await store.sessions.get(run.tenant_id, run.session_id));
      // archived while the run asked (the archive's cancel came a moment late, or it read the task before this
      // move): no task waits in a read-only session; it is canceled, as the archive's others
      if (waiting && session?.status === 'archived') await cancelTask(session, ref.id);
      await deps.recount(run.tenant_id, run.session_id);
      // an answer posted before the task moved is not lost
      if (waiting && session && session.status !== 'archived') await continueAnswered(session, [waiting]);
      return;
    }
    // a run that did not succeed once its session was archived was cut by the archive (its steps found
    // the session read-only, its cancel came a moment late): its task is canceled, as the archive's others
    const archived = run.status !== 'succeeded' && (await store.sessions.get(run.tenant_id, run.session_id))?.status === 'archived';
    const outcome = archived ? 'canceled' : (OUTCOME[run.status] ?? 'failed');
    const earlier = task ? task.run_ids.filter((id) => id !== run.id) : [];
    await endTask(ref, outcome, { output: { ...(await outputOf(run, earlier)), usage }, attempts: attemptOf(run) });
  }

  /**
   * Starts the tasks that became ready, or were answered, while the session was paused, and offers
   * again at once the runs that were queued before it and held at their start.
   */
  async function resume(session: Session): Promise<void> {
    // without their outputs (up to 256 KB each, 2.5 GB at 10,000 tasks): a task started here reads its own
    // dependencies' outputs, STARTS_AT_ONCE at a time, as the tasks one completion releases
    const held = await store.tasks.listBriefs(session.tenant_id, session.id);
    const start = (t: TaskBrief) => {
      // a task whose try failed as the session was paused: its next try's run waits, queued, held at its start
      if (t.status === 'running') return t.run_ids.length ? offerHeld(t) : null;
      if (t.status !== 'queued') return null;
      // held before its run was made, or its run held at its start
      return t.run_ids.length ? offerHeld(t) : dispatch(session, t.id);
    };
    await inTurns(held, STARTS_AT_ONCE, async (t) => start(t)?.catch((err: unknown) => log.error({ err, task_id: t.id }, 'a held task could not start')));
    // the waiting ones, with their questions, answered from one read of the messages since the earliest
    if (held.some((t) => t.status === 'input_required'))
      await continueAnswered(session, await store.tasks.listIn(session.tenant_id, session.id, 'input_required')).catch((err: unknown) =>
        log.error({ err, session_id: session.id }, 'an answered task could not continue'),
      );
  }

  /**
   * Ends every task of an archived session that has not ended: canceled in Redis (nothing it would
   * release starts) and in the store. A task whose run is still stopping ends with that run instead.
   */
  async function cancelAll(session: Session): Promise<void> {
    // without their outputs: their statuses and runs say which to cancel
    const tasks = await store.tasks.listBriefs(session.tenant_id, session.id);
    // which to cancel first (a running task whose run is still stopping ends with that run), then all
    // of them at once, asked in the order listed: a task reached twice (listed, and released by another's
    // cancel) ends once, Redis's first writer. One that fails does not stop the rest; the first failure
    // is thrown once all have been tried
    const open = await Promise.all(
      tasks.map(async (t) => {
        if (TERMINAL_TASK_STATUSES.includes(t.status)) return null;
        const runId = t.run_ids.at(-1);
        const run = runId ? await store.runs.get(session.tenant_id, runId) : null;
        return run && !isTerminal(run.status) && t.status === 'running' ? null : t;
      }),
    );
    const results = await Promise.allSettled(open.map((t) => t && cancelTask(session, t.id)));
    const failed = results.find((r) => r.status === 'rejected');
    if (failed) throw failed.reason;
  }

  runs.guardStart(mayStart, (run) => run.trigger.type === 'task');
  runs.onRunStarted(onRunStarted);
  runs.onRunFinished(onRunFinished);

  return {
    repliedAmong,
    /** Adds one task or a whole DAG; every error of the batch comes back in one 422. */
    async add(session: Session, inputs: TaskInput[]): Promise<TaskRecord[]> {
      // new work: refused while the tenant's line of runs has no room for the tasks that may start at once (those
      // that wait on none of the batch's own), as a new run is (one batch of 200 such tasks took the line from 1
      // run waiting to 201 under a limit of 3)
      const ownIds = new Set(inputs.flatMap((t) => (t.id === undefined ? [] : [t.id])));
      await runs.assertRoom(session.tenant_id, inputs.filter((t) => !(t.depends_on ?? []).some((d) => ownIds.has(d))).length || 1);
      // a run's session follows its one run: a task in it would run unseen by its status and outcome
      assertMultiAgent(session, 'tasks');
      // of the session's tasks, only those the new ones name (their ids, their dependencies) and how many there
      // are: reading every task of the session, twice, cost an add 200 ms at 10,000 tasks
      const named = [...new Set(inputs.flatMap((t) => [...(t.id === undefined ? [] : [t.id]), ...(t.depends_on ?? [])]))];
      const [existing, counts, agents, lastSeq] = await Promise.all([
        store.tasks.getMany(session.tenant_id, session.id, named),
        store.tasks.counts(session.tenant_id, session.id),
        store.agents.list(session.tenant_id, session.id),
        store.messages.lastSeq(session.tenant_id, session.id),
      ]);
      const held = tasksIn(counts);
      const now = clock.now().toISOString();
      const records: TaskRecord[] = inputs.map((t) => ({
        id: t.id ?? newId('tsk'),
        tenant_id: session.tenant_id,
        session_id: session.id,
        title: t.title ?? null,
        // a goal of blanks is none, as a run's is (its agent would be asked for nothing and the run refused)
        goal: t.goal?.trim() ? t.goal : null,
        steps: t.steps?.length ? t.steps.map((s) => ({ ...s, args: s.args ?? {} })) : null,
        agent_id: t.agent_id ?? null,
        depends_on: t.depends_on ?? [],
        trigger_rule: t.trigger_rule ?? 'all_success',
        status: 'pending',
        attempts: 0,
        max_attempts: t.max_attempts ?? 2,
        run_ids: [],
        output: null,
        inbox_after: lastSeq,
        // after every task the session has, however large an earlier batch was: numbered by the insert, from the
        // count it checks the cap against in its own transaction, so that two adds at once never share a position
        position: 0,
        created_at: now,
        updated_at: now,
      }));
      const agentOf = new Map(agents.map((a) => [a.id, a]));
      const errors = dagErrors(existing, records, new Set(agentOf.keys()));
      // every resume, archive and listing reads all of a session's tasks. The count read above answers most at
      // once, with the batch's other errors; the insert's own check is the one that holds when batches race
      const max = deps.settings.sessionMaxTasks;
      if (held + records.length > max) errors.push(tooMany(max, held));
      records.forEach((t, i) => {
        // the API's own limits, for what does not come through it (the session tool): a task of 5,000
        // dependencies would take 5,000 outputs as its inputs.upstream
        if (t.depends_on.length > TASK_LIMITS.depends_on)
          errors.push({ path: `/body/tasks/${i}/depends_on`, message: `at most ${TASK_LIMITS.depends_on} dependencies` });
        if (t.title !== null && longer(t.title, TASK_LIMITS.title))
          errors.push({ path: `/body/tasks/${i}/title`, message: `at most ${TASK_LIMITS.title} characters` });
        if (t.goal !== null && longer(t.goal, TASK_LIMITS.goal))
          errors.push({ path: `/body/tasks/${i}/goal`, message: `at most ${TASK_LIMITS.goal} characters` });
        if (!t.goal && !t.steps) errors.push({ path: `/body/tasks/${i}`, message: 'give the work to do: steps, or a goal for its agent' });
        if (t.goal && t.steps)
          errors.push({ path: `/body/tasks/${i}`, message: 'give steps or a goal, not both: a goal is for an agent to plan, steps are the plan' });
        if (t.goal && !t.steps && !t.agent_id) errors.push({ path: `/body/tasks/${i}/agent_id`, message: 'a task with a goal needs an agent to pursue it' });
        // the task's run has its agent's allowlist: a step outside it would fail each of its tries
        const allowed = t.agent_id ? agentOf.get(t.agent_id)?.tool_allowlist : undefined;
        t.steps?.forEach((step, j) => {
          if (allowed && !allowed.includes(step.tool))
            errors.push({ path: `/body/tasks/${i}/steps/${j}/tool`, message: `"${step.tool}" is not in the tool_allowlist of agent ${t.agent_id}` });
        });
      });
      if (errors.length) throw new TaskGraphInvalidError(errors.map((e) => `${e.path}: ${e.message}`).join('; '), errors);
      // the operator's tool policy and the agent endpoint are checked now, not when a task becomes ready
      records.forEach((t, i) => {
        allowlistOf(deps.settings, t.agent_id ? agentOf.get(t.agent_id)?.tool_allowlist : undefined, t.steps, `/body/tasks/${i}`);
        requireAgentFor(deps.settings, t.steps, `task ${t.id}`);
      });
      // only into a session not archived since it was read: an archive that answered has the last word on
      // its session's tasks and outcome. A session that had ended loses its outcome in the same write: the
      // recount below comes after Redis has the tasks and the ready ones have their runs, and until then the
      // session answered succeeded (and was listed among the finished) with this work pending
      const inserted = await store.tasks.insertMany(records, { maxHeld: max, whileLive: true, reopenAt: now });
      if (inserted === 'archived') throw new ConflictError(`session ${session.id} is archived and read-only`, { status: 'archived' });
      // another batch stored since the count above: the session as it is now
      if (inserted === 'over-cap') {
        const over = tooMany(max, tasksIn(await store.tasks.counts(session.tenant_id, session.id)));
        throw new TaskGraphInvalidError(`${over.path}: ${over.message}`, [over]);
      }
      // ids checked against the tasks read above; one taken since, by a request at the same time, is the same error
      if (inserted === 'id-taken') {
        const taken = new Set(
          (
            await store.tasks.getMany(
              session.tenant_id,
              session.id,
              records.map((t) => t.id),
            )
          ).map((t) => t.id),
        );
        const clashes = records.flatMap((t, i) => (taken.has(t.id) ? [{ path: `/body/tasks/${i}/id`, message: `task id ${t.id} is used twice` }] : []));
        throw new TaskGraphInvalidError(clashes.map((e) => `${e.path}: ${e.message}`).join('; '), clashes);
      }
      // the trace hears of the reopened session before it hears of the new tasks, with the session as it is now
      // (the store changed its outcome only: pending tasks move no status)
      const reopened = inserted === 'reopened' ? await store.sessions.get(session.tenant_id, session.id) : null;
      // appends keep the order they are asked in: all of them in one round trip, not one round trip each.
      // Stored, the tasks stand: a Redis that does not answer holds the answer no longer than its deadline,
      // and the reconciler registers what it never took
      const registered = await afterStored(
        Promise.all([reopened && deps.emitSession(reopened), Promise.all(records.map(emit)), dag.add(session.id, records, endedAmong(existing, records))]),
        log,
        { session_id: session.id },
        'registering new tasks (the reconciler registers what Redis never took)',
      );
      if (registered) await apply(session, registered[2]);
      // the session as it is now, these stored: archived meanwhile (on MongoDB the insert's check cannot hold
      // off an archive), its archive listed the tasks before these, so they end here as it ended the rest
      // (held by the pause, none would ever start or end); held by a pause that a resume, listing the tasks
      // before these, has ended since: started now
      const current = await store.sessions.get(session.tenant_id, session.id);
      if (current?.status === 'archived')
        await cancelAll(current).catch((err: unknown) =>
          log.error({ err, session_id: session.id }, 'tasks added as the session was archived could not all be canceled; the next DELETE ends them'),
        );
      else if (session.status === 'paused' && current && current.status !== 'paused') await resume(current);
      await deps.recount(session.tenant_id, session.id);
      const stored = new Map(
        (
          await store.tasks.getMany(
            session.tenant_id,
            session.id,
            records.map((t) => t.id),
          )
        ).map((t) => [t.id, t]),
      );
      return records.map((t) => stored.get(t.id)!);
    },

    resume,

    cancelAll,

    /** A message was posted: the waiting tasks it answers start their next run. */
    async answer(session: Session, message: MessageRecord): Promise<void> {
      if (session.kind !== 'multi_agent' || session.status === 'paused' || !mayAnswer(message)) return;
      // the waiting tasks alone, through an index: reading every task of the session to find them took a message
      // 77-153 ms among 10,000 pending tasks
      const tasks = await store.tasks.listIn(session.tenant_id, session.id, 'input_required');
      // most messages find no task waiting: nothing more is read for them
      if (!tasks.length) return;
      const replied = await repliedAmong(session, [message]);
      for (const t of tasks) {
        if (answers(t, message, replied))
          await continueTask(session, t).catch((err: unknown) => log.error({ err, task_id: t.id }, 'an answered task could not continue'));
      }
    },

    /**
     * Repairs what a crash between two writes leaves, so no task is stuck: a task whose run has ended
     * but which did not move (its process died before the hook) is finished now; a task that Redis made
     * ready but that never got its run (pending or queued without one, its session not paused) starts now.
     */
    async reconcile(olderThanMs = 10_000): Promise<{ finished: number; started: number }> {
      const before = new Date(clock.now().getTime() - olderThanMs).toISOString();
      let finished = 0;
      let started = 0;
      // one task that cannot be repaired (its session's store row, a run refused) holds back no other
      const repair = async (t: TaskRecord, fn: () => Promise<void>) => {
        try {
          await fn();
        } catch (err) {
          log.error({ err, session_id: t.session_id, task_id: t.id }, 'a task could not be repaired; the next pass tries again');
        }
      };
      for (const status of ['queued', 'running'] as const) {
        for await (const t of stale(status, before))
          await repair(t, async () => {
            const runId = t.run_ids.at(-1);
            const run = runId ? await store.runs.get(t.tenant_id, runId) : null;
            if (run && isTerminal(run.status)) {
              await onRunFinished(run);
              finished++;
            } else if (!runId) {
              const session = await store.sessions.get(t.tenant_id, t.session_id);
              // held, or ready, as its session was archived (the process that added it died before it ended it)
              if (session?.status === 'archived') {
                await cancelTask(session, t.id);
                await deps.recount(t.tenant_id, t.session_id);
                finished++;
              } else if (session && session.status !== 'paused' && (await dispatch(session, t.id))) {
                await deps.recount(t.tenant_id, t.session_id);
                started++;
              }
            }
          });
      }
      for await (const t of stale('pending', before))
        await repair(t, async () => {
          const state = await dag.stateOf(t.session_id, t.id);
          // failed upstream in Redis, its move lost (the process died, or the store refused, between a dependency's
          // end in Redis and its dependents' moves; or an add's answer never came): moved now, as the walk decided
          if (state === 'upstream_failed') {
            if (await move(t, { status: 'upstream_failed' }, ['pending', 'queued'])) finished++;
            await deps.recount(t.tenant_id, t.session_id);
            return;
          }
          // ended in Redis, its move lost (its end's store write refused, or the process died between the two: a ready
          // task whose run could not be started, a task the archive cut): its end is applied now (Redis's first
          // writer won, so its end never comes again), and its session can end
          if (state === 'succeeded' || state === 'failed' || state === 'canceled') {
            const lost = { code: 'task-end-not-stored', message: `the task ${state}; why was lost with the store's write of its end` };
            if (await move(t, { status: state, ...(state === 'succeeded' ? {} : { output: { status: state, error: lost } }) }, ['pending', 'queued']))
              finished++;
            await deps.recount(t.tenant_id, t.session_id);
            return;
          }
          if (state !== 'queued' && state !== 'pending' && state !== null) return;
          // pending in Redis: waiting on a dependency, unless Redis came back with older data (a restart from an
          // older save, a failover to a replica behind) in which a dependency the store has ended had not ended
          const ended = state === 'queued' ? [] : endedAmong(await store.tasks.getMany(t.tenant_id, t.session_id, t.depends_on), [t]);
          if (state === 'pending' && !ended.length) return;
          const session = await store.sessions.get(t.tenant_id, t.session_id);
          if (!session) return;
          if (session.status === 'archived') {
            await cancelTask(session, t.id);
            finished++;
          } else if (state !== 'queued') {
            // stored, never registered (its request's Redis work was cut off), or its dependencies' ends lost: registered
            // now with what the store has ended, and what that makes ready starts (nothing, for a task that still waits)
            const change = await dag.add(t.session_id, [t], ended);
            if (state === 'pending' && !change.ready.length && !change.upstreamFailed.length) return;
            await apply(session, change);
            started += change.ready.length;
            finished += change.upstreamFailed.length;
          } else if (await dispatch(session, t.id)) {
            // a task the normal path started since the page was read is no repair: dispatch found its run
            started++;
          }
          await deps.recount(t.tenant_id, t.session_id);
        });
      // an answer whose continuation was lost with its process: the waiting tasks of a session together, its messages
      // read once for all of them
      const waiting = new Map<string, TaskRecord[]>();
      for await (const t of stale('input_required', before)) {
        const key = `${t.tenant_id}/${t.session_id}`;
        const same = waiting.get(key);
        if (same) same.push(t);
        else waiting.set(key, [t]);
      }
      for (const [first, ...rest] of waiting.values())
        await repair(first!, async () => {
          const session = await store.sessions.get(first!.tenant_id, first!.session_id);
          if (session) started += await continueAnswered(session, [first!, ...rest]);
        });
      if (finished || started) log.warn({ finished, started }, 'reconciler repaired session tasks');
      return { finished, started };
    },

    /** The session's status and outcome from how many of its tasks are in each status. */
    statusOf(session: Session, counts: Partial<Record<TaskStatus, number>>): { status: SessionStatus; outcome: Session['outcome'] } {
      const n = (...statuses: TaskStatus[]) => statuses.reduce((sum, st) => sum + (counts[st] ?? 0), 0);
      const total = n(...TASK_STATUSES);
      const status: SessionStatus = session.status === 'paused' ? 'paused' : n('input_required') ? 'waiting' : n('queued', 'running') ? 'running' : 'idle';
      // archived with no task: nothing will ever run in it
      if (!total) return { status, outcome: session.status === 'archived' ? 'canceled' : null };
      if (n(...TERMINAL_TASK_STATUSES) < total) return { status, outcome: null };
      // a task that failed on its own fails the session; one canceled (and the dependents it stopped, which
      // end upstream_failed) cancels it: the same mix gives the same outcome whether or not it was archived
      const outcome = n('failed') ? 'failed' : n('canceled', 'upstream_failed') ? 'canceled' : 'succeeded';
      return { status, outcome };
    },

    /** Model tokens of the session's tasks, summed from their runs' usage. */
    usageOf(tasks: TaskRecord[]): { prompt_tokens: number; completion_tokens: number } {
      const sum = { prompt_tokens: 0, completion_tokens: 0 };
      for (const t of tasks) {
        const usage = (t.output?.usage ?? {}) as { prompt_tokens?: number; completion_tokens?: number };
        sum.prompt_tokens += usage.prompt_tokens ?? 0;
        sum.completion_tokens += usage.completion_tokens ?? 0;
      }
      return sum;
    },

    countsOf(tasks: TaskRecord[]): Record<TaskStatus, number> {
      const counts = { pending: 0, queued: 0, running: 0, input_required: 0, succeeded: 0, failed: 0, upstream_failed: 0, canceled: 0 };
      for (const t of tasks) counts[t.status]++;
      return counts;
    },
  };
}

/** Calls `fn` on each item, at most `n` at a time; `fn` handles its own failures. */
async function inTurns<T>(items: readonly T[], n: number, fn: (item: T) => Promise<unknown>): Promise<void> {
  let next = 0;
  const lane = async () => {
    while (next < items.length) await fn(items[next++]!);
  };
  await Promise.all(Array.from({ length: Math.min(n, items.length) }, lane));
}

type Kept = { tool: string; output: unknown; output_truncated?: true };

const jsonBytes = (v: unknown) => Buffer.byteLength(JSON.stringify(v ?? null));

/**
 * A dependency's output with its `result` within `max` bytes of JSON: an agent's final answer (up to what the model
 * endpoint may answer, 16 MB) cut to fit, with `final_answer_truncated: true`; another result too large for it is
 * left out (`result: null, result_truncated: true`). Its status, summary, usage and steps are kept.
 */
function withResultWithin(out: unknown, max: number): unknown {
  if (!out || typeof out !== 'object') return out;
  const { result } = out as { result?: unknown };
  if (result === undefined || result === null || jsonBytes(result) <= max) return out;
  const answer = (result as { final_answer?: unknown }).final_answer;
  if (typeof answer === 'string') {
    // a character is at most 6 bytes of JSON (an escape); the marker and the quotes take the rest of the room
    const cut = answer.slice(0, Math.max(0, Math.floor((max - 64) / 6)));
    return { ...out, result: { final_answer: cut, final_answer_truncated: true } };
  }
  return { ...out, result: null, result_truncated: true };
}

/**
 * Dependencies' outputs trimmed to UPSTREAM_MAX_BYTES of JSON in all, as a task's own steps are trimmed: each
 * keeps its status, summary, usage and result (a result past an even share of half the room is cut, see
 * withResultWithin: a final answer of megabytes passed the cap whole), and its latest steps' outputs within an
 * even share of what is left (the share a small output does not use goes to the larger); what the shares leave
 * then keeps, in the order of `depends_on`, the latest of the steps left out that fit in it. A step left out has
 * `output: null, output_truncated: true`, which is counted: the room a step's output takes is what it adds to that.
 */
export function withinUpstreamCap(entries: readonly (readonly [string, unknown])[]): (readonly [string, unknown])[] {
  if (entries.reduce((sum, [, out]) => sum + jsonBytes(out), 0) <= UPSTREAM_MAX_BYTES) return [...entries];
  const resultMax = Math.floor(UPSTREAM_MAX_BYTES / 2 / Math.max(1, entries.length));
  const sized = entries.map(([dep, given]) => {
    const out = withResultWithin(given, resultMax);
    const steps = out && typeof out === 'object' && Array.isArray((out as { steps?: unknown }).steps) ? (out as { steps: Kept[] }).steps : [];
    const dropped = steps.map((st): Kept => ({ tool: st.tool, output: null, output_truncated: true }));
    // what keeping each step's output adds to its marker (one smaller than its marker is kept for nothing)
    const bytes = steps.map((st, j) => Math.max(0, jsonBytes(st) - jsonBytes(dropped[j])));
    const stepBytes = bytes.reduce((sum, b) => sum + b, 0);
    // with its key in upstream, a colon and a comma
    const rest = jsonBytes(steps.length ? { ...(out as object), steps: dropped } : out) + jsonBytes(dep) + 2;
    return { dep, out, steps, dropped, bytes, stepBytes, rest, kept: bytes.map((b) => b === 0) };
  });
  // and upstream's braces
  let left = Math.max(0, UPSTREAM_MAX_BYTES - 2 - sized.reduce((sum, e) => sum + e.rest, 0));
  // the even shares, from the smallest up: each takes its share of what is left, or less
  const bySize = [...sized].sort((a, b) => a.stepBytes - b.stepBytes);
  let shared = left;
  bySize.forEach((e, i) => {
    let room = Math.min(e.stepBytes, Math.floor(shared / (bySize.length - i)));
    shared -= room;
    for (let j = e.steps.length - 1; j >= 0; j--)
      if (!e.kept[j] && e.bytes[j]! <= room) {
        room -= e.bytes[j]!;
        left -= e.bytes[j]!;
        e.kept[j] = true;
      }
  });
  for (const e of sized)
    for (let j = e.steps.length - 1; j >= 0; j--)
      if (!e.kept[j] && e.bytes[j]! <= left) {
        left -= e.bytes[j]!;
        e.kept[j] = true;
      }
  return sized.map((e) =>
    e.kept.every(Boolean)
      ? ([e.dep, e.out] as const)
      : ([e.dep, { ...(e.out as object), steps: e.steps.map((st, j) => (e.kept[j] ? st : e.dropped[j])) }] as const),
  );
}

function withInstructions(agent: AgentRecord | null, goal: string): string {
  return agent?.instructions ? `${agent.instructions}\n\nYour task: ${goal}` : goal;
}

export type Tasks = ReturnType<typeof tasksOf>;
