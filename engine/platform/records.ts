// Records as the store keeps them and the API shows them (snake_case, ISO 8601 UTC times).

export const TOOL_NAMES = [
  'shell',
  'read_file',
  'write_file',
  'list_files',
  'http',
  'message',
  'session',
  'gates',
  'audit',
  'agent',
  // the action tools: each acts on its provider through the tenant's connection
  'codehost',
  'chat',
  'tracker',
  'pager',
  'email',
] as const;
export type ToolName = (typeof TOOL_NAMES)[number];

/** What an agent may use when an automation names a goal but no tool_allowlist: it reads, it does not change. */
export const DEFAULT_AGENT_TOOLS: readonly ToolName[] = ['read_file', 'list_files', 'message'];

export const WEBHOOK_PROVIDERS = ['codehost', 'chat', 'tracker', 'pager', 'email', 'generic'] as const;
export type WebhookProvider = (typeof WEBHOOK_PROVIDERS)[number];

export const AUTOMATION_STATUSES = ['enabled', 'disabled', 'archived'] as const;
export type AutomationStatus = (typeof AUTOMATION_STATUSES)[number];

export type Trigger =
  | { type: 'manual' }
  | { type: 'cron'; schedule: string; timezone: string }
  | { type: 'webhook'; provider: WebhookProvider; events?: string[] }
  | { type: 'file_change'; paths: string[]; debounce_ms?: number };

/**
 * One step of a plan: a tool call (`agent`: the agent loop towards `args.goal`, its calls steps of their
 * own). `if` names a value (`${steps.<name or index>.output.done}`), the step running only when it is set
 * and not false, 0 or null; or compares two (`${inputs.event.ref} == refs/heads/main`, or `!=`).
 */
export type Step = { tool: ToolName; args: Record<string, unknown>; name?: string; if?: string };

export type Budget = { seconds: number; max_steps?: number };

/** What a fire does while a run of its automation is queued or running (OverlapPolicy in the API). */
export const OVERLAP_POLICIES = ['allow', 'skip', 'queue', 'replace'] as const;
export type OverlapPolicy = (typeof OVERLAP_POLICIES)[number];

/** What a caller supplies to create an automation; everything else is the service's. */
export type AutomationDefinition = {
  name: string;
  description?: string | null;
  status?: 'enabled' | 'disabled';
  triggers?: Trigger[];
  tool_allowlist?: ToolName[];
  budget?: Partial<Budget>;
  steps?: Step[];
  goal?: string;
  inputs?: Record<string, unknown>;
  retry?: RetryPolicyInput | null;
  overlap?: OverlapPolicy;
  network?: boolean;
  connections?: ConnectionNames;
};

export type AutomationPatch = Partial<Pick<Automation, 'name' | 'description' | 'triggers' | 'tool_allowlist' | 'network' | 'overlap'>> & {
  /** merged into the automation's budget (RFC 7396): `max_steps: null` removes the bound */
  budget?: { seconds?: number; max_steps?: number | null };
  /** merged into the automation's connections (RFC 7396): a provider null takes the tenant's only connection again */
  connections?: Partial<Record<ConnectionProvider, string | null>>;
  retry?: RetryPolicyInput | null;
};

export type Automation = {
  id: string;
  tenant_id: string;
  name: string;
  description: string | null;
  status: AutomationStatus;
  triggers: Trigger[];
  tool_allowlist: ToolName[];
  budget: Budget;
  retry: RetryPolicy | null;
  /** absent (made before it existed): allow */
  overlap?: OverlapPolicy;
  network: boolean;
  /** the connection each action tool acts through, by provider (an id or a name); absent: the tenant's only one */
  connections?: ConnectionNames;
  steps: Step[] | null;
  goal: string | null;
  inputs: Record<string, unknown>;
  template: { id: string; variables: Record<string, unknown> } | null;
  created_at: string;
  updated_at: string;
};

