// The tasks of a multi-agent session and the DAG dispatcher. A task becomes `queued` in Redis (Lua,
// dag-state.ts) when its last dependency is satisfied; it is then a run of kind `session_task`
// (created once per task: its idempotency key is the task), with the outputs of its dependencies as
// `inputs.upstream` and the task's `max_attempts` as the run's retry policy. The run's start and end
// move the task (hooks on the run lifecycle); every change is written to the store and sent as a
// `task.updated` event on the session's trace. A paused session holds its ready tasks: they start on resume.
import type { Platform } from '../deps.js';
import {
  AgentNotConfiguredError,
  isTerminal,
  scopes,
  TERMINAL_TASK_STATUSES,
  TaskGraphInvalidError,
  newId,
  type AgentRecord,
  type Run,
  type Session,
  type SessionStatus,
  type Step,
  type TaskRecord,
  type TaskStatus,
  type TriggerRule,
} from '../platform/index.js';
import { allowlistOf, type Runs, type ToolPolicy } from '../runs/index.js';
import { dagErrors, dagOrder } from './dag.js';
import type { DagState } from './dag-state.js';

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
  settings: ToolPolicy & { agent: unknown };
  dag: DagState;
  /** tells the session that its tasks changed (status, outcome) */
  recount(tenantId: string, sessionId: string, started?: boolean): Promise<void>;
};

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

  async function move(t: Pick<TaskRecord, 'tenant_id' | 'session_id' | 'id'>, changes: Partial<TaskRecord>, from: TaskStatus[]): Promise<TaskRecord | null> {
    const moved = await store.tasks.update(t.tenant_id, t.session_id, t.id, { ...changes, updated_at: clock.now().toISOString() }, from);
    if (moved) await emit(moved);
    return moved;
  }

  /** Starts a ready task's run, unless its session is paused (then it waits, queued, for the resume). */
  async function dispatch(session: Session, taskId: string): Promise<void> {
    const task = await store.tasks.get(session.tenant_id, session.id, taskId);
    // a task is started once: pending, or queued by a pause and not started since
    if (!task || !(task.status === 'pending' || (task.status === 'queued' && !task.run_ids.length))) return;
    if (session.status === 'paused' || session.status === 'archived') {
      await move(task, { status: 'queued' }, ['pending']);
      return;
    }
    const agent = task.agent_id ? await store.agents.get(session.tenant_id, session.id, task.agent_id) : null;
    // the outputs of its dependencies, from one read of the session's tasks rather than one per dependency
    const outputs = task.depends_on.length ? new Map((await store.tasks.list(session.tenant_id, session.id)).map((t) => [t.id, t.output])) : new Map();
    const upstream = Object.fromEntries(task.depends_on.map((dep) => [dep, outputs.get(dep) ?? null]));
    const { run } = await runs.createIdempotent(
      session.tenant_id,
      `task:${session.id}:${task.id}`,
      { task: task.id },
      {
        kind: 'session_task',
        session_id: session.id,
        goal: task.goal ? withInstructions(agent, task.goal) : null,
        steps: task.steps,
        tool_allowlist: agent?.tool_allowlist,
        budget_seconds: agent?.budget.seconds,
        max_steps: agent?.budget.max_steps,
        retry: task.max_attempts > 1 ? { attempts: task.max_attempts, backoff: { type: 'fixed', delay_ms: 200 } } : null,
        inputs: { upstream, task: { id: task.id, title: task.title } },
        trigger: { type: 'task', task_id: task.id },
      },
    );
    await move(task, { status: 'queued', run_ids: [run.id], attempts: run.attempt }, ['pending', 'queued']);
  }

  async function apply(session: Session, change: { ready: string[]; upstreamFailed: string[] }): Promise<void> {
    for (const id of change.upstreamFailed)
      await move({ tenant_id: session.tenant_id, session_id: session.id, id }, { status: 'upstream_failed' }, ['pending', 'queued']);
    for (const id of change.ready) {
      try {
        await dispatch(session, id);
      } catch (err) {
        log.error({ err, session_id: session.id, task_id: id }, 'a ready task could not be started');
      }
    }
  }

  async function onRunStarted(run: Run): Promise<void> {
    if (run.trigger.type !== 'task') return;
    const taskId = run.trigger.task_id;
    await dag.start(run.session_id, taskId);
    await move({ tenant_id: run.tenant_id, session_id: run.session_id, id: taskId }, { status: 'running', attempts: run.attempt }, ['queued', 'running']);
    await deps.recount(run.tenant_id, run.session_id, true);
  }

  async function onRunFinished(run: Run): Promise<void> {
    if (run.trigger.type !== 'task') return;
    const taskId = run.trigger.task_id;
    const outcome = OUTCOME[run.status] ?? 'failed';
    const steps = await store.runs.steps(run.tenant_id, run.id, run.attempt);
    const output = {
      status: run.status,
      summary: run.summary,
      result: run.result,
      usage: run.usage,
      steps: steps.map((s) => ({ tool: s.tool, output: s.output })),
    };
    const change = await dag.complete(run.session_id, taskId, outcome);
    await move({ tenant_id: run.tenant_id, session_id: run.session_id, id: taskId }, { status: outcome, output, attempts: run.attempt }, [
      'pending',
      'queued',
      'running',
      'input_required',
    ]);
    const session = await store.sessions.get(run.tenant_id, run.session_id);
    if (change && session) await apply(session, change);
    await deps.recount(run.tenant_id, run.session_id);
  }

  runs.onRunStarted(onRunStarted);
  runs.onRunFinished(onRunFinished);

  return {
    /** Adds one task or a whole DAG; every error of the batch comes back in one 422. */
    async add(session: Session, inputs: TaskInput[]): Promise<TaskRecord[]> {
      const [existing, agents] = await Promise.all([store.tasks.list(session.tenant_id, session.id), store.agents.list(session.tenant_id, session.id)]);
      const now = clock.now();
      const records: TaskRecord[] = inputs.map((t, i) => ({
        id: t.id ?? newId('tsk'),
        tenant_id: session.tenant_id,
        session_id: session.id,
        title: t.title ?? null,
        goal: t.goal ?? null,
        steps: t.steps?.length ? t.steps.map((s) => ({ ...s, args: s.args ?? {} })) : null,
        agent_id: t.agent_id ?? null,
        depends_on: t.depends_on ?? [],
        trigger_rule: t.trigger_rule ?? 'all_success',
        status: 'pending',
        attempts: 0,
        max_attempts: t.max_attempts ?? 2,
        run_ids: [],
        output: null,
        // one millisecond apart, so creation order breaks ties in DAG order as given
        created_at: new Date(now.getTime() + i).toISOString(),
        updated_at: now.toISOString(),
      }));
      const errors = dagErrors(existing, records, new Set(agents.map((a) => a.id)));
      records.forEach((t, i) => {
        if (!t.goal && !t.steps) errors.push({ path: `/body/tasks/${i}`, message: 'give the work to do: steps, or a goal for its agent' });
        if (t.goal && !t.steps && !t.agent_id) errors.push({ path: `/body/tasks/${i}/agent_id`, message: 'a task with a goal needs an agent to pursue it' });
      });
      if (errors.length) throw new TaskGraphInvalidError(errors.map((e) => `${e.path}: ${e.message}`).join('; '), errors);
      // the operator's tool policy and the agent endpoint are checked now, not when a task becomes ready
      records.forEach((t, i) => {
        const agent = agents.find((a) => a.id === t.agent_id);
        allowlistOf(deps.settings, agent?.tool_allowlist, t.steps, `/body/tasks/${i}`);
        if (!t.steps && !deps.settings.agent) {
          throw new AgentNotConfiguredError('a task with a goal needs an agent endpoint (SERVICE_AGENT_BASE_URL, SERVICE_AGENT_MODEL)');
        }
      });
      await store.tasks.insertMany(records);
      for (const t of records) await emit(t);
      await apply(session, await dag.add(session.id, records));
      await deps.recount(session.tenant_id, session.id);
      return Promise.all(records.map(async (t) => (await store.tasks.get(t.tenant_id, t.session_id, t.id))!));
    },

    /** Every task of a session in DAG order (topological, ties by creation). */
    async list(tenantId: string, sessionId: string): Promise<TaskRecord[]> {
      return dagOrder(await store.tasks.list(tenantId, sessionId));
    },

    /** Starts the tasks that became ready while the session was paused. */
    async resume(session: Session): Promise<void> {
      for (const t of await store.tasks.list(session.tenant_id, session.id)) {
        if (t.status === 'queued' && !t.run_ids.length)
          await dispatch(session, t.id).catch((err: unknown) => log.error({ err, task_id: t.id }, 'a held task could not start'));
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
      for (const status of ['queued', 'running'] as const) {
        for (const t of await store.tasks.listStale(status, before, 500)) {
          const runId = t.run_ids.at(-1);
          const run = runId ? await store.runs.get(t.tenant_id, runId) : null;
          if (run && isTerminal(run.status)) {
            await onRunFinished(run);
            finished++;
          } else if (!runId) {
            const session = await store.sessions.get(t.tenant_id, t.session_id);
            if (session && session.status !== 'paused' && session.status !== 'archived') {
              await dispatch(session, t.id);
              started++;
            }
          }
        }
      }
      for (const t of await store.tasks.listStale('pending', before, 500)) {
        if ((await dag.stateOf(t.session_id, t.id)) !== 'queued') continue;
        const session = await store.sessions.get(t.tenant_id, t.session_id);
        if (!session) continue;
        await dispatch(session, t.id);
        started++;
      }
      if (finished || started) log.warn({ finished, started }, 'reconciler repaired session tasks');
      return { finished, started };
    },

    /** The session's status and outcome from its tasks. */
    statusOf(session: Session, tasks: TaskRecord[]): { status: SessionStatus; outcome: Session['outcome'] } {
      if (!tasks.length) return { status: session.status === 'paused' ? 'paused' : 'idle', outcome: null };
      const active = tasks.some((t) => t.status === 'queued' || t.status === 'running' || t.status === 'pending');
      const waiting = tasks.some((t) => t.status === 'input_required');
      const ended = tasks.every((t) => TERMINAL_TASK_STATUSES.includes(t.status));
      const status: SessionStatus =
        session.status === 'paused' ? 'paused' : waiting ? 'waiting' : tasks.some((t) => t.status === 'queued' || t.status === 'running') ? 'running' : 'idle';
      const outcome =
        !ended || active
          ? null
          : tasks.some((t) => t.status === 'failed' || t.status === 'upstream_failed')
            ? 'failed'
            : tasks.some((t) => t.status === 'canceled')
              ? 'canceled'
              : 'succeeded';
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

function withInstructions(agent: AgentRecord | null, goal: string): string {
  return agent?.instructions ? `${agent.instructions}\n\nYour task: ${goal}` : goal;
}

export type Tasks = ReturnType<typeof tasksOf>;
