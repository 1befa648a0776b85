// The catalogue of events: every event the service writes, by type, with its payload. Writers and
// readers share this union, so a misspelt type or a missing field does not compile, and a reader's
// `switch (e.type)` is checked for every case. api/openapi.yaml documents the same catalogue
// (ServiceEvent); a unit test keeps the two lists equal.
import type {
  AgentTurn,
  AuditPhase,
  AuditReportHead,
  PhaseStatus,
  SeverityCounts,
  Budget,
  ConnectionProvider,
  ErrorInfo,
  GateConclusion,
  GateRunStatus,
  RunKind,
  RunStatus,
  RunTrigger,
  SessionOutcome,
  SessionStatus,
  StepStatus,
  TaskStatus,
} from './records.js';

export type EventBody =
  // a run's life: queued once, started once per attempt, then retried, interrupted, or finished once
  | { type: 'run.queued'; data: { kind: RunKind; trigger: RunTrigger; attempt: number; rerun_of: string | null } }
  | { type: 'run.started'; data: { kind: RunKind; attempt: number; budget: Budget; queued_ms: number; sandbox: string | null } }
  | { type: 'run.retrying'; data: { attempt: number; next_attempt: number; status: RunStatus; error: ErrorInfo | null; delay_ms: number } }
  | { type: 'run.interrupted'; data: { attempt: number; next_attempt: number; reason: string } }
  | {
      type: 'run.finished';
      data: {
        status: RunStatus;
        attempt: number;
        summary: string | null;
        error: ErrorInfo | null;
        duration_ms: number | null;
        result: { changed_files?: string[]; changed_files_truncated?: boolean } | null;
      };
    }
  | { type: 'workspace.ready'; data: { kind: 'worktree' | 'copy' } }
  // a step: one tool call of a run
  | { type: 'step.started'; data: { index: number; tool: string; name: string | null; args: Record<string, unknown>; source: 'plan' | 'agent' } }
  | { type: 'step.output'; data: { index: number; stream: 'stdout' | 'stderr'; text: string } }
  | {
      type: 'step.finished';
      data: { index: number; tool: string; status: StepStatus; duration_ms: number | null; error: ErrorInfo | null; exit_code?: number | null };
    }
  // an action tool's call to a provider through a connection: what was asked, then what the provider answered (ids, URLs; never the credential)
  | { type: 'provider.request'; data: { step: number; provider: ConnectionProvider; action: string; args: Record<string, unknown> } }
  | {
      type: 'provider.answer';
      data: {
        step: number;
        provider: ConnectionProvider;
        action: string;
        connection_id: string | null;
        ok: boolean;
        answer: Record<string, unknown> | null;
        error: ErrorInfo | null;
        duration_ms: number;
      };
    }
  // the agent: one model turn
  | { type: 'agent.turn'; data: AgentTurn }
  // messages: what a run's `message` tool posts (and, in multi-agent sessions, the durable message log)
  | {
      type: 'message.created';
      data: {
        role: 'assistant' | 'system' | 'user' | 'agent' | 'tool';
        text: string;
        /** the text is the message's first characters only: the whole of it is the message's (GET .../messages) */
        text_truncated?: boolean;
        step?: number;
        message_id?: string;
        seq?: number;
        from?: string | null;
        to?: string | null;
        /** `text`, or `input_request`: an agent asks for input and its task waits for the answer */
        kind?: string;
      };
    }
  // a task of a multi-agent session changed status
  | { type: 'task.updated'; data: { task_id: string; status: TaskStatus; attempt: number; run_id: string | null } }
  // a session: its status, outcome or title changed
  | { type: 'session.updated'; data: { status: SessionStatus; outcome: SessionOutcome | null; title: string | null } }
  // gates: one gate of a gate run ended; the gate run was sealed into the ledger
  | {
      type: 'gate.finished';
      data: { gate_run_id: string; gate_id: string; conclusion: GateConclusion; required: boolean; summary: string; duration_ms: number };
    }
  | { type: 'gate.run_finished'; data: { gate_run_id: string; status: GateRunStatus; failed_required: string[]; ledger_head: string | null; error?: string } }
  // a workspace audit: one phase ended; the report is assembled (streamed as `phase_done` and `report`)
  | {
      type: 'audit.phase_done';
      data: { report_id: string; phase: AuditPhase; status: PhaseStatus; counts: SeverityCounts; score: number | null; duration_ms: number };
    }
  | { type: 'audit.finished'; data: AuditReportHead }
  // outbound notifications: one of the tenant's endpoints was disabled after repeated failure
  | { type: 'notification.endpoint_disabled'; data: { endpoint_id: string; url: string; reason: string; consecutive_failures: number } };