export type ApiKeyRecord = {
  id: string;
  tenant_id: string;
  /** sha256 hex of the key; the key itself is never stored */
  hash: string;
  label: string | null;
  source: 'bootstrap' | 'cli' | 'api';
  created_at: string;
  /** after this instant the key no longer opens anything; null: never */
  expires_at?: string | null;
  /** set once: a revoked key never opens anything again (a bootstrap key put back in SERVICE_API_KEYS excepted) */
  revoked_at?: string | null;
  revoked_reason?: 'revoked' | 'removed from SERVICE_API_KEYS' | null;
  /** when the key was last presented, to within API_KEY_TOUCH_SECONDS */
  last_used_at?: string | null;
  /** who made it through the API: `key:<id>` or `person:<sub>` (null from SERVICE_API_KEYS or the CLI) */
  created_by?: string | null;
};

/** What of an API key changes after it is made. */
export type ApiKeyPatch = Partial<Pick<ApiKeyRecord, 'revoked_at' | 'revoked_reason' | 'last_used_at'>>;

export const RUN_KINDS = ['autonomy', 'vibe', 'automation', 'session_task', 'audit'] as const;

/** The one tenant of SERVICE_AUTH=none (a local install): its runs and workspace are under this id. */
export const LOCAL_TENANT = 'local';
export type RunKind = (typeof RUN_KINDS)[number];

export const RUN_STATUSES = ['queued', 'running', 'succeeded', 'failed', 'canceled', 'timed_out'] as const;
export type RunStatus = (typeof RUN_STATUSES)[number];
export const TERMINAL_RUN_STATUSES: readonly RunStatus[] = ['succeeded', 'failed', 'canceled', 'timed_out'];
export const isTerminal = (status: RunStatus): boolean => TERMINAL_RUN_STATUSES.includes(status);

export type StepStatus = 'pending' | 'running' | 'succeeded' | 'failed' | 'canceled' | 'timed_out' | 'skipped';

export type ErrorInfo = { code: string; message: string };

export type StepRecord = {
  index: number;
  name: string | null;
  tool: string;
  args: Record<string, unknown>;
  status: StepStatus;
  /** who asked for it: the definition's steps, or the agent */
  source: 'plan' | 'agent';
  started_at: string | null;
  finished_at: string | null;
  duration_ms: number | null;
  output: Record<string, unknown> | null;
  error: ErrorInfo | null;
};

export type RunTrigger =
  | { type: 'api'; request_id?: string }
  | { type: 'manual'; request_id?: string }
  | { type: 'cron'; schedule: string; timezone: string; fire_at: string }
  | { type: 'webhook'; provider: string; delivery_id: string; event?: string }
  | { type: 'file_change'; paths: string[] }
  | { type: 'rerun'; run_id: string; request_id?: string }
  | {
      type: 'task';
      task_id: string;
      /** attempts of the task's earlier runs: a run started by an answer continues the count */
      prior_attempts?: number;
      /** the run whose conversation this one continues (it asked for input) */
      continues?: string;
      /** the agent's inbox starts after this message seq */
      inbox_after?: number;
    };

export type AgentTurn = {
  index: number;
  at: string;
  /** what the model answered: text, tool calls, or both */
  content: string | null;
  tool_calls: { id: string; tool: string; args: Record<string, unknown> }[];
  usage?: { prompt_tokens?: number; completion_tokens?: number };
};

/** Which outcomes of an attempt a retry policy retries. A run canceled through the API is never retried. */
export const RETRYABLE_STATUSES = ['failed', 'timed_out'] as const;

/** How a run is tried again after a failed attempt: `attempts` counts every try, the first included. */
export type RetryPolicy = {
  attempts: number;
  backoff: { type: 'fixed' | 'exponential'; delay_ms: number };
  on: (typeof RETRYABLE_STATUSES)[number][];
};

/** A retry policy as a caller gives it; what is left out takes its default. */
export type RetryPolicyInput = { attempts: number; backoff?: Partial<RetryPolicy['backoff']>; on?: RetryPolicy['on'] };

/** An attempt that ended without ending the run: retried after a failure, or interrupted by a deploy. */
export type AttemptRecord = {
  attempt: number;
  outcome: 'retried' | 'interrupted' | 'lost';
  status: RunStatus;
  error: ErrorInfo | null;
  started_at: string | null;
  finished_at: string;
  duration_ms: number | null;
  /** what the attempt used (absent on attempts recorded before 2026-11-25) */
  usage?: Run['usage'];
};

