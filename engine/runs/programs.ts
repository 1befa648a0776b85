// What an attempt does, by kind of work: the plan's steps in order, or the agent loop towards a goal;
// a vibe run does either on a scratch copy of its workspace and keeps the diff. Each program says how
// the work ended; the executor turns that into the run's transition.
import { AppError, type ErrorInfo, type Run, type VibeGates } from '../platform/index.js';
import { envArg, textOf, TOOLS, ToolError } from '../tools/index.js';
import { AgentError, runAgent, type ModelClient } from './agent.js';
import type { Attempt, StopReason } from './attempt.js';
import type { Scratch } from './workspace.js';

export type WorkOutcome = { summary: string; error?: ErrorInfo; result?: Run['result'] };

/**
 * A reference names the run's inputs or an earlier step's output (`${inputs.a.b}`, `${steps.x.output|inputs.y}`);
 * any other `${...}` is left as it is written (a shell's `${HOME}`, `${1:-x}`). One alone: its value is taken as
 * it is, not as text.
 */
const ROOT = String.raw`(?:inputs|steps)(?:\.\w+)*`;
const REFERENCE_BODY = String.raw`(${ROOT}(?:\|${ROOT})*)`;
const WHOLE_REFERENCE = new RegExp(String.raw`^\$\{${REFERENCE_BODY}\}$`);
const REFERENCE = new RegExp(String.raw`\$\{${REFERENCE_BODY}\}`, 'g');

/**
 * `a.b.c`, or alternatives `a.b|c.d`: the first that is set (not absent, null or empty). Only a value's
 * own fields are read: `constructor` or `__proto__` name nothing that the value does not hold itself.
 */
function lookup(scope: Record<string, unknown>, ref: string): unknown {
  for (const alternative of ref.split('|')) {
    let v: unknown = scope;
    for (const key of alternative.split('.')) v = v && typeof v === 'object' && Object.hasOwn(v, key) ? (v as Record<string, unknown>)[key] : undefined;
    if (v !== undefined && v !== null && v !== '') return v;
  }
  return undefined;
}

/**
 * How large a step's arguments may grow with what their references bring in (as JSON, in bytes): a
 * step's arguments go whole into its step.started event, its record and every answer about it, and a
 * reference repeated many times would otherwise multiply a run's inputs into all three.
 */
export const STEP_ARGS_MAX_BYTES = 1024 * 1024;

/**
 * How large the arguments of an attempt's plan steps may grow in all, references brought in (as JSON, in
 * bytes): each step's are kept whole in its record, which every answer about the run carries, and a plan
 * of 1 MB steps would otherwise make a run of tens of MB.
 */
export const ATTEMPT_ARGS_MAX_BYTES = 8 * 1024 * 1024;

/** What is left of the room arguments may take, and what refuses them past it. */
type ArgsRoom = { left: number; refusal: () => ToolError };

const stepRefusal = () => new ToolError('args-too-large', `what the references bring in makes more than ${STEP_ARGS_MAX_BYTES} bytes (1 MB) of JSON`);
const attemptRefusal = () =>
  new ToolError(
    'attempt-args-too-large',
    `with what the references bring in, the arguments of this attempt's steps make more than ${ATTEMPT_ARGS_MAX_BYTES} bytes (8 MB) of JSON in all`,
  );

/** Takes `bytes` from what is left of the arguments' room; throws its refusal once it is used up. */
function spend(room: ArgsRoom, bytes: number): void {
  room.left -= bytes;
  if (room.left < 0) throw room.refusal();
}

/**
 * A plan step's string arguments may name the run's inputs and earlier steps' outputs:
 * `${inputs.event.subject}` becomes that value (an empty string when it is absent; `${a|b}` takes the
 * first of a and b that is set); an argument that is
 * one reference alone takes the value itself (a number stays a number). What a trigger brings (a
 * webhook's event) and what earlier steps made reach a step this way. What would be more than
 * STEP_ARGS_MAX_BYTES of JSON is refused before it is made: a ToolError `args-too-large`.
 */
export function interpolate(value: unknown, scope: Record<string, unknown>): unknown {
  return expand(value, scope, { left: STEP_ARGS_MAX_BYTES, refusal: stepRefusal });
}