export type EventType = EventBody['type'];

/** Every event type, in catalogue order: what api/openapi.yaml must document. */
export const EVENT_TYPES = [
  'run.queued',
  'run.started',
  'run.retrying',
  'run.interrupted',
  'run.finished',
  'workspace.ready',
  'step.started',
  'step.output',
  'step.finished',
  'provider.request',
  'provider.answer',
  'agent.turn',
  'message.created',
  'task.updated',
  'session.updated',
  'gate.finished',
  'gate.run_finished',
  'audit.phase_done',
  'audit.finished',
  'notification.endpoint_disabled',
] as const satisfies readonly EventType[];

// a compile-time check that the list above names every type of the union
type Missing = Exclude<EventType, (typeof EVENT_TYPES)[number]>;
const everyTypeListed: Missing extends never ? true : Missing = true;
void everyTypeListed;

export type EventEnvelope = {
  /** the stream entry id: SSE `id:`, and the Last-Event-ID to resume from */
  id: string;
  at: string;
  tenant_id: string;
  session_id?: string;
  run_id?: string;
};

/** An event as it is stored and streamed. */
export type ServiceEvent = EventEnvelope & EventBody;

/** An event before the log gives it an id and a time. */
export type NewEvent = Omit<EventEnvelope, 'id' | 'at'> & EventBody;

export type EventOf<T extends EventType> = Extract<ServiceEvent, { type: T }>;

/**
 * A stream a client can watch: which log it reads, and which event ends it. A run session ends with
 * its run; a session trace (multi-agent sessions) does not end when one task's run does.
 */
export type Scope = {
  stream: string;
  isLast(e: ServiceEvent): boolean;
  /** the SSE `event:` name (default: the type) */
  eventName?(e: ServiceEvent): string;
  /** the SSE `id:` (default: the stream entry id); a stream a client cannot name again by its URL puts itself in the id */
  eventId?(e: ServiceEvent): string;
};

export const scopes = {
  runSession: (sessionId: string): Scope => ({ stream: `session:${sessionId}`, isLast: (e) => e.type === 'run.finished' }),
  /**
   * the same log; it ends only when the session is archived and what the archive stopped has ended: the
   * session.updated that gives the archived session its outcome (cancellations and run ends come before it)
   */
  sessionTrace: (sessionId: string): Scope => ({
    stream: `session:${sessionId}`,
    isLast: (e) => e.type === 'session.updated' && e.data.status === 'archived' && e.data.outcome !== null,
  }),
  /**
   * An audit's log: `phase_done` per phase, then `report`. The stream route starts an audit, so a
   * resuming client (same URL, Last-Event-ID) is known by its id: `{report_id}/{entry id}`.
   */
  audit: (reportId: string): Scope => ({
    stream: `audit:${reportId}`,
    isLast: (e) => e.type === 'audit.finished',
    eventName: (e) => (e.type === 'audit.phase_done' ? 'phase_done' : e.type === 'audit.finished' ? 'report' : e.type),
    eventId: (e) => `${reportId}/${e.id}`,
  }),
};