/**
 * A run as the store keeps it. Its steps and agent turns are rows of their own (per attempt), so a
 * long run's writes do not grow with its length; `plan` is the request's steps, what each attempt runs.
 */
export type Run = {
  id: string;
  tenant_id: string;
  kind: RunKind;
  status: RunStatus;
  session_id: string;
  automation_id: string | null;
  /** its automation's overlap policy when not allow: the run takes the automation's key at its start (overlap.ts) */
  overlap?: Exclude<OverlapPolicy, 'allow'>;
  trigger: RunTrigger;
  goal: string | null;
  plan: Step[] | null;
  tool_allowlist: string[];
  /** the resolved folder on the server: internal, never shown as such */
  workspace: string;
  /** its tool processes may use the network (asked for, and allowed by the operator) */
  network: boolean;
  /** the connection each action tool acts through, by provider (an id or a name); absent: the tenant's only one */
  connections?: ConnectionNames;
  /** the sandbox its last attempt ran in (`bwrap`, `none`), or null before it started */
  sandbox: string | null;
  budget: Budget;
  retry: RetryPolicy | null;
  /** the attempt under way or last made, from 1 */
  attempt: number;
  /** attempts before the current one */
  attempts: AttemptRecord[];
  /** the run this one re-runs (POST /runs/{id}/rerun) */
  rerun_of: string | null;
  /** tokens are the model's own count, summed over the attempt's turns (absent before any) */
  usage: { steps: number; model_turns: number; seconds: number; prompt_tokens?: number; completion_tokens?: number };
  inputs: Record<string, unknown>;
  summary: string | null;
  error: ErrorInfo | null;
  result: RunResult | null;
  /** the agent a session task's run was made for, as it was then (editing the agent never changes a run) */
  agent?: AgentSnapshot | null;
  /** a vibe run runs the workspace's gates on its scratch copy after the edits */
  gates?: boolean;
  request_id: string | null;
  created_at: string;
  started_at: string | null;
  finished_at: string | null;
  duration_ms: number | null;
  /** when a cancel was asked of the run while it ran: kept in the store, where Redis's cancel key may be lost */
  cancel_requested_at?: string | null;
};

export type RunResult = {
  diff?: string;
  diff_truncated?: boolean;
  changed_files?: string[];
  /** more paths changed than changed_files lists (CHANGED_FILES_MAX, CHANGED_FILES_MAX_BYTES) */
  changed_files_truncated?: boolean;
  final_answer?: string;
  /** the agent asked for input and the run ended: an answering message starts the task's next run */
  input_required?: {
    question: string;
    message_id: string;
    seq: number;
    /** the last message seq its agent read: what comes after is new to the run that continues */
    inbox_seq: number;
  };
  /** the agent's conversation so far, kept for the run that continues it */
  conversation?: ChatMessage[];
  /** a vibe run's gates, run on its scratch copy after the edits */
  gates?: VibeGates;
};

export type VibeGates = {
  ready: boolean;
  source: string;
  results: { gate_id: string; required: boolean; conclusion: GateConclusion; summary: string; annotations: Annotation[] }[];
};

/** A message of an OpenAI-compatible chat-completions conversation. */
export type ChatMessage =
  | { role: 'system' | 'user'; content: string }
  | { role: 'assistant'; content: string | null; tool_calls?: ChatToolCall[] }
  | { role: 'tool'; tool_call_id: string; content: string };

export type ChatToolCall = { id: string; type: 'function'; function: { name: string; arguments: string } };

export type AgentSnapshot = { id: string; name: string; role: string | null; model: string | null };

/** A run with the steps and agent turns of its current attempt: what GET /runs/{id} shows. */
export type RunDetail = Run & { steps: StepRecord[]; agent_turns: AgentTurn[] };

/** A tenant's signing secrets for one webhook kind: one, or two while rotating. Sealed at rest. */
export type WebhookSecretRecord = {
  tenant_id: string;
  kind: WebhookProvider;
  /** AES-256-GCM sealed values (engine/secret-box.ts); never shown */
  sealed: { v: 1; iv: string; tag: string; ct: string }[];
  created_at: string;
  updated_at: string;
};

