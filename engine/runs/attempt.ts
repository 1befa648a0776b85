// One attempt of a run as a worker executes it: its step records (kept current in the store at most
// every PROGRESS_SAVE_MS, one row per changed step), its usage, the tool calls it makes and the events
// they send. Programs (programs.ts) drive it; the executor settles it.
import path from 'node:path';
import type { Platform } from '../deps.js';
import {
  AppError,
  EVENT_VALUE_MAX_BYTES,
  OutsideError,
  type AgentTurn,
  type ErrorInfo,
  type EventBody,
  type Run,
  type RunStatus,
  type StepRecord,
  type ToolName,
} from '../platform/index.js';
import {
  TOOLS,
  ToolError,
  type AuditActions,
  type ConnectionActions,
  type GateActions,
  type Sandbox,
  type SessionActions,
  type StepConnections,
  type ToolContext,
  type ToolResult,
  runProcess,
} from '../tools/index.js';
import type { Transitions } from './transitions.js';
import { CHECKOUTS_DIR, removeCheckout, tenantRootPath } from './workspace.js';

const OUTPUT_FLUSH_MS = 50;
const OUTPUT_FLUSH_BYTES = 16 * 1024;
const STREAMED_MAX_BYTES = 1024 * 1024;
/** What an attempt's steps stream in all: the event log lives in the shared Redis (a step's record keeps its own last 64 KB). */
export const ATTEMPT_STREAMED_MAX_BYTES = 8 * 1024 * 1024;
const PROGRESS_SAVE_MS = 200;
/** Where an event's value was cut: the run's record (GET /api/v1/runs/{id}) keeps all of it. */
export const CUT_MARK = "…[cut: the run's record keeps it whole]";

/** A plain object: not null, an array, or what a prototype makes (a class instance, a function). */
const isObjectRecord = (v: unknown): v is Record<string, unknown> =>
  typeof v === 'object' && v !== null && !Array.isArray(v) && [Object.prototype, null].includes(Object.getPrototypeOf(v));

/** Why an attempt was stopped before its work ended: the reason its AbortSignal carries. */
export type StopReason = { status: Extract<RunStatus, 'canceled' | 'timed_out'>; error: ErrorInfo } | { status: 'interrupted'; error: ErrorInfo };

export type AttemptDeps = Pick<Platform, 'store' | 'clock' | 'log'> & {
  transitions: Pick<Transitions, 'emit'>;
  sandbox: Sandbox;
  /** what a run may do to its tenant's sessions (the `session` and `message` tools, an agent's inbox) */
  sessionActions?: (run: Run) => SessionActions;
  /** the gates of a run's workspace, for the `gates` tool */
  gateActions?: (run: Run) => GateActions | undefined;
  /** the audit of a run's workspace, for the `audit` tool */
  auditActions?: (run: Run) => AuditActions | undefined;
  /** the tenant's connections, for the action tools */
  connectionActions?: (run: Run) => ConnectionActions | undefined;
  settings: {
    childEnv: Record<string, string>;
    httpAllowPrivate: boolean;
    toolsAllowed: readonly string[];
    allowNetwork: boolean;
    workspaceRoot: string;
    singleTenant: boolean;
  };
};

/** How long a stopped step waits for its tool to stop on its own before it is given up on. */
export const STUCK_TOOL_GRACE_MS = 5_000;

/**
 * A tool's work, given up on when the step was stopped (budget, cancel) and the tool has not settled
 * within the grace after: a tool blocked where it does not listen to the signal never holds its run past
 * its budget. Its work is left to settle on its own.
 */
function unlessStuck<T>(work: Promise<T>, signal: AbortSignal): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    let timer: NodeJS.Timeout | undefined;
    const onAbort = () => {
      timer = setTimeout(() => reject(new ToolError('aborted', `stopped; the tool did not stop within ${STUCK_TOOL_GRACE_MS / 1000} s`)), STUCK_TOOL_GRACE_MS);
    };
    if (signal.aborted) onAbort();
    else signal.addEventListener('abort', onAbort, { once: true });
    work.then(resolve, reject).finally(() => {
      clearTimeout(timer);
      signal.removeEventListener('abort', onAbort);
    });
  });
}