/**
 * A step's arguments as `interpolate` makes them, within the step's room and what is left of its attempt's
 * (`attemptLeft` bytes), and the bytes they take. Past the attempt's room: a ToolError `attempt-args-too-large`.
 */
export function expandArgs(value: unknown, scope: Record<string, unknown>, attemptLeft: number): { args: unknown; bytes: number } {
  const room: ArgsRoom =
    attemptLeft < STEP_ARGS_MAX_BYTES ? { left: attemptLeft, refusal: attemptRefusal } : { left: STEP_ARGS_MAX_BYTES, refusal: stepRefusal };
  const start = room.left;
  const args = expand(value, scope, room);
  return { args, bytes: start - room.left };
}

/**
 * What `interpolate` does, counting the size of the JSON of what it makes (escapes aside) as it goes,
 * so that arguments past the room are refused before they are made.
 */
function expand(value: unknown, scope: Record<string, unknown>, room: ArgsRoom): unknown {
  if (typeof value === 'string') {
    const whole = WHOLE_REFERENCE.exec(value);
    if (whole) {
      const v = lookup(scope, whole[1]!) ?? '';
      spend(room, typeof v === 'string' ? Buffer.byteLength(v) + 2 : Buffer.byteLength(JSON.stringify(v)));
      return v;
    }
    spend(room, Buffer.byteLength(value) + 2);
    return value.replace(REFERENCE, (reference: string, ref: string) => {
      const v = lookup(scope, ref);
      const text = textOf(v);
      // a reference is ASCII: its length is its size
      spend(room, Buffer.byteLength(text) - reference.length);
      return text;
    });
  }
  if (Array.isArray(value)) {
    spend(room, Math.max(2, 1 + value.length));
    return value.map((v) => expand(v, scope, room));
  }
  if (value && typeof value === 'object') {
    const entries = Object.entries(value);
    spend(room, Math.max(2, 1 + entries.length));
    return Object.fromEntries(
      entries.map(([k, v]) => {
        spend(room, Buffer.byteLength(k) + 3);
        return [k, expand(v, scope, room)];
      }),
    );
  }
  spend(room, String(value).length);
  return value;
}

/**
 * A shell step's command takes what its references name through its environment, never as text of the
 * command line: `echo "${inputs.event.pull_request.title}"` runs as `echo "${SVC_REF_0}"` with SVC_REF_0 the
 * title (in the step's `env`), so a title holding `"; id; echo "` is printed, not run. The reference is put
 * where it stood, whatever the quoting around it (in single quotes the shell leaves it as written): a guess at
 * the shell's quoting (an apostrophe in a comment or a heredoc) could take a reference the author quoted out of
 * its quotes. A command that is one reference alone is the value itself, a command the run's author chose to
 * take from its inputs. An `env` that is no object of names (null, a list, text, a reference) is refused: the
 * references could not go through it, and a command with them as text is never run.
 */
export function liftShellReferences(args: Record<string, unknown>): Record<string, unknown> {
  const command = args.command;
  // (a YAML block's command ends with a newline: one reference and that newline is still one alone)
  if (typeof command !== 'string' || WHOLE_REFERENCE.test(command.trim())) return args;
  const env: Record<string, unknown> = { ...envArg(args) };
  let n = 0;
  const lifted = command.replace(REFERENCE, (reference) => {
    // a name the step's own env does not use
    while (Object.hasOwn(env, `SVC_REF_${n}`)) n++;
    const name = `SVC_REF_${n++}`;
    env[name] = reference;
    return `\${${name}}`;
  });
  return lifted === command ? args : { ...args, command: lifted, env };
}

/** A step's `if`: `a == b` or `a != b` (compared as text, trimmed), or a value that is set and not false, 0 or null. */
export function holds(condition: string, scope: Record<string, unknown>): boolean {
  // a `${...}` that names neither inputs nor steps (a typo: `${input.x}`) is empty, not text that is set
  condition = condition.replace(/\$\{[^}]*\}/g, (written) => (WHOLE_REFERENCE.test(written) ? written : ''));
  const compared = /^([\s\S]*?)\s(==|!=)\s([\s\S]*)$/.exec(condition);
  if (compared) {
    const [left, right] = [interpolate(compared[1]!, scope), interpolate(compared[3]!, scope)].map((x) => String(x ?? '').trim());
    return compared[2] === '==' ? left === right : left !== right;
  }
  const v = interpolate(condition, scope);
  return !(v === undefined || v === null || v === '' || v === false || v === 0 || v === 'false' || v === '0' || v === 'null');
}