export const CONNECTION_PROVIDERS = ['codehost', 'chat', 'tracker', 'pager', 'email'] as const;
export type ConnectionProvider = (typeof CONNECTION_PROVIDERS)[number];

/** Which connection, by id or name, an automation's runs act through for each provider. */
export type ConnectionNames = Partial<Record<ConnectionProvider, string>>;

/** What a connection's last test found at the provider. */
export type ConnectionTestResult = { ok: boolean; identity: string | null; capabilities: string[]; error: ErrorInfo | null; checked_at: string };

/** A tenant's credential for one provider, sealed at rest; the credential is never shown. */
export type ConnectionRecord = {
  id: string;
  tenant_id: string;
  provider: ConnectionProvider;
  /** unique per tenant */
  name: string;
  /** the provider's API (GitHub Enterprise, a self-hosted tracker, an SMTP server); null: the public one */
  base_url: string | null;
  /** `app_id` and `installation_id` (code host): a GitHub App's installation, its credential the App's private key */
  settings: { username?: string; from?: string; app_id?: string; installation_id?: string };
  /** AES-256-GCM sealed credential, owned by the tenant and the connection's id */
  sealed: { v: 1; iv: string; tag: string; ct: string };
  created_at: string;
  updated_at: string;
  last_used_at: string | null;
  last_test: ConnectionTestResult | null;
};

/**
 * What a notification endpoint may subscribe to: events of the catalogue under their outbound names
 * (the audit's report is `audit.report`), and the service's word that one of the tenant's endpoints was
 * disabled. `gate.*` and `*` are patterns.
 */
export const NOTIFICATION_TYPES = [
  'run.finished',
  'session.updated',
  'task.updated',
  'gate.finished',
  'gate.run_finished',
  'audit.report',
  'notification.endpoint_disabled',
] as const;
export type NotificationType = (typeof NOTIFICATION_TYPES)[number];

/** A secret sealed with AES-256-GCM (secret-box.ts). */
export type SealedSecret = { v: 1; iv: string; tag: string; ct: string };

/** A tenant's endpoint for outbound notifications, signed with the Standard Webhooks scheme. */
export type NotificationEndpoint = {
  id: string;
  tenant_id: string;
  url: string;
  description: string | null;
  /** event types or patterns (`gate.*`, `*`) */
  event_types: string[];
  status: 'enabled' | 'disabled';
  disabled_reason: string | null;
  /** deliveries that failed after all their attempts, since the last that succeeded */
  consecutive_failures: number;
  /** the signing secret (whsec_…), AES-256-GCM sealed; shown once when made, or when rotated */
  sealed_secret: SealedSecret;
  /** when the secret was last rotated (absent or null: never) */
  secret_rotated_at?: string | null;
  /** the secret it had before its last rotation, which still signs beside it until previous_secret_expires_at */
  previous_sealed_secret?: SealedSecret | null;
  previous_secret_expires_at?: string | null;
  created_at: string;
  updated_at: string;
};

export const NOTIFICATION_DELIVERY_STATUSES = ['pending', 'succeeded', 'failed'] as const;
export type NotificationDeliveryStatus = (typeof NOTIFICATION_DELIVERY_STATUSES)[number];

/** One notification to one endpoint: its message (the webhook-id is the delivery's id) and every attempt. */
export type NotificationDelivery = {
  id: string;
  tenant_id: string;
  endpoint_id: string;
  event_type: NotificationType;
  payload: Record<string, unknown>;
  status: NotificationDeliveryStatus;
  attempts: { at: string; status_code: number | null; error: string | null; duration_ms: number }[];
  /** how many times it was sent again by hand */
  replays: number;
  created_at: string;
  updated_at: string;
};

export const DELIVERY_STATUSES = ['received', 'processed', 'failed', 'rejected'] as const;
export type DeliveryStatus = (typeof DELIVERY_STATUSES)[number];