/** What JSON escapes in a string: quotes, backslashes and control characters (up to six times their size). */
const ESCAPED_IN_JSON = /["\\\u0000-\u001f]/;

/** The bytes `text` takes in the event log: as the content of a JSON string, in UTF-8. */
function jsonBytes(text: string): number {
  // most output has nothing to escape: its size is its UTF-8 size, without making its JSON
  return ESCAPED_IN_JSON.test(text) ? Buffer.byteLength(JSON.stringify(text)) - 2 : Buffer.byteLength(text);
}

/** The bytes one character (a code point) takes in a JSON string, in UTF-8: as JSON.stringify writes it. */
function jsonCharBytes(ch: string): number {
  const code = ch.codePointAt(0)!;
  if (ch === '"' || ch === '\\' || ch === '\b' || ch === '\f' || ch === '\n' || ch === '\r' || ch === '\t') return 2;
  if (code < 0x20 || (code >= 0xd800 && code <= 0xdfff)) return 6; // \u00XX, and a lone surrogate's \uXXXX
  return code < 0x80 ? 1 : code < 0x800 ? 2 : code < 0x10000 ? 3 : 4;
}

/** The longest start of `text` that is at most `max` bytes as the content of a JSON string, cut between characters. */
function jsonPrefix(text: string, max: number): string {
  let used = 0;
  let end = 0;
  for (const ch of text) {
    used += jsonCharBytes(ch);
    if (used > max) break;
    end += ch.length;
  }
  return text.slice(0, end);
}

/**
 * `value` as an event carries it: itself when its JSON is at most `max` bytes; past that, its strings cut
 * between characters and its later members left out once the room is spent, each cut marked with CUT_MARK
 * (a member `…` of an object, an element of a list). `room` may be shared by several values of one event.
 */
export function forEvent<T>(value: T, max = EVENT_VALUE_MAX_BYTES, room = { left: max }): T {
  const bytes = Buffer.byteLength(JSON.stringify(value) ?? '');
  if (bytes <= room.left) {
    room.left -= bytes;
    return value;
  }
  return cut(value, room) as T;
}

function cut(value: unknown, room: { left: number }): unknown {
  if (typeof value === 'string') {
    const bytes = jsonBytes(value) + 2;
    if (bytes <= room.left) {
      room.left -= bytes;
      return value;
    }
    const kept = jsonPrefix(value, Math.max(0, room.left - 2));
    room.left = 0;
    return kept + CUT_MARK;
  }
  if (Array.isArray(value)) {
    room.left -= 2;
    const out: unknown[] = [];
    for (const v of value) {
      if (room.left <= 0) {
        out.push(CUT_MARK);
        break;
      }
      out.push(cut(v, room));
      room.left -= 1;
    }
    return out;
  }
  if (value && typeof value === 'object') {
    room.left -= 2;
    // made as entries: a member named `__proto__` stays a member
    const out: [string, unknown][] = [];
    for (const [k, v] of Object.entries(value)) {
      const keyBytes = jsonBytes(k) + 3;
      if (room.left - keyBytes <= 0) {
        out.push(['…', CUT_MARK]);
        break;
      }
      room.left -= keyBytes;
      out.push([k, cut(v, room)]);
      room.left -= 1;
    }
    return Object.fromEntries(out);
  }
  room.left -= Buffer.byteLength(JSON.stringify(value) ?? '');
  return value;
}

export type Attempt = ReturnType<typeof startAttempt>;

export function startAttempt(deps: AttemptDeps, run: Run, workspace: string, signal: AbortSignal, deadlineAt: number) {
  const { store, clock, log, transitions } = deps;
  const steps: StepRecord[] = [];
  const usage: Run['usage'] = { steps: 0, model_turns: 0, seconds: 0 };
  const dirty = new Set<StepRecord>();
  let timer: NodeJS.Timeout | undefined;
  // The attempt's events are sent in the order they are asked for without waiting for each: the event
  // log keeps that order, and the settling transition's own event comes after them. One that Redis does
  // not take is tried again, the run's later events after it (transitions.emit); it does not undo what
  // the step did.
  const sending = new Set<Promise<unknown>>();
  const emit = (body: EventBody): void => {
    const sent: Promise<unknown> = transitions.emit(run, body).finally(() => sending.delete(sent));
    sending.add(sent);
  };
  const sessions = deps.sessionActions?.(run);
  const gates = deps.gateActions?.(run);
  const audit = deps.auditActions?.(run);
  const connections = deps.connectionActions?.(run);

  let checkoutDir: string | null = null;
  const checkouts = {
    async fresh() {
      const root = tenantRootPath(deps.settings, run.tenant_id);
      // the service's own folder in the tenant's root: a link or a file the tenant put in its place is removed
      // (the link, never what it points to), and the run's folder made again. In the sandbox, the root bound by
      // its descriptor: by path, as the service, a link a step put there between the check and the write led
      // the removal and the making elsewhere. A link put there after this is refused when the checkout binds it.
      // What a step made read-only there (a module cache, a build's output) is made writable first: the
      // sandbox's user has no power over permissions, where the service's (root) had
      const made = await runProcess(
        deps.sandbox,
        [
          '/bin/sh',
          '-c',
          'if [ -L "$1" ] || { [ -e "$1" ] && [ ! -d "$1" ]; }; then rm -f "$1"; fi; mkdir -p "$1" && chmod u+rwx "$1" && if [ -e "$1/$2" ]; then chmod -R u+rwX "$1/$2"; fi; rm -rf "$1/$2" && mkdir "$1/$2"',
          'fresh',
          `${deps.sandbox.workspacePath(root)}/${CHECKOUTS_DIR}`,
          run.id,
        ],
        { workspace: root, env: { PATH: deps.settings.childEnv.PATH ?? '/usr/bin:/bin' }, network: false, maxBytes: 64 * 1024 },
      );
      if (made.exit_code !== 0) throw new ToolError('checkout-failed', `the run's checkout folder could not be made (exit ${made.exit_code ?? made.signal})`);
      checkoutDir = path.join(root, CHECKOUTS_DIR, run.id);
      return checkoutDir;
    },
    use(dir: string) {
      attempt.workspace = dir;
    },
  };

  /** A tool that acts on a provider for its own step (the gates' check runs) needs that provider's tool allowed too. */
  const allowed = (provider: string) => {
    if (!run.tool_allowlist.includes(provider) || !deps.settings.toolsAllowed.includes(provider))
      throw new ToolError('tool-not-allowed', `acting on ${provider} needs the ${provider} tool in this run's tool allowlist (and SERVICE_TOOLS_ALLOWED)`);
  };

  /**
   * What a provider refused, a missing connection or an address not allowed fail the step with their
   * code; an answer the SDK took but this service could not read fails it too: never the run.
   */
  const stepError = (provider: string, err: unknown): unknown => {
    if (err instanceof ToolError || signal.aborted) return err;
    const code = (err as { code?: unknown }).code;
    if (typeof code === 'string') return new ToolError(code, (err as Error).message);
    return new ToolError('provider-error', `the ${provider} provider's answer could not be read (${(err as Error).message})`);
  };

  /** A step's way to its providers: each call and its answer are events of the run; what fails, fails the step. */
  const stepConnections = (step: StepRecord): StepConnections | undefined =>
    connections && {
      async git(named) {
        allowed('codehost');
        try {
          return await connections.git(named);
        } catch (err) {
          throw stepError('codehost', err);
        }
      },
      async act(provider, action, args) {
        allowed(provider);
        const { action: _action, ...rest } = args;
        emit({ type: 'provider.request', data: { step: step.index, provider, action, args: forEvent(rest) } });
        const started = clock.now().getTime();
        const done = (data: { connection_id: string | null; answer: Record<string, unknown> | null; error: ErrorInfo | null }) =>
          emit({
            type: 'provider.answer',
            data: { step: step.index, provider, action, ok: !data.error, duration_ms: clock.now().getTime() - started, ...data, answer: forEvent(data.answer) },
          });
        try {
          const { connection_id, answer } = await connections.act(provider, action, args, signal);
          done({ connection_id, answer, error: null });
          return answer;
        } catch (err) {
          const failed = stepError(provider, err);
          const info = failed instanceof ToolError ? { code: failed.code, message: failed.message } : { code: 'aborted', message: 'stopped' };
          done({ connection_id: null, answer: null, error: info });
          throw failed;
        }
      },
    };

  /** Writes the steps changed since the last save, at most every PROGRESS_SAVE_MS: quick runs write them once, at the end. */
  const touch = (step: StepRecord) => {
    dirty.add(step);
    timer ??= setTimeout(() => {
      timer = undefined;
      void store.runs
        .putSteps(run.tenant_id, run.id, run.attempt, takeDirty())
        .catch((err: unknown) => log.warn({ run_id: run.id, err: (err as Error).message }, 'progress not saved'));
    }, PROGRESS_SAVE_MS);
  };

  function takeDirty(): StepRecord[] {
    const out = [...dirty];
    dirty.clear();
    return out;
  }

  const stopReason = (): StopReason | undefined => (signal.aborted ? (signal.reason as StopReason) : undefined);

  /** Runs a step's tool; a step `refused` by its program (its arguments were too large) fails with that, and nothing of it runs. */
  /** Why a tool may not run in this run (its allowlist, the operator's), or null when it may. */
  function refusalOf(tool: string): ErrorInfo | null {
    if (run.tool_allowlist.includes(tool as ToolName) && deps.settings.toolsAllowed.includes(tool as ToolName)) return null;
    return {
      code: 'tool-not-allowed',
      message: run.tool_allowlist.includes(tool as ToolName)
        ? `${tool} is not allowed by the operator (SERVICE_TOOLS_ALLOWED)`
        : `${tool} is not in this run's tool allowlist (${run.tool_allowlist.join(', ') || 'empty'})`,
    };
  }

  async function runStep(step: StepRecord, refused?: ErrorInfo): Promise<ToolResult> {
    steps.push(step);
    const started = clock.now();
    step.started_at = started.toISOString();
    usage.steps++;
    // the arguments' start: a step's may be 1 MB (its record keeps them whole)
    emit({ type: 'step.started', data: { index: step.index, tool: step.tool, name: step.name, args: forEvent(step.args), source: step.source } });
    let result: ToolResult;
    const tool = TOOLS.get(step.tool);
    const notAllowed = refused ?? refusalOf(step.tool);
    // refused before anything of it runs
    if (notAllowed) result = { output: {}, error: notAllowed };
    else if (!tool) {
      result = { output: {}, error: { code: 'tool-unavailable', message: `${step.tool} cannot run in this service yet` } };
    } else {
      step.status = 'running';
      touch(step);
      const meter = streamMeter();
      const streamer = outputStreamer(step, meter);
      const ctx: ToolContext = {
        workspace: attempt.workspace,
        signal,
        output: streamer.push,
        // a message's text is streamed as output is, from the same room (the step's output keeps it whole);
        // one past the room still says that it was posted
        message: async (role, text) => {
          const taken = meter.take(text);
          const streamed = taken?.piece ?? '';
          emit({ type: 'message.created', data: { role, text: streamed, ...(streamed !== text ? { text_truncated: true } : {}), step: step.index } });
        },
        childEnv: deps.settings.childEnv,
        httpAllowPrivate: deps.settings.httpAllowPrivate,
        sandbox: deps.sandbox,
        network: run.network,
        networkAllowed: deps.settings.allowNetwork,
        checkouts,
        readOnlyBinds: attempt.readOnlyBinds,
        sessions,
        gates,
        audit,
        connections: stepConnections(step),
      };
      try {
        result = await unlessStuck(tool.execute(step.args, ctx), signal);
        // a step's output is an object (the API's StepRecord): anything else would be kept and make the run unreadable
        if (!isObjectRecord(result.output))
          result = { output: {}, error: { code: 'tool-failed', message: `${step.tool} answered something that is not an object` } };
      } catch (err) {
        // a tool's own error, or what the service refused it (another tenant's session, a gate set that is
        // not valid, an unknown gate): the step fails with its code
        if (err instanceof ToolError || err instanceof AppError || err instanceof OutsideError)
          result = { output: {}, error: { code: err.code, message: err.message } };
        else if (signal.aborted) result = { output: {}, error: { code: 'aborted', message: 'stopped' } };
        else {
          // what a tool did not expect (Node refusing a header, say) fails its step too: the step ends, with its event
          log.error({ err, run_id: run.id, step: step.index, tool: step.tool }, 'a tool failed unexpectedly');
          result = { output: {}, error: { code: 'tool-failed', message: `${step.tool} failed: ${String((err as Error)?.message ?? err).slice(0, 500)}` } };
        }
      } finally {
        streamer.flush();
      }
    }
    const finished = clock.now();
    const stop = stopReason();
    step.status = stop ? (stop.status === 'interrupted' ? 'canceled' : stop.status) : result.error ? 'failed' : 'succeeded';
    step.finished_at = finished.toISOString();
    step.duration_ms = finished.getTime() - started.getTime();
    step.output = result.output;
    step.error = stop?.error ?? result.error ?? null;
    touch(step);
    emit({
      type: 'step.finished',
      data: {
        index: step.index,
        tool: step.tool,
        status: step.status,
        duration_ms: step.duration_ms,
        error: step.error,
        exit_code: result.output.exit_code as number | null | undefined,
      },
    });
    return result;
  }

  let attemptStreamed = 0;
  /**
   * What a step streams of its output and its messages' text: up to 1 MB a step and 8 MB an attempt (of JSON
   * text, in UTF-8). `take` answers the start of a text that fits, counted, or null when no room is left.
   */
  function streamMeter() {
    let streamed = 0;
    return {
      take(text: string): { piece: string; bytes: number } | null {
        const room = Math.min(STREAMED_MAX_BYTES - streamed, ATTEMPT_STREAMED_MAX_BYTES - attemptStreamed);
        if (room <= 0) return null;
        // counted as the log keeps it: JSON, where a control character takes six bytes
        let bytes = jsonBytes(text);
        let piece = text;
        if (bytes > room) {
          piece = jsonPrefix(text, room);
          // the cut takes all the room left, though a shorter character might fit: what streams stays a prefix of the text
          bytes = room;
        }
        streamed += bytes;
        attemptStreamed += bytes;
        return { piece, bytes };
      },
    };
  }

  /** Coalesces output chunks into step.output events (every 50 ms or 16 KB), within the step's stream meter. */
  function outputStreamer(step: StepRecord, meter: ReturnType<typeof streamMeter>) {
    const pending: Record<'stdout' | 'stderr', string> = { stdout: '', stderr: '' };
    let pendingBytes = 0;
    let flushTimer: NodeJS.Timeout | undefined;
    const flush = () => {
      clearTimeout(flushTimer);
      flushTimer = undefined;
      pendingBytes = 0;
      for (const stream of ['stdout', 'stderr'] as const) {
        const text = pending[stream];
        if (!text) continue;
        pending[stream] = '';
        emit({ type: 'step.output', data: { index: step.index, stream, text } });
      }
    };
    return {
      push(stream: 'stdout' | 'stderr', text: string) {
        const taken = meter.take(text);
        if (!taken) return;
        pending[stream] += taken.piece;
        pendingBytes += taken.bytes;
        if (pendingBytes >= OUTPUT_FLUSH_BYTES) flush();
        else flushTimer ??= setTimeout(flush, OUTPUT_FLUSH_MS);
      },
      flush,
    };
  }

  const attempt = {
    run,
    /** where tools act: the run's workspace, or a vibe run's scratch copy of it */
    workspace,
    /** folders besides the workspace that sandboxed processes read (the objects a vibe run's scratch clone shares) */
    readOnlyBinds: [] as string[],
    signal,
    /** when the budget ends (ms since the epoch): the signal aborts then */
    deadlineAt,
    steps,
    usage,
    /** the run's tenant's sessions; `own` for a session task's run */
    sessions,
    /** the run's tenant's connections (the action tools); checked before the first step */
    connections,
    stopReason,
    runStep,
    refusalOf,
    /** A new step record at the end of the attempt's list. */
    newStep(fields: Pick<StepRecord, 'tool' | 'args' | 'name' | 'source'>): StepRecord {
      return { index: steps.length, ...fields, status: 'pending', started_at: null, finished_at: null, duration_ms: null, output: null, error: null };
    },
    /** Records a plan step that does not run (its `if` did not hold): listed in its place, counted against nothing. */
    skipStep(step: StepRecord): void {
      steps.push(step);
      step.status = 'skipped';
      touch(step);
    },
    /** Records a model turn, numbered in the attempt (its agent steps' turns one after another): a row of its own and an agent.turn event. */
    async addTurn(turn: Omit<AgentTurn, 'index' | 'at'>): Promise<void> {
      const full: AgentTurn = { ...turn, index: usage.model_turns++, at: clock.now().toISOString() };
      if (turn.usage?.prompt_tokens) usage.prompt_tokens = (usage.prompt_tokens ?? 0) + turn.usage.prompt_tokens;
      if (turn.usage?.completion_tokens) usage.completion_tokens = (usage.completion_tokens ?? 0) + turn.usage.completion_tokens;
      await store.runs.appendTurn(run.tenant_id, run.id, run.attempt, full);
      // the turn's text and its calls' arguments share one event's room (the run's agent_turns keep them whole)
      const room = { left: EVENT_VALUE_MAX_BYTES };
      const content = full.content === null ? null : forEvent(full.content, EVENT_VALUE_MAX_BYTES, room);
      const toolCalls = full.tool_calls.map((call) => ({ ...call, args: forEvent(call.args, EVENT_VALUE_MAX_BYTES, room) }));
      emit({ type: 'agent.turn', data: { ...full, content, tool_calls: toolCalls } });
    },
    /**
     * Removes what the attempt made for itself (its checkout), in the sandbox as it was made: by path, as the
     * service, a folder of it a step swapped for a link mid-removal led the removal into another tenant's root.
     */
    async cleanup(): Promise<void> {
      if (!checkoutDir) return;
      const failed = (why: string) => log.warn({ run_id: run.id, err: why }, 'a checkout was not removed (the leftovers sweep tries again)');
      await removeCheckout(deps.sandbox, tenantRootPath(deps.settings, run.tenant_id), run.id, deps.settings.childEnv.PATH).then(
        (code) => (code === 0 ? undefined : failed(`exit ${code}`)),
        (err: Error) => failed(err.message),
      );
    },
    /** Waits for the first try of the attempt's events (one Redis refused goes on being tried in the background). */
    async drained(): Promise<void> {
      await Promise.all(sending);
    },
    /** Stops saving progress; returns the steps changed since the last save, for the settling write. */
    close(): StepRecord[] {
      clearTimeout(timer);
      timer = undefined;
      return takeDirty();
    },
  };
  return attempt;
}