/** What a step's `if` or arguments make of their references, or why that was refused (`args-too-large`, `attempt-args-too-large`). */
function expanded<T>(what: 'if' | 'args', make: () => T): T | ToolError {
  try {
    return make();
  } catch (err) {
    if (err instanceof ToolError) return new ToolError(err.code, `${what}: ${err.message}`);
    throw err;
  }
}

const stepsLeft = (a: Attempt) => (a.run.budget.max_steps === undefined ? undefined : a.run.budget.max_steps - a.usage.steps);

/** The agent loop towards a goal, as a program or as a plan's `agent` step. */
export type AgentLoop = (a: Attempt, goal: string) => Promise<WorkOutcome>;

/**
 * The plan's steps in order; the first failure skips the rest. A step whose `if` does not hold is
 * skipped. An `agent` step runs the agent loop (its tool calls are steps of their own).
 */
/** The room an attempt's arguments have left (ATTEMPT_ARGS_MAX_BYTES in all): its plan steps' and its agents' calls share it. */
const argsRooms = new WeakMap<Attempt, { left: number }>();
const argsRoomOf = (a: Attempt): { left: number } => {
  let room = argsRooms.get(a);
  if (!room) argsRooms.set(a, (room = { left: ATTEMPT_ARGS_MAX_BYTES }));
  return room;
};

export function stepsProgram(agent?: AgentLoop) {
  return async (a: Attempt): Promise<WorkOutcome> => {
    const plan = a.run.plan ?? [];
    // the steps' own fields alone: a step named `__proto__` is one like any other
    const outputs: Record<string, { output: unknown; status: string }> = Object.create(null);
    // the room the attempt's expanded arguments have left (the steps' records keep them whole)
    const room = argsRoomOf(a);
    for (const [i, s] of plan.entries()) {
      if (a.signal.aborted) break;
      const scope = { inputs: a.run.inputs, steps: outputs };
      const keep = (output: unknown, status: string) => {
        outputs[String(i)] = { output, status };
        // a name of digits alone would hide the step at that place: `steps.0` is always the first step
        if (s.name && !/^\d+$/.test(s.name)) outputs[s.name] = outputs[String(i)]!;
      };
      const runs = s.if === undefined || expanded('if', () => holds(s.if!, scope));
      if (runs === false) {
        keep(null, 'skipped');
        a.skipStep(a.newStep({ tool: s.tool, args: s.args ?? {}, name: s.name ?? null, source: 'plan' }));
        continue;
      }
      // an `agent` step is no tool call: its loop bounds its own calls (an agent of max_steps 0 may still answer)
      const left = s.tool === 'agent' ? undefined : stepsLeft(a);
      if (left !== undefined && left <= 0) {
        return { summary: '', error: { code: 'max-steps-reached', message: `max_steps (${a.run.budget.max_steps}) reached before step ${i}` } };
      }
      const written = s.tool === 'shell' ? expanded('args', () => liftShellReferences(s.args ?? {})) : (s.args ?? {});
      const made = runs instanceof ToolError ? runs : written instanceof ToolError ? written : expanded('args', () => expandArgs(written, scope, room.left));
      const args = made instanceof ToolError ? made : (made.args as Record<string, unknown>);
      if (!(made instanceof ToolError)) room.left -= made.bytes;
      if (args instanceof ToolError) {
        // refused before anything of it runs; its record keeps its arguments as the plan wrote them
        const step = a.newStep({ tool: s.tool, args: s.args ?? {}, name: s.name ?? null, source: 'plan' });
        keep((await a.runStep(step, { code: args.code, message: args.message })).output, step.status);
        return { summary: '', error: { code: args.code, message: `step ${step.index} (${step.tool}): ${args.message}` } };
      }
      if (s.tool === 'agent') {
        // held to the run's allowlist and the operator's as every step is (an agent step ran with neither naming it)
        const refused = a.refusalOf('agent');
        if (refused) {
          const step = a.newStep({ tool: 'agent', args, name: s.name ?? null, source: 'plan' });
          keep((await a.runStep(step, refused)).output, step.status);
          return { summary: '', error: { code: refused.code, message: `step ${step.index} (agent): ${refused.message}` } };
        }
        if (!agent) return { summary: '', error: { code: 'agent-not-configured', message: `step ${i} (agent): no agent endpoint is configured` } };
        const outcome = await agent(a, typeof args.goal === 'string' ? args.goal : '');
        if (outcome.error) return { summary: '', error: { code: outcome.error.code, message: `step ${i} (agent): ${outcome.error.message}` } };
        keep({ summary: outcome.summary, answer: outcome.result?.final_answer ?? '' }, 'succeeded');
        continue;
      }
      const step = a.newStep({ tool: s.tool, args, name: s.name ?? null, source: 'plan' });
      const result = await a.runStep(step);
      keep(result.output, step.status);
      if (result.error && !a.signal.aborted) {
        return { summary: '', error: { code: result.error.code, message: `step ${step.index} (${step.tool}): ${result.error.message}` } };
      }
    }
    const ran = Object.entries(outputs).filter(([k, o]) => /^\d+$/.test(k) && o.status !== 'skipped').length;
    return { summary: `${ran} step${ran === 1 ? '' : 's'} succeeded` };
  };
}