/** One request to a webhook route: accepted ones keep their body; rejected ones only metadata. */
export type WebhookDelivery = {
  id: string;
  tenant_id: string;
  kind: WebhookProvider;
  status: DeliveryStatus;
  /** the provider's event type (`push`, `app_mention`, `Issue`, `incident.triggered`, `email`) and action */
  event: string | null;
  action: string | null;
  /** the provider's own id of this event; one delivery per id */
  provider_delivery_id: string | null;
  headers: Record<string, string>;
  content_type: string | null;
  /** the raw body as received (UTF-8); null for rejected requests and for email, whose event keeps it */
  body: string | null;
  body_size: number;
  body_sha256: string | null;
  /** the digest of what was signed (its replay key): where a delivery's id is not signed (generic, Mailgun), its replay under another id, or none, is found by it */
  signed_sha256?: string | null;
  /** the normalized event that runs receive as `inputs.event` */
  event_payload: Record<string, unknown> | null;
  rejection: ErrorInfo | null;
  runs: { automation_id: string; run_id: string }[];
  /** how many times it was matched: 1 after processing, +1 per replay */
  attempts: number;
  error: ErrorInfo | null;
  received_at: string;
  processed_at: string | null;
  /** when its body and event were deleted, SERVICE_WEBHOOK_DELIVERIES_KEPT_DAYS after it was received; absent while kept */
  payload_pruned_at?: string | null;
};

export const SESSION_KINDS = ['multi_agent', 'autonomy', 'vibe'] as const;
export type SessionKind = (typeof SESSION_KINDS)[number];

export const SESSION_STATUSES = ['idle', 'running', 'waiting', 'paused', 'archived'] as const;
export type SessionStatus = (typeof SESSION_STATUSES)[number];

export type SessionOutcome = 'succeeded' | 'failed' | 'canceled';

/**
 * A session: what an autonomy or vibe run streams into (kind `autonomy`, `vibe`), or a multi-agent
 * session with agents, a task DAG and a message log (kind `multi_agent`).
 */
export type Session = {
  id: string;
  tenant_id: string;
  title: string | null;
  goal: string | null;
  kind: SessionKind;
  status: SessionStatus;
  /** set once every task (or the run) has ended; null while work remains */
  outcome: SessionOutcome | null;
  metadata: Record<string, unknown>;
  created_at: string;
  updated_at: string;
};

/** An agent of a multi-agent session. A task's run takes a snapshot of it: editing an agent never changes a run. */
export type AgentRecord = {
  id: string;
  tenant_id: string;
  session_id: string;
  name: string;
  role: string | null;
  instructions: string | null;
  tool_allowlist: ToolName[];
  budget: Budget;
  /** overrides SERVICE_AGENT_MODEL for this agent */
  model: string | null;
  created_at: string;
  updated_at: string;
};

export const MESSAGE_ROLES = ['user', 'system', 'agent', 'tool'] as const;
export type MessageRole = (typeof MESSAGE_ROLES)[number];

export type MessagePart = { type: 'text'; text: string } | { type: 'data'; data: Record<string, unknown> };

/** The most characters (code points) of a message's text part (api/openapi.yaml's MessagePart): the session tool and agents are held to it too. */
export const MESSAGE_TEXT_MAX = 100_000;

/** One entry of a session's durable message log; `seq` orders the log (1, 2, 3, … per session). */
export type MessageRecord = {
  id: string;
  tenant_id: string;
  session_id: string;
  seq: number;
  role: MessageRole;
  /** who wrote it: an agent id, or null for a person or the system */
  from: string | null;
  /** an agent id, or null for all */
  to: string | null;
  kind: string;
  parts: MessagePart[];
  task_id: string | null;
  run_id: string | null;
  in_reply_to: string | null;
  created_at: string;
};

export const TASK_STATUSES = ['pending', 'queued', 'running', 'input_required', 'succeeded', 'failed', 'upstream_failed', 'canceled'] as const;
export type TaskStatus = (typeof TASK_STATUSES)[number];
export const TERMINAL_TASK_STATUSES: readonly TaskStatus[] = ['succeeded', 'failed', 'upstream_failed', 'canceled'];
/** The statuses of a task that has not ended (the reconciler's). */
export type LiveTaskStatus = Exclude<TaskStatus, 'succeeded' | 'failed' | 'upstream_failed' | 'canceled'>;

/** When a task may start: every dependency succeeded (`all_success`), or every one ended however (`all_done`). */
export type TriggerRule = 'all_success' | 'all_done';

