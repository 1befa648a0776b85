// Executes one run in a worker. Every transition is conditional on the status it expects, so a job
// that runs twice cannot apply one twice: a run already finished is left alone, and a run found
// `running` at start belonged to a worker that died (it ends failed with worker-lost). The budget is
// an AbortSignal: at the deadline the step in flight is aborted and its processes killed.
import { AgentError, runAgent } from './agent.js';
import type { ServiceEvent } from '../platform/index.js';
import type { ErrorInfo, Run, RunStatus, StepRecord } from '../store/index.js';
import { appendRunEvent, type Runs, type RunsDeps } from './runs.js';
import { TOOLS, ToolError, type ToolContext, type ToolResult } from '../tools/index.js';
import { makeScratch, type Scratch } from './workspace.js';

const OUTPUT_FLUSH_MS = 50;
const OUTPUT_FLUSH_BYTES = 16 * 1024;
const STREAMED_MAX_BYTES = 1024 * 1024;
const PROGRESS_SAVE_MS = 200;

type StopReason = { status: Extract<RunStatus, 'canceled' | 'timed_out'>; error: ErrorInfo };

export function executorOf(deps: RunsDeps, runs: Runs) {
  const { store, clock, log, events, settings } = deps;
  /** the AbortController of each run this process is executing, for cancel requests */
  const inFlight = new Map<string, AbortController>();

  const emit = (run: Run, type: string, data: Record<string, unknown>): Promise<ServiceEvent> => appendRunEvent(events, run, type, data);

  async function finish(run: Run, changes: Partial<Run>): Promise<void> {
    stopSavingProgress(run.id);
    const finishedAt = clock.now();
    const started = new Date(run.started_at ?? run.created_at).getTime();
    const done = await store.runs.update(
      run.tenant_id,
      run.id,
      {
        ...changes,
        finished_at: finishedAt.toISOString(),
        duration_ms: finishedAt.getTime() - started,
        usage: { ...run.usage, seconds: (finishedAt.getTime() - started) / 1000 },
      },
      ['running'],
    );
    if (done) {
      deps.metrics.runDuration.observe({ kind: done.kind, status: done.status }, (done.duration_ms ?? 0) / 1000);
      deps.metrics.runsFinished.inc({ kind: done.kind, status: done.status });
      await emit(done, 'run.finished', {
        status: done.status,
        summary: done.summary,
        error: done.error,
        duration_ms: done.duration_ms,
        result: done.result ? { changed_files: done.result.changed_files } : null,
      });
      log.info({ tenant_id: run.tenant_id, run_id: run.id, status: done.status, duration_ms: done.duration_ms, request_id: run.request_id }, 'run finished');
    }
  }

  /**
   * Keeps the stored run's progress current while it runs (GET /runs/{id} shows it), at most every
   * PROGRESS_SAVE_MS: a run of quick steps writes its progress once, when it finishes.
   */
  const progressTimers = new Map<string, NodeJS.Timeout>();
  const saveProgress = (run: Run) => {
    if (progressTimers.has(run.id)) return;
    const timer = setTimeout(() => {
      progressTimers.delete(run.id);
      void store.runs
        .update(run.tenant_id, run.id, { steps: run.steps, usage: run.usage, agent_turns: run.agent_turns }, ['running'])
        .catch((err: unknown) => log.warn({ run_id: run.id, err: (err as Error).message }, 'progress not saved'));
    }, PROGRESS_SAVE_MS);
    progressTimers.set(run.id, timer);
  };
  const stopSavingProgress = (runId: string) => {
    clearTimeout(progressTimers.get(runId));
    progressTimers.delete(runId);
  };

  async function execute(runId: string, tenantId: string): Promise<void> {
    const found = await store.runs.get(tenantId, runId);
    if (!found) return;
    if (found.status !== 'queued' && found.status !== 'running') return runs.release(tenantId, runId);
    if (found.status === 'running') {
      // a previous attempt started it and its worker died (stalled job): its steps may have had
      // effects, so it is not run again
      await finish(found, { status: 'failed', error: { code: 'worker-lost', message: 'the worker running this run stopped' }, summary: 'failed: worker lost' });
      return runs.release(tenantId, runId);
    }
    const startedAt = clock.now();
    const run = await store.runs.update(tenantId, runId, { status: 'running', started_at: startedAt.toISOString() }, ['queued']);
    if (!run) return runs.release(tenantId, runId); // canceled meanwhile
    const controller = new AbortController();
    inFlight.set(runId, controller);
    const budgetMs = run.budget.seconds * 1000;
    const deadline = setTimeout(
      () =>
        controller.abort({
          status: 'timed_out',
          error: { code: 'budget-exceeded', message: `the budget of ${run.budget.seconds} s ran out` },
        } satisfies StopReason),
      budgetMs,
    );
    let scratch: Scratch | undefined;
    try {
      await emit(run, 'run.started', { kind: run.kind, budget: run.budget, queued_ms: startedAt.getTime() - new Date(run.created_at).getTime() });
      if (await runs.isCancelRequested(runId)) controller.abort({ status: 'canceled', error: { code: 'canceled', message: 'canceled' } } satisfies StopReason);
      if (run.kind === 'vibe') {
        scratch = await makeScratch(run.workspace);
        await emit(run, 'workspace.ready', { kind: scratch.kind });
      }
      const outcome = await work(run, scratch?.dir ?? run.workspace, controller.signal);
      if (scratch) {
        const { diff, changed_files, truncated } = await scratch.diff();
        run.result = { ...(run.result ?? {}), diff, changed_files, ...(truncated ? { diff_truncated: true } : {}) };
      }
      const stop = controller.signal.aborted ? (controller.signal.reason as StopReason) : undefined;
      const status: RunStatus = stop?.status ?? (outcome.error ? 'failed' : 'succeeded');
      const error = stop?.error ?? outcome.error ?? null;
      const summary = status === 'succeeded' ? outcome.summary : `${status.replace('_', ' ')}: ${error?.message ?? ''}`.trim();
      await finish(run, { status, error, summary, steps: run.steps, usage: run.usage, agent_turns: run.agent_turns, result: run.result });
    } catch (err) {
      log.error({ err, run_id: runId }, 'run failed unexpectedly');
      await finish(run, {
        status: 'failed',
        error: { code: 'internal', message: 'the run failed unexpectedly' },
        summary: 'failed: internal error',
        steps: run.steps,
        usage: run.usage,
        agent_turns: run.agent_turns,
      });
    } finally {
      clearTimeout(deadline);
      inFlight.delete(runId);
      await scratch?.remove().catch((err: unknown) => log.warn({ err, run_id: runId }, 'scratch workspace not removed'));
      await runs.release(tenantId, runId);
    }
  }

  /** Runs the planned steps, or the agent loop for a goal; says how it ended. */
  async function work(run: Run, workspace: string, signal: AbortSignal): Promise<{ summary: string; error?: ErrorInfo }> {
    const stepsLeft = () => (run.budget.max_steps === undefined ? undefined : run.budget.max_steps - run.usage.steps);
    if (run.steps.length) {
      for (const step of run.steps) {
        if (signal.aborted) {
          step.status = 'skipped';
          continue;
        }
        const left = stepsLeft();
        if (left !== undefined && left <= 0) {
          step.status = 'skipped';
          return { summary: '', error: { code: 'max-steps-reached', message: `max_steps (${run.budget.max_steps}) reached before step ${step.index}` } };
        }
        const result = await runStep(run, step, workspace, signal);
        if (result.error && !signal.aborted) {
          run.steps.slice(step.index + 1).forEach((s) => (s.status = 'skipped'));
          return { summary: '', error: { code: result.error.code, message: `step ${step.index} (${step.tool}): ${result.error.message}` } };
        }
      }
      return { summary: `${run.steps.length} step${run.steps.length === 1 ? '' : 's'} succeeded` };
    }
    const allowed = run.tool_allowlist.map((t) => TOOLS.get(t)).filter((t) => t !== undefined);
    try {
      const outcome = await runAgent({
        endpoint: settings.agent!,
        goal: run.goal ?? '',
        inputs: run.inputs,
        tools: allowed,
        signal,
        stepsLeft,
        callTool: async (tool, args) => {
          const step: StepRecord = {
            index: run.steps.length,
            name: null,
            tool,
            args,
            status: 'pending',
            source: 'agent',
            started_at: null,
            finished_at: null,
            duration_ms: null,
            output: null,
            error: null,
          };
          run.steps.push(step);
          return runStep(run, step, workspace, signal);
        },
        onTurn: async (turn) => {
          const full = { ...turn, index: run.agent_turns.length, at: clock.now().toISOString() };
          run.agent_turns.push(full);
          run.usage.model_turns++;
          await emit(run, 'agent.turn', full);
        },
      });
      if (outcome.stopped_by === 'max_steps')
        return { summary: '', error: { code: 'max-steps-reached', message: `max_steps (${run.budget.max_steps}) reached before the agent finished` } };
      run.result = { final_answer: outcome.answer ?? '' };
      return { summary: (outcome.answer ?? 'the agent finished').split('\n')[0]!.slice(0, 300) };
    } catch (err) {
      if (signal.aborted) return { summary: '' };
      if (err instanceof AgentError) return { summary: '', error: { code: err.code, message: err.message } };
      throw err;
    }
  }

  async function runStep(run: Run, step: StepRecord, workspace: string, signal: AbortSignal): Promise<ToolResult> {
    const started = clock.now();
    step.started_at = started.toISOString();
    run.usage.steps++;
    await emit(run, 'step.started', { index: step.index, tool: step.tool, name: step.name, args: step.args, source: step.source });
    let result: ToolResult;
    const tool = TOOLS.get(step.tool);
    if (!run.tool_allowlist.includes(step.tool)) {
      // refused before anything of it runs
      result = {
        output: {},
        error: { code: 'tool-not-allowed', message: `${step.tool} is not in this run's tool allowlist (${run.tool_allowlist.join(', ') || 'empty'})` },
      };
    } else if (!tool) {
      result = { output: {}, error: { code: 'tool-unavailable', message: `${step.tool} cannot run in this service yet` } };
    } else {
      step.status = 'running';
      saveProgress(run);
      const streamer = outputStreamer(run, step);
      const ctx: ToolContext = {
        workspace,
        signal,
        output: streamer.push,
        emit: async (type, data) => void (await emit(run, type, { ...data, step: step.index })),
        childEnv: settings.childEnv,
        httpAllowPrivate: settings.httpAllowPrivate,
      };
      try {
        result = await tool.execute(step.args, ctx);
      } catch (err) {
        if (err instanceof ToolError) result = { output: {}, error: { code: err.code, message: err.message } };
        else if (signal.aborted) result = { output: {}, error: { code: 'aborted', message: 'stopped' } };
        else throw err;
      } finally {
        await streamer.flush();
      }
    }
    const finished = clock.now();
    const stop = signal.aborted ? (signal.reason as StopReason) : undefined;
    step.status = stop ? stop.status : result.error ? 'failed' : 'succeeded';
    step.finished_at = finished.toISOString();
    step.duration_ms = finished.getTime() - started.getTime();
    step.output = result.output;
    step.error = stop?.error ?? result.error ?? null;
    saveProgress(run);
    await emit(run, 'step.finished', {
      index: step.index,
      tool: step.tool,
      status: step.status,
      duration_ms: step.duration_ms,
      error: step.error,
      exit_code: result.output.exit_code,
    });
    return result;
  }

  /** Coalesces output chunks into step.output events (every 50 ms or 16 KB), up to 1 MB a step. */
  function outputStreamer(run: Run, step: StepRecord) {
    const pending: Record<'stdout' | 'stderr', string> = { stdout: '', stderr: '' };
    let streamed = 0;
    let timer: NodeJS.Timeout | undefined;
    let chain = Promise.resolve();
    const flush = () => {
      clearTimeout(timer);
      timer = undefined;
      for (const stream of ['stdout', 'stderr'] as const) {
        const text = pending[stream];
        if (!text) continue;
        pending[stream] = '';
        chain = chain.then(() => emit(run, 'step.output', { index: step.index, stream, text }).then(() => undefined)).catch(() => undefined);
      }
      return chain;
    };
    return {
      push(stream: 'stdout' | 'stderr', text: string) {
        if (streamed >= STREAMED_MAX_BYTES) return;
        const room = STREAMED_MAX_BYTES - streamed;
        const piece = text.length > room ? text.slice(0, room) : text;
        streamed += piece.length;
        pending[stream] += piece;
        if (pending.stdout.length + pending.stderr.length >= OUTPUT_FLUSH_BYTES) void flush();
        else timer ??= setTimeout(() => void flush(), OUTPUT_FLUSH_MS);
      },
      flush,
    };
  }

  return {
    execute,
    /** Aborts a run this process is executing; false when it is not here. */
    abort(runId: string): boolean {
      const c = inFlight.get(runId);
      c?.abort({ status: 'canceled', error: { code: 'canceled', message: 'canceled while running' } } satisfies StopReason);
      return Boolean(c);
    },
  };
}

export type Executor = ReturnType<typeof executorOf>;