/**
 * The agent loop: the model plans tool calls towards the goal, offered only the allowed tools. A
 * session task's agent also reads its inbox between turns and may ask for input: the run then ends
 * with the question (posted to the session's log) and its conversation, which the task's next run,
 * started by the answer, continues.
 */
export function agentProgram(client: ModelClient, runOf: (runId: string) => Promise<Run | null>) {
  // only a goal task's run may ask: a plan's `agent` step cannot pause its plan, so its question went to the
  // log, the task succeeded, and the answer did nothing
  const run = async (a: Attempt, goal: string, canAsk: boolean): Promise<WorkOutcome> => {
    const allowed = a.run.tool_allowlist.map((t) => TOOLS.get(t)).filter((t) => t !== undefined);
    const own = a.sessions?.own;
    const trigger = a.run.trigger.type === 'task' ? a.run.trigger : null;
    let seen = trigger?.inbox_after ?? 0;
    try {
      const continued = trigger?.continues ? (await runOf(trigger.continues))?.result?.conversation : undefined;
      const outcome = await runAgent({
        client,
        model: a.run.agent?.model ?? null,
        goal,
        inputs: a.run.inputs,
        tools: allowed,
        conversation: continued,
        canAsk: canAsk && Boolean(own),
        inbox: async () => {
          if (!own) return [];
          const { texts, lastSeq } = await own.inbox(seen);
          seen = lastSeq;
          return texts;
        },
        signal: a.signal,
        deadlineAt: a.deadlineAt,
        stepsLeft: () => stepsLeft(a),
        callTool: (tool, args, refused) => a.runStep(a.newStep({ tool, args, name: null, source: 'agent' }), refused),
        argsMaxBytes: { call: STEP_ARGS_MAX_BYTES, attempt: ATTEMPT_ARGS_MAX_BYTES },
        argsRoom: argsRoomOf(a),
        onTurn: (turn) => a.addTurn(turn),
      });
      if (outcome.stopped_by === 'max_steps') {
        return { summary: '', error: { code: 'max-steps-reached', message: `max_steps (${a.run.budget.max_steps}) reached before the agent finished` } };
      }
      if (outcome.stopped_by === 'input_required') {
        const asked = await own!.say({ text: outcome.question, kind: 'input_request' });
        return {
          summary: `waiting for input: ${outcome.question.split('\n')[0]!.slice(0, 280)}`,
          result: {
            input_required: { question: outcome.question, message_id: asked.id, seq: asked.seq, inbox_seq: seen },
            conversation: outcome.conversation,
          },
        };
      }
      return {
        summary: (outcome.answer ?? 'the agent finished').split('\n')[0]!.slice(0, 300),
        result: { final_answer: outcome.answer ?? '' },
      };
    } catch (err) {
      if (a.signal.aborted) return { summary: '' };
      if (err instanceof AgentError) return { summary: '', error: { code: err.code, message: err.message } };
      throw err;
    }
  };
  const loop: AgentLoop = (a, goal) => run(a, goal, false);
  return { loop, program: (a: Attempt) => run(a, a.run.goal ?? '', true) };
}