/** A unit of work of a multi-agent session; `depends_on` are the DAG's edges. */
export type TaskRecord = {
  id: string;
  tenant_id: string;
  session_id: string;
  title: string | null;
  goal: string | null;
  steps: Step[] | null;
  agent_id: string | null;
  depends_on: string[];
  trigger_rule: TriggerRule;
  status: TaskStatus;
  attempts: number;
  max_attempts: number;
  run_ids: string[];
  output: Record<string, unknown> | null;
  /** its agent's inbox starts after this message seq: the session's latest when the task was added */
  inbox_after?: number;
  /** its place in the order its session's tasks were added (1, 2, 3, …): the DAG order's tie-break */
  position: number;
  created_at: string;
  updated_at: string;
};

/**
 * One entry of a tenant's evidence ledger: append-only, numbered from 1, each chained to the one
 * before by `prev_hash` and signed. `hash` is the sha256 of the canonical JSON (RFC 8785) of every
 * field but `hash`, `key_id` and `sig`; `sig` is Ed25519 over the hash's bytes. The payload itself is
 * kept apart, by its digest.
 */
export type LedgerEntry = {
  tenant_id: string;
  seq: number;
  at: string;
  /** what happened: gate.result, gate.run, run.finished, audit.report, ... */
  kind: string;
  /** what it is about: a workspace and its commit and tree, a run, ... */
  subject: LedgerSubject;
  /** `sha256:<hex>` of the payload's canonical JSON */
  payload_digest: string;
  prev_hash: string;
  hash: string;
  /** the signing key's id: the first 16 hex characters of the sha256 of its raw public key */
  key_id: string;
  /** base64 Ed25519 signature of `hash` */
  sig: string;
};

export type LedgerSubject = {
  workspace?: string;
  commit?: string | null;
  tree?: string | null;
  dirty?: boolean | null;
  input_digest?: string;
  run_id?: string;
  gate_run_id?: string;
  gate_id?: string;
  report_id?: string;
};

/** A payload of the ledger, kept once by its digest (the canonical JSON text). */
export type LedgerPayload = { digest: string; body: string };

/** How a gate ended, in the vocabulary of GitHub's check runs. */
export const GATE_CONCLUSIONS = ['success', 'failure', 'neutral', 'cancelled', 'skipped', 'timed_out'] as const;
export type GateConclusion = (typeof GATE_CONCLUSIONS)[number];

/** A line of a gate's report shown beside the code. */
export type Annotation = { path: string | null; line: number | null; level: 'notice' | 'warning' | 'failure'; message: string; title?: string };

/** What a gate's run is about: the workspace (as the tenant names it) and its git state. */
export type GateSubject = { workspace: string; commit: string | null; tree: string | null; dirty: boolean | null };

export type GateResult = {
  gate_id: string;
  name: string;
  required: boolean;
  conclusion: GateConclusion;
  summary: string;
  exit_code: number | null;
  duration_ms: number;
  /** the last 8 KB of its output */
  output_tail: string;
  annotations: Annotation[];
  subject: GateSubject;
  /** `sha256:` over its input files: a later digest that differs makes the result stale */
  input_digest: string;
  /** `sha256:` of the gate's definition (canonical JSON) */
  definition_digest: string;
  tool_versions: Record<string, string>;
  /** files kept with the result, by sha256; their content is a ledger payload */
  artifacts: { path: string; size: number; sha256: string; payload_digest: string }[];
  started_at: string;
  finished_at: string;
};

export const GATE_RUN_STATUSES = ['running', 'succeeded', 'failed', 'canceled'] as const;
export type GateRunStatus = (typeof GATE_RUN_STATUSES)[number];

