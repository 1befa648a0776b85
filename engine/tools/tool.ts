// What a tool is: a named function the run engine calls for a step, with a JSON schema the agent
// sees. Tools get the run's workspace, an AbortSignal (budget and cancel) and a way to stream output.
import type { AuditLayer, AuditPhase, AuditReport, ConnectionProvider, ErrorInfo, GateRunRecord } from '../platform/index.js';
import type { Sandbox } from './sandbox.js';
import { ToolError } from './tool-error.js';

export type ToolContext = {
  workspace: string;
  signal: AbortSignal;
  /** streams a chunk of output as an event while the step runs */
  output(stream: 'stdout' | 'stderr', text: string): void;
  /** posts a message to the run's session log (a message.created event) */
  message(role: 'assistant' | 'system' | 'user', text: string): Promise<void>;
  childEnv: Record<string, string>;
  httpAllowPrivate: boolean;
  /** where the processes a tool starts run */
  sandbox: Sandbox;
  /** the run may use the network inside the sandbox (asked for, and allowed by the operator) */
  network: boolean;
  /** the operator lets tool processes use the network at all (SERVICE_SANDBOX_ALLOW_NETWORK): a checkout's fetch needs it */
  networkAllowed: boolean;
  /** a fresh folder of the run's own for a checkout, and the switch of the run's later steps to it */
  checkouts?: { fresh(): Promise<string>; use(dir: string): void };
  /** folders besides the workspace a sandboxed process reads (the objects a vibe run's scratch clone shares) */
  readOnlyBinds: string[];
  /** the run's tenant's sessions (the `session` tool); absent where sessions are not reachable */
  sessions?: SessionActions;
  /** the gates of the run's workspace (the `gates` tool); absent where gates cannot run */
  gates?: GateActions;
  /** the audit of the run's workspace (the `audit` tool); absent where it cannot run */
  audit?: AuditActions;
  /** the providers the run's tenant connected (the action tools); absent where connections are not reachable */
  connections?: StepConnections;
};

/**
 * What the action tools may do: one action on a provider, through the connection the run names for it
 * (or the tenant's only one). The answer is what the provider gave back; the call and the answer are
 * events of the run. A missing connection, refused arguments or a refusing provider throw a ToolError
 * with their code.
 */
export type StepConnections = {
  act(provider: ConnectionProvider, action: string, args: Record<string, unknown>): Promise<Record<string, unknown>>;
  /** what git needs to fetch from the code host: its web address and the token (only ever passed in a process's environment) */
  git(named?: string): Promise<GitAccess>;
};

export type GitAccess = { connection_id: string; web_url: string; token: string };

/** A run's access to its tenant's connections, as the engine gives it. */
export type ConnectionActions = {
  /** null when every provider named has a connection to act through; else why not (`connection-missing`) */
  check(providers: ConnectionProvider[]): Promise<ErrorInfo | null>;
  act(
    provider: ConnectionProvider,
    action: string,
    args: Record<string, unknown>,
    signal: AbortSignal,
  ): Promise<{ connection_id: string; answer: Record<string, unknown> }>;
  git(named?: string): Promise<GitAccess>;
};

/** What the `audit` tool may do: audit the run's own workspace, and wait for the report. */
export type AuditActions = {
  run(req: { phases?: AuditPhase[]; layers?: AuditLayer[] }, signal: AbortSignal): Promise<AuditReport>;
};

/** What the `gates` tool may do: run the gate set of the run's own workspace, and wait for its seal. */
export type GateActions = {
  /** `dir`: the folder the run's steps work in now (a checkout), when it is not the run's workspace */
  run(req: { only?: string[]; dir?: string }, signal: AbortSignal): Promise<GateRunRecord>;
};

/** What a run may do to the sessions of its tenant. */
export type SessionActions = {
  /** `cut`: a title and a goal longer than a task may hold are cut to fit, as an intake of text it does not write wants (an email's subject) */
  addTask(sessionId: string, task: Record<string, unknown>, opts?: { cut?: boolean }): Promise<{ id: string }>;
  postMessage(sessionId: string, message: { text: string; to?: string }): Promise<{ id: string; seq: number }>;
  /** a session task's run, in its own session, as its agent; absent for other runs */
  own?: OwnSession;
};

/** A session task's run in its own session: it speaks as its agent and reads the agent's inbox. */
export type OwnSession = {
  /** posts to the session's log as the run's agent; `to` is an agent's id or name, or absent for all */
  say(message: { text: string; to?: string; kind?: string }): Promise<{ id: string; seq: number }>;
  /** what was posted to the run's agent (or to all) after `afterSeq`, by others, as lines for the conversation */
  inbox(afterSeq: number): Promise<{ texts: string[]; lastSeq: number }>;
};

export type ToolResult = { output: Record<string, unknown>; error?: ErrorInfo };

export type Tool = {
  name: string;
  description: string;
  /** JSON schema of args, offered to the agent */
  parameters: Record<string, unknown>;
  execute(args: Record<string, unknown>, ctx: ToolContext): Promise<ToolResult>;
};

export { ToolError };

/** A value as text where text is wanted (a reference in a command, an environment variable): a string as it is, none as empty, anything else its JSON. */
export const textOf = (v: unknown): string => (typeof v === 'string' ? v : v === null || v === undefined ? '' : JSON.stringify(v));

export function stringArg(args: Record<string, unknown>, name: string, required = true): string {
  const v = args[name];
  if (typeof v === 'string' && (v !== '' || !required)) return v;
  if (v === undefined && !required) return '';
  throw new ToolError('invalid-args', `args.${name} must be a${required ? ' non-empty' : ''} string`);
}

/** A step's `env`: an object of variable names to values, or none (`{}`); anything else is refused. */
export function envArg(args: Record<string, unknown>): Record<string, unknown> {
  const v = args.env;
  if (v === undefined) return {};
  if (!v || typeof v !== 'object' || Array.isArray(v)) throw new ToolError('invalid-args', 'env must be an object of variable names to values');
  return v as Record<string, unknown>;
}

/** Keeps the last `max` bytes of a stream of text, remembering whether anything was dropped. */
export class TailBuffer {
  private chunks: Buffer[] = [];
  private size = 0;
  truncated = false;
  constructor(private readonly max: number) {}
  push(chunk: Buffer): void {
    this.chunks.push(chunk);
    this.size += chunk.length;
    while (this.size > this.max && this.chunks.length) {
      const first = this.chunks[0]!;
      const over = this.size - this.max;
      if (first.length <= over) {
        this.chunks.shift();
        this.size -= first.length;
      } else {
        this.chunks[0] = first.subarray(over);
        this.size -= over;
      }
      this.truncated = true;
    }
  }
  /** The bytes kept, as text; once the start was dropped, from the first whole character on. */
  text(): string {
    const kept = Buffer.concat(this.chunks);
    let start = 0;
    // a UTF-8 character is at most 4 bytes: at most 3 of its continuation bytes (10xxxxxx) lead
    if (this.truncated) while (start < 3 && start < kept.length && (kept[start]! & 0xc0) === 0x80) start++;
    return kept.toString('utf8', start);
  }
}