/** How long a vibe run's diff may take once its run is stopped (its budget ran out, a cancel, a shutdown). */
export const DIFF_GRACE_MS = 5000;

/** The grace of a vibe run's diff, by why its run stopped: none at a shutdown (see vibeProgram). */
export const diffGraceMs = (reason: unknown): number => ((reason as StopReason | undefined)?.status === 'interrupted' ? 0 : DIFF_GRACE_MS);

/** A signal that aborts `ms` after `signal` does (at once if it has); `ms` may depend on why it did. */
export function withGrace(signal: AbortSignal, ms: number | ((reason: unknown) => number)): AbortSignal {
  const c = new AbortController();
  const later = () => setTimeout(() => c.abort(signal.reason), typeof ms === 'number' ? ms : ms(signal.reason)).unref();
  if (signal.aborted) later();
  else signal.addEventListener('abort', later, { once: true });
  return c.signal;
}

/** Runs a workspace's gates on a folder (a vibe run's scratch copy): given by the engine (gates). */
export type CopyGates = (run: Run, dir: string, readOnlyBinds: string[], signal: AbortSignal) => Promise<VibeGates>;

/**
 * A vibe run: the work runs on a scratch copy (a clone of its repository at HEAD, or a copy of a folder
 * that is not in one); the result carries the unified diff and the changed files; the original stays as
 * it was. With `gates: true` the workspace's gates run on the copy after the edits, their results ride
 * with the diff, and a required gate that does not pass fails the run.
 */
export function vibeProgram(
  work: (a: Attempt) => Promise<WorkOutcome>,
  scratchOf: (workspace: string, signal: AbortSignal) => Promise<Scratch>,
  onReady: (kind: 'worktree' | 'copy') => Promise<unknown>,
  gates?: CopyGates,
) {
  return async (a: Attempt): Promise<WorkOutcome> => {
    const scratch = await scratchOf(a.workspace, a.signal);
    try {
      await onReady(scratch.kind);
      a.workspace = scratch.dir;
      a.readOnlyBinds.push(...scratch.readOnlyBinds);
      const outcome = await work(a);
      // what the run changed is its result even when its budget ran out or it was canceled: the diff has a
      // few seconds past it. Not at a shutdown: the attempt is put back in line and its result thrown
      // away, and the process has less time left than the grace. Taken before the gates, which put the
      // workspace's gate definitions back in the copy and may write files of their own
      const { diff, changed_files, files_truncated, truncated } = await scratch.diff(withGrace(a.signal, diffGraceMs));
      // gates that cannot run (their set is invalid, say) fail the run with why, and cost it not its diff
      let gatesError: ErrorInfo | undefined;
      const checked =
        a.run.gates && gates && !outcome.error && !a.signal.aborted
          ? await gates(a.run, scratch.dir, a.readOnlyBinds, a.signal).catch((err: unknown) => {
              gatesError =
                err instanceof AppError
                  ? { code: err.code, message: err.message }
                  : { code: 'gates-failed', message: 'the gates could not run on the edited copy' };
              return undefined;
            })
          : undefined;
      const failed = checked?.results.filter((g) => g.required && g.conclusion !== 'success').map((g) => g.gate_id) ?? [];
      return {
        ...outcome,
        ...(failed.length ? { error: { code: 'gates-failed', message: `required gates did not pass on the edited copy: ${failed.join(', ')}` } } : {}),
        ...(gatesError ? { error: gatesError } : {}),
        result: {
          ...outcome.result,
          diff,
          changed_files,
          ...(files_truncated ? { changed_files_truncated: true } : {}),
          ...(truncated ? { diff_truncated: true } : {}),
          ...(checked ? { gates: checked } : {}),
        },
      };
    } finally {
      await scratch.remove();
    }
  };
}