/** One run of a workspace's gate set: a BullMQ flow of one job per gate under a job that seals the results. */
export type GateRunRecord = {
  id: string;
  tenant_id: string;
  /** the workspace as its tenant names it */
  workspace: string;
  status: GateRunStatus;
  /** the gate set's file (`gates.yaml`, `.gates.yaml`) or `detected` */
  source: string;
  /** the gates it runs, in the set's order */
  gates: string[];
  /**
   * every required gate of the set when it started, whether this run runs it or not (`only`): a commit is
   * ready only when each has passed (absent on runs recorded before it was kept)
   */
  required_gates?: string[];
  /**
   * the definition digest of each gate it runs, as the set was when it started: a gate whose definition differs
   * when its turn comes (the gate file edited meanwhile, by anyone, or by a gate before it) is not run (absent on
   * runs recorded before it was kept)
   */
  definitions?: Record<string, string>;
  /**
   * the digest of the commit's files as the service read them when it started (committedDigest in
   * engine/gates/subject.ts), null when the tree was not clean then: each gate's files are compared with it
   * (absent on runs recorded before it was kept)
   */
  committed_digest?: string | null;
  /** what started it: a run's `gates` step, the API, or the CLI posting its results */
  trigger: { type: 'run'; run_id: string; session_id: string; attempt?: number } | { type: 'api' } | { type: 'cli' };
  subject: GateSubject | null;
  /** every gate's result, in the set's order, once sealed */
  results: GateResult[];
  /** the ledger entries that seal it */
  ledger: { from_seq: number; to_seq: number; head_hash: string } | null;
  /** why it ended without a seal though its gates ran (canceled with their results: the ledger refused the service's key) */
  error?: string;
  created_at: string;
  finished_at: string | null;
};

/** The phases of a workspace audit, in the order a report lists them. */
export const AUDIT_PHASES = ['security', 'architecture', 'sanity', 'health'] as const;
export type AuditPhase = (typeof AUDIT_PHASES)[number];

/** How bad a finding is, worst first; `info` is counted but costs a phase nothing of its score. */
export const SEVERITIES = ['critical', 'high', 'medium', 'low', 'info'] as const;
export type Severity = (typeof SEVERITIES)[number];
export type SeverityCounts = Record<Severity, number>;

export type AuditFinding = { rule: string; severity: Severity; file: string | null; line: number | null; message: string };

/** `completed`: the phase ran to its end (with or without findings); `failed`/`timed_out`: it did not, and the report is partial. */
export const PHASE_STATUSES = ['completed', 'failed', 'timed_out'] as const;
export type PhaseStatus = (typeof PHASE_STATUSES)[number];

export type AuditPhaseResult = {
  phase: AuditPhase;
  status: PhaseStatus;
  duration_ms: number;
  findings: AuditFinding[];
  /** findings past the cap a phase keeps: counted, not listed */
  findings_omitted: number;
  counts: SeverityCounts;
  /** 100 less what the findings cost; null when the phase did not complete */
  score: number | null;
  metrics: Record<string, unknown>;
  error: string | null;
};

export const AUDIT_STATUSES = ['running', 'completed', 'partial'] as const;
export type AuditStatus = (typeof AUDIT_STATUSES)[number];

/** What an audit may be told beyond its root: the phases to run and the layers imports must respect. */
export type AuditLayer = { name: string; path: string; may_import: string[] };
export type AuditOptions = { phases: AuditPhase[]; layers: AuditLayer[] | null };

export type AuditReport = {
  report_id: string;
  /** the workspace's name in its tenant's root, or the folder's real path when it lies outside it */
  workspace: string;
  phases_requested: AuditPhase[];
  started_at: string;
  finished_at: string | null;
  status: AuditStatus;
  trigger: { type: 'api'; request_id: string } | { type: 'run'; run_id: string; session_id: string; attempt?: number };
  phases: AuditPhaseResult[];
  totals: SeverityCounts;
  scores: Partial<Record<AuditPhase, number | null>>;
  /** the summary's entry in the evidence ledger, once the report is complete */
  ledger: { seq: number; hash: string } | null;
};

/**
 * What the end of an audit's stream (`audit.finished`, SSE `report`, the `audit.report` notification) says of the
 * report: all but each phase's findings and metrics, which a client fetches (GET the report). The event is kept in
 * Redis with the report and sent to every reader and endpoint: carrying the report whole, it doubled what one
 * report held in Redis and was sent again to each.
 */
export type AuditReportHead = Omit<AuditReport, 'phases'> & {
  phases: Pick<AuditPhaseResult, 'phase' | 'status' | 'counts' | 'score' | 'duration_ms' | 'findings_omitted' | 'error'>[];
};
