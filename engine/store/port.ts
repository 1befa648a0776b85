// The store port: typed repositories with the tenant id on every method that reads or changes
// tenant data. Two adapters implement it (sqlite/, mongo/); one contract suite tests both.
import {
  ValidationError,
  type AgentRecord,
  type AgentTurn,
  type ApiKeyPatch,
  type ApiKeyRecord,
  type Automation,
  type AutomationStatus,
  type ConnectionProvider,
  type ConnectionRecord,
  type DeliveryStatus,
  type NotificationDelivery,
  type NotificationEndpoint,
  type SealedSecret,
  type GateResult,
  type GateRunRecord,
  type GateRunStatus,
  type LedgerEntry,
  type LedgerPayload,
  type MessageRecord,
  type Run,
  type RunKind,
  type RunStatus,
  type Session,
  type SessionKind,
  type SessionStatus,
  type StepRecord,
  type TaskRecord,
  type LiveTaskStatus,
  type TaskStatus,
  type Trigger,
  type WebhookDelivery,
  type WebhookProvider,
  type WebhookSecretRecord,
} from '../platform/index.js';
import type { MemberChanges } from './members.js';

export type Page<T> = { items: T[]; next_cursor: string | null };

export type AutomationQuery = {
  /** only these statuses; when absent, every status but archived */
  statuses?: AutomationStatus[];
  limit: number;
  cursor?: string;
};

export type AutomationChanges = Partial<Omit<Automation, 'id' | 'tenant_id' | 'created_at'>>;

/** Members of an automation's budget and connections changed by the update itself (members.ts). */
export type AutomationMembers = MemberChanges<'budget' | 'connections'>;
/** Members of an agent's budget changed by the update itself. */
export type AgentMembers = MemberChanges<'budget'>;

/** What an insert under a cap did: stored it, or stored nothing because it would take the count past the cap. */
export type CappedInsert = 'inserted' | 'over-cap';

export interface AutomationRepo {
  /**
   * Inserts the automation; with `maxLive`, a live one only while the tenant has fewer live automations
   * than that, else 'over-cap', storing nothing. The count and the write are one step against the tenant's
   * other capped inserts, so of inserts that race no more than the cap are stored, and a refused one is
   * never seen by a reader, not for a moment (a count read before, then a write, lets two at once both
   * pass). SQLite counts inside the write's IMMEDIATE transaction, across processes sharing the file.
   * MongoDB, without a transaction, has the tenant's capped inserts take turns under a lease
   * (mongo/leases.ts, across processes, timed by the server's clock); one that cannot have it within a few
   * seconds throws ServiceUnavailableError (503: busy, not full). There, an insert held up on the way for
   * longer than a hold (30 s: a network partition) can land after the next holder counted without it. An
   * insert without a cap is held to none, and on MongoDB does not take turns with capped ones.
   */
  insert(automation: Automation, cap?: { maxLive: number }): Promise<CappedInsert>;
  /**
   * `insert`, the automation taking a create's Idempotency-Key (its digest in the automations' scope:
   * IdempotencyRecord's `run_id` is the automation's id) as RunRepo.insert takes a run's: in the same
   * transaction on SQLite, just before the insert on MongoDB (let go when the automation is not stored). When
   * another request's record holds the key, nothing is stored and that record is the answer. One refused over
   * the cap keeps no key.
   */
  insertWithKey(automation: Automation, key: KeyClaim, cap?: { maxLive: number }): Promise<CappedInsert | IdempotencyRecord>;
  get(tenantId: string, id: string): Promise<Automation | null>;
  list(tenantId: string, query: AutomationQuery): Promise<Page<Automation>>;
  /** The same page, each automation as the JSON text of its representation: answered without a parse and a stringify. */
  listJson(tenantId: string, query: AutomationQuery): Promise<Page<JsonDoc>>;
  /**
   * Applies `changes`, and `members` merged into the stored budget and connections (a member null removed),
   * only while the status is one of `ifStatusIn`; null when no row matched.
   */
  update(tenantId: string, id: string, changes: AutomationChanges, ifStatusIn: AutomationStatus[], members?: AutomationMembers): Promise<Automation | null>;
  /** How many automations the tenant has that are not archived. */
  countLive(tenantId: string): Promise<number>;
  /** Enabled automations with a trigger of this type: of one tenant, or (system use: trigger reconcilers) of all. */
  listEnabledWithTrigger(type: Trigger['type'], tenantId?: string): Promise<Automation[]>;
}

export type RunChanges = Partial<Omit<Run, 'id' | 'tenant_id' | 'created_at' | 'kind'>>;

/** What a conditional update of a run expects to find: one of these statuses, and (when given) this attempt. */
/** What a run must be for a write to apply: one of these statuses, at this attempt, and (`uncanceled`) no cancel asked of it. */
export type RunGuard = { status: RunStatus[]; attempt?: number; uncanceled?: boolean };

/**
 * The ends a run reaches by running: its work succeeded or failed, or its budget ran out (the time it took
 * then is what a budget must at least allow). A canceled run stopped when someone asked, before it started
 * (0 ms) or part way, which says nothing of how long its work takes.
 */
export const RAN_THROUGH_STATUSES: readonly RunStatus[] = ['succeeded', 'failed', 'timed_out'];

export type RunStats = { counts: Partial<Record<RunStatus, number>>; durations_ms: number[]; last: Run | null };

export type RunQuery = { kind?: RunKind; status?: RunStatus; automation_id?: string; session_id?: string; limit: number; cursor?: string };

/** An Idempotency-Key's record to take with a new run, on IdempotencyKeyRepo.claim's terms. */
export type KeyClaim = { record: IdempotencyRecord; since: string; pendingSince: string };

export interface RunRepo {
  /**
   * Stores a new run. With `key`, takes the key's record for it in the same write: when another request's
   * record holds the key (IdempotencyKeyRepo.claim), nothing is stored and that record is the answer.
   */
  insert(run: Run, key?: KeyClaim): Promise<IdempotencyRecord | null>;
  get(tenantId: string, id: string): Promise<Run | null>;
  /**
   * Applies `changes` only while the run matches `guard`: every transition is conditional. `steps`
   * are step records of the run's current attempt to write in the same transaction (new or changed).
   */
  update(tenantId: string, id: string, changes: RunChanges, guard: RunGuard, steps?: StepRecord[]): Promise<Run | null>;
  /**
   * System use (the reconciler): deletes at most `limit` runs of every tenant made before `idBefore` (their id
   * sorts before it) and ended before `finishedBefore`, but a session task's, each with its steps and turns, and
   * its own session (an autonomy or vibe run's) once no run of it is left; how many runs went.
   */
  prune(idBefore: string, finishedBefore: string, limit: number): Promise<number>;
  /** Writes step records of an attempt (new or changed), whatever the run's status. */
  putSteps(tenantId: string, runId: string, attempt: number, steps: StepRecord[]): Promise<void>;
  /** The step records of one attempt, by index. */
  steps(tenantId: string, runId: string, attempt: number): Promise<StepRecord[]>;
  appendTurn(tenantId: string, runId: string, attempt: number, turn: AgentTurn): Promise<void>;
  /** The agent turns of one attempt, in order. */
  turns(tenantId: string, runId: string, attempt: number): Promise<AgentTurn[]>;
  /** Newest first; every filter is optional. */
  list(tenantId: string, q: RunQuery): Promise<Page<Run>>;
  /** Counts by status, durations of the latest finished runs (newest first), and the latest run. */
  automationStats(tenantId: string, automationId: string, recent: number): Promise<RunStats>;
  /**
   * Durations of the tenant's latest runs of a kind that started and ended in one of RAN_THROUGH_STATUSES, newest
   * first: how long its work takes, which budgets are suggested from.
   */
  recentDurations(tenantId: string, kind: RunKind, limit: number): Promise<number[]>;
  /** System use (metrics): how many runs of every tenant there are, by kind and status. */
  countByKindAndStatus(): Promise<{ kind: RunKind; status: RunStatus; count: number }[]>;
  /**
   * System use (the reconciler): runs of every tenant queued or running, created before a time, oldest
   * first (by creation, then id); `after` (the last run of the page before) pages on.
   */
  listStale(status: Extract<RunStatus, 'queued' | 'running'>, createdBefore: string, limit: number, after?: { created_at: string; id: string }): Promise<Run[]>;
  /** The status and end of the tenant's runs among `ids` (those that exist, in no order), without their documents. */
  statusOf(tenantId: string, ids: string[]): Promise<RunStatusRow[]>;
}

export type RunStatusRow = Pick<Run, 'id' | 'status' | 'finished_at'>;

/**
 * An Idempotency-Key a run was started with, as the store remembers it beside Redis (which forgets it if
 * it loses its data): the key's digest, the digest of the request it came with, and the run it started.
 * An automation's create keeps its keys here too, under digests of their own scope: `run_id` is then the
 * automation it made, and AutomationRepo.insert's claim looks for it among the automations.
 */
export type IdempotencyRecord = { tenant_id: string; key_digest: string; fingerprint: string; run_id: string; created_at: string };

export interface IdempotencyKeyRepo {
  /**
   * Takes the key for `record`'s run, before the run is stored. Another record of the key kept after
   * `since` (within its day) holds it when its run is stored, or when it was kept after `pendingSince`
   * (its request may still be storing its run): that record is answered and nothing changes. Otherwise
   * (no record, the same run's, one past its day, or one whose request never stored its run) `record` is
   * kept and the answer is null. Two requests that claim a key at once: one of them keeps it.
   */
  claim(record: IdempotencyRecord, since: string, pendingSince: string): Promise<IdempotencyRecord | null>;
  /** Lets a key go when `runId`'s request holds it still (that request stored no run). */
  release(tenantId: string, keyDigest: string, runId: string): Promise<void>;
  /** The key's record, when it was kept after `since`. */
  get(tenantId: string, keyDigest: string, since: string): Promise<IdempotencyRecord | null>;
  /** System use (the reconciler): forgets at most `limit` records kept before `before`; how many it forgot. */
  prune(before: string, limit: number): Promise<number>;
}

/** The id of the key an API key was made with (`created_by: key:<id>`); null when a person, the CLI or the operator made it. */
export const makerOf = (k: ApiKeyRecord): string | null => (k.created_by?.startsWith('key:') ? k.created_by.slice(4) : null);

export interface ApiKeyRepo {
  /**
   * Inserts unless a key with the same hash exists; true when inserted. With `cap`, only while the tenant holds
   * fewer than `maxLive` keys made through the API (`source: api`), neither revoked nor expired at `now`, else 'over-cap', storing
   * nothing (checked as AutomationRepo.insert's cap). A key made with a key (`created_by: key:<id>`) is
   * refused ('maker-revoked'; not kept, or kept revoked) when that key is revoked by the time it is written: a request
   * let in before a revocation makes no key after it (revocation's cascade counts on it).
   */
  insert(record: ApiKeyRecord, cap?: { maxLive: number; now: string }): Promise<boolean | 'over-cap' | 'maker-revoked'>;
  /** Resolves a presented key's hash to its record: the one lookup that finds the tenant. */
  findByHash(hash: string): Promise<ApiKeyRecord | null>;
  get(tenantId: string, id: string): Promise<ApiKeyRecord | null>;
  /** Every key of the tenant, oldest first (revocation's cascade reads them all). */
  list(tenantId: string): Promise<ApiKeyRecord[]>;
  /** A page of the tenant's keys, newest first. */
  page(tenantId: string, q: { limit: number; cursor?: string }): Promise<Page<ApiKeyRecord>>;
  /** Every key made from SERVICE_API_KEYS, of every tenant: what start-up syncs with the variable. */
  listBootstrap(): Promise<ApiKeyRecord[]>;
  /** Changes one key of the tenant; the key as it is now, or null when the tenant has no such key. */
  update(tenantId: string, id: string, patch: ApiKeyPatch): Promise<ApiKeyRecord | null>;
  /**
   * Deletes keys of any tenant that were revoked, or expired, before `spentBefore` (whichever came first), up to
   * `limit`; how many. Never a bootstrap key (SERVICE_API_KEYS: one revoked through the API must stay revoked
   * when the variable lists it again), nor a key from which a key still stored was made (a cascading
   * revocation walks through it to what it made: those go first, and it at a later pass).
   */
  pruneSpent(spentBefore: string, limit: number): Promise<number>;
}

export interface WebhookSecretRepo {
  /** Inserts or replaces the tenant's secrets for one kind. */
  put(record: WebhookSecretRecord): Promise<void>;
  list(tenantId: string): Promise<WebhookSecretRecord[]>;
  /** true when there was one to delete */
  delete(tenantId: string, kind: WebhookProvider): Promise<boolean>;
}

export type ConnectionChanges = Partial<Pick<ConnectionRecord, 'name' | 'base_url' | 'settings' | 'sealed' | 'updated_at' | 'last_used_at' | 'last_test'>>;

/** What a connection's test was about: its credential and where it was tried */
export type ConnectionState = Pick<ConnectionRecord, 'sealed' | 'base_url' | 'settings'>;

export type ConnectionQuery = { provider?: ConnectionProvider; limit: number; cursor?: string };

export interface ConnectionRepo {
  /**
   * Inserts unless the tenant has a connection of that name (false). With `cap`, only while the tenant has fewer
   * connections than `maxHeld`, else 'over-cap', storing nothing: checked as NotificationEndpointRepo.insert's cap
   * (SQLite counts inside the write's IMMEDIATE transaction, MongoDB under the tenant's lease).
   */
  insert(connection: ConnectionRecord, cap?: { maxHeld: number }): Promise<boolean | 'over-cap'>;
  get(tenantId: string, id: string): Promise<ConnectionRecord | null>;
  /** The tenant's connection of that name (names are the tenant's own, whatever the provider); null when none. */
  getByName(tenantId: string, name: string): Promise<ConnectionRecord | null>;
  /** Oldest first, optionally of one provider; at most `limit` (a run takes one, and needs to know only whether there are more). */
  list(tenantId: string, provider?: ConnectionProvider, limit?: number): Promise<ConnectionRecord[]>;
  /** A page of the tenant's connections, oldest first, optionally of one provider. */
  page(tenantId: string, q: ConnectionQuery): Promise<Page<ConnectionRecord>>;
  /**
   * The connection as it is now; null when the tenant has none of that id, or when `when` is given and the
   * stored credential or base URL is no longer the one it names (nothing is written then); 'name-taken' when a
   * rename collides.
   */
  update(tenantId: string, id: string, changes: ConnectionChanges, when?: ConnectionState): Promise<ConnectionRecord | null | 'name-taken'>;
  /** true when there was one to delete */
  delete(tenantId: string, id: string): Promise<boolean>;
}

export type NotificationEndpointChanges = Partial<
  Pick<NotificationEndpoint, 'url' | 'description' | 'event_types' | 'status' | 'disabled_reason' | 'consecutive_failures' | 'sealed_secret' | 'updated_at'>
>;

export interface NotificationEndpointRepo {
  /**
   * Inserts the endpoint; with `maxHeld`, only while the tenant has fewer endpoints than that, enabled or
   * disabled, else 'over-cap', storing nothing. Checked as AutomationRepo.insert's cap: SQLite counts inside
   * the write's IMMEDIATE transaction, MongoDB under the tenant's lease (ServiceUnavailableError when it
   * cannot be had), so of inserts that race no more than the cap are stored, and a refused one is never
   * seen by a reader. An insert without a cap is held to none, and on MongoDB does not take turns with capped ones.
   */
  insert(endpoint: NotificationEndpoint, cap?: { maxHeld: number }): Promise<CappedInsert>;
  get(tenantId: string, id: string): Promise<NotificationEndpoint | null>;
  /** Oldest first. */
  list(tenantId: string): Promise<NotificationEndpoint[]>;
  update(tenantId: string, id: string, changes: NotificationEndpointChanges): Promise<NotificationEndpoint | null>;
  /** Counts one more delivery that failed for good (atomically); the endpoint as it is now. */
  addFailure(tenantId: string, id: string, at: string): Promise<NotificationEndpoint | null>;
  /**
   * Counts a delivery that succeeded: the failures in a row start again from none (atomically, whatever was read
   * before the try: a try that failed while this one waited for its answer is not in a row with the next one).
   * Nothing is written when there were none.
   */
  resetFailures(tenantId: string, id: string): Promise<void>;
  /**
   * Gives the endpoint a new secret, only while its secret is still `expected` (compared by its sealed text): the
   * endpoint, or null when it is gone or its secret changed meanwhile (of two rotations that race, one wins).
   */
  rotateSecret(
    tenantId: string,
    id: string,
    expected: SealedSecret,
    changes: Required<
      Pick<NotificationEndpoint, 'sealed_secret' | 'secret_rotated_at' | 'previous_sealed_secret' | 'previous_secret_expires_at' | 'updated_at'>
    >,
  ): Promise<NotificationEndpoint | null>;
  /** Disables the endpoint only while it is enabled: the endpoint, or null when it was not (of two that race, one wins). */
  disable(tenantId: string, id: string, reason: string, at: string): Promise<NotificationEndpoint | null>;
  /**
   * Deletes the endpoint and every delivery of it (each keeps its event's payload): on SQLite in one transaction,
   * on MongoDB the deliveries right after the endpoint. true when there was one to delete.
   */
  delete(tenantId: string, id: string): Promise<boolean>;
}

export type NotificationDeliveryChanges = Partial<Pick<NotificationDelivery, 'status' | 'attempts' | 'replays' | 'updated_at'>>;

export interface NotificationDeliveryRepo {
  /** Stores a delivery; one of the same id is there already (an event offered again): nothing is written. */
  insert(delivery: NotificationDelivery): Promise<void>;
  get(tenantId: string, id: string): Promise<NotificationDelivery | null>;
  /** Newest first, of one endpoint. */
  list(tenantId: string, endpointId: string, q: { limit: number; cursor?: string }): Promise<Page<NotificationDelivery>>;
  /**
   * Null when there is no such delivery, or (with `when`) when it is not as `when` says: its replays a number and its
   * status one of a list, checked in the write (two replays read at once: one of them sends it again).
   */
  update(
    tenantId: string,
    id: string,
    changes: NotificationDeliveryChanges,
    when?: { replays: number; status: NotificationDelivery['status'][] },
  ): Promise<NotificationDelivery | null>;
  /**
   * System use (the reconciler): pending deliveries of every tenant not changed since a time, oldest first (by
   * updated_at, then id); `after` (the last delivery of the page before) pages on.
   */
  listStalePending(updatedBefore: string, limit: number, after?: Pick<NotificationDelivery, 'updated_at' | 'id'>): Promise<NotificationDelivery[]>;
  /** System use (the reconciler): deletes at most `limit` ended deliveries (not pending) of every tenant last changed before a time; how many went. */
  prune(updatedBefore: string, limit: number): Promise<number>;
  /** Deletes a delivery; false when there was none. */
  delete(tenantId: string, id: string): Promise<boolean>;
}

export type DeliveryQuery = { kind?: WebhookProvider; status?: DeliveryStatus; limit: number; cursor?: string };
export type DeliveryChanges = Partial<Pick<WebhookDelivery, 'status' | 'runs' | 'attempts' | 'error' | 'processed_at'>>;
/** A delivery as lists show it: without its body and event (up to 1 MB each, 25 MB for email), which `get` reads. */
export type DeliverySummary = Omit<WebhookDelivery, 'body' | 'event_payload'>;

export interface DeliveryRepo {
  /**
   * Inserts a delivery. When the tenant already has one of this kind with the same provider_delivery_id,
   * nothing is written and that one is returned; null means it was inserted.
   */
  insert(delivery: WebhookDelivery): Promise<WebhookDelivery | null>;
  get(tenantId: string, id: string): Promise<WebhookDelivery | null>;
  /** Newest first, as summaries: the database leaves the bodies and events out, so they are never copied or parsed here. */
  list(tenantId: string, query: DeliveryQuery): Promise<Page<DeliverySummary>>;
  /** Applies `changes` only while the status is one of `ifStatusIn`; null when no row matched. */
  update(tenantId: string, id: string, changes: DeliveryChanges, ifStatusIn: DeliveryStatus[]): Promise<WebhookDelivery | null>;
  /**
   * System use (the reconciler): deliveries of every tenant in a status, received before a time, oldest first
   * (by received_at, then id); `after` (the last delivery of the page before) pages on.
   */
  listStale(status: DeliveryStatus, receivedBefore: string, limit: number, after?: Pick<WebhookDelivery, 'received_at' | 'id'>): Promise<WebhookDelivery[]>;
  /** System use (the reconciler): deletes at most `limit` rejected deliveries received before a time, oldest first; how many went. */
  pruneRejected(receivedBefore: string, limit: number): Promise<number>;
  /**
   * System use (the reconciler): deletes the body and the event of at most `limit` processed or failed deliveries
   * received before a time, oldest first, and dates it `payload_pruned_at`; the record stays (its digests are the
   * replay guard of providers that sign no time). How many changed.
   */
  prunePayloads(receivedBefore: string, prunedAt: string, limit: number): Promise<number>;
  /**
   * Adds one to a delivery's attempts while its status is one of `ifStatusIn` and its body and event are kept (no
   * `payload_pruned_at`), in one atomic write: the record after, or null.
   */
  addAttempt(tenantId: string, id: string, ifStatusIn: DeliveryStatus[]): Promise<WebhookDelivery | null>;
  /**
   * Gives back the attempt `attempt` claimed by `addAttempt` (a replay that started nothing): one less, only while
   * it is still the delivery's latest (a replay claimed after it keeps its own number). Whether it was given back.
   */
  releaseAttempt(tenantId: string, id: string, attempt: number): Promise<boolean>;
  /**
   * Appends `runs` to a delivery's runs and applies `changes` while its status is one of `ifStatusIn`, in
   * one atomic write (two replays at once keep both their runs): the record after, or null.
   */
  addRuns(
    tenantId: string,
    id: string,
    runs: WebhookDelivery['runs'],
    changes: Omit<DeliveryChanges, 'runs' | 'attempts'>,
    ifStatusIn: DeliveryStatus[],
  ): Promise<WebhookDelivery | null>;
  /** An accepted delivery (any status but rejected) of the tenant and kind with this body's sha256, or null. */
  findByBody(tenantId: string, kind: WebhookProvider, bodySha256: string): Promise<WebhookDelivery | null>;
  /** An accepted delivery of the tenant and kind stored with this `signed_sha256`, or null. */
  findBySigned(tenantId: string, kind: WebhookProvider, signedSha256: string): Promise<WebhookDelivery | null>;
}

export type SessionQuery = { status?: SessionStatus; kind?: SessionKind; limit: number; cursor?: string };
export type SessionChanges = Partial<Pick<Session, 'title' | 'goal' | 'status' | 'outcome' | 'metadata' | 'updated_at'>>;

export interface SessionRepo {
  insert(session: Session): Promise<void>;
  get(tenantId: string, id: string): Promise<Session | null>;
  /** Newest first; archived sessions only when asked for by status. */
  list(tenantId: string, q: SessionQuery): Promise<Page<Session>>;
  /**
   * Applies `changes` only while the status is one of `ifStatusIn` (and, when `ifOutcome` is given, the
   * outcome is that one); null when no row matched.
   */
  update(tenantId: string, id: string, changes: SessionChanges, ifStatusIn: SessionStatus[], ifOutcome?: Session['outcome']): Promise<Session | null>;
  /**
   * System use (the reconciler): multi-agent sessions of every tenant running or waiting, not changed since a
   * time, oldest first; `after` (the last session of the page before) pages on, so sessions that wait for good
   * (a task waiting for input) never hide the rest.
   */
  listStale(
    status: Extract<SessionStatus, 'running' | 'waiting'>,
    updatedBefore: string,
    limit: number,
    after?: Pick<Session, 'updated_at' | 'id'>,
  ): Promise<Session[]>;
  /**
   * System use (the reconciler): deletes at most `limit` archived multi-agent sessions of every tenant whose work
   * has all ended (an outcome, no run queued or running) and that last changed before a time, oldest first, each
   * with its agents, tasks, messages and runs (their steps and turns); how many went.
   */
  pruneArchived(updatedBefore: string, limit: number): Promise<number>;
}

// A session's agents and messages are written only while it is not archived, checked in the write's own
// transaction: an archive that lands between a route's check and its write is never written past. MongoDB (no
// transaction) checks before the write and again after it: a new agent or message that finds the session
// archived then is taken back and refused, so none stays past an archive, though a reader may see it for that
// round trip (a message so taken back leaves its seq unused). An agent's update is checked before it only:
// there an archive can still land between the check and the write.
export interface AgentRepo {
  /**
   * 'archived': the session is archived; 'over-cap': it holds `cap.maxHeld` agents already. Either way nothing
   * was stored. The cap is checked as AutomationRepo.insert's, after the archive: in the IMMEDIATE transaction
   * on SQLite; on MongoDB under the session's lease, the one its capped task batches take
   * (ServiceUnavailableError when it cannot be had).
   */
  insert(agent: AgentRecord, cap?: { maxHeld: number }): Promise<CappedInsert | 'archived'>;
  get(tenantId: string, sessionId: string, id: string): Promise<AgentRecord | null>;
  /** In the order they were added. */
  list(tenantId: string, sessionId: string): Promise<AgentRecord[]>;
  /** Applies `changes`, and `members` merged into the stored budget; null when the session (of that tenant) has no such agent, or is archived. */
  update(
    tenantId: string,
    sessionId: string,
    id: string,
    changes: Partial<Omit<AgentRecord, 'id' | 'tenant_id' | 'session_id' | 'created_at'>>,
    members?: AgentMembers,
  ): Promise<AgentRecord | null>;
}

export type NewMessage = Omit<MessageRecord, 'seq'>;

export interface MessageRepo {
  /** Appends to the session's log, giving the message the next `seq` (1, 2, 3, … per session); null: the session is archived, nothing was stored. */
  append(message: NewMessage): Promise<MessageRecord | null>;
  /** Oldest first, after the given `seq` (exclusive). */
  list(tenantId: string, sessionId: string, q: { afterSeq?: number; limit: number }): Promise<MessageRecord[]>;
  /** The seq of the session's latest message; 0 when it has none. */
  lastSeq(tenantId: string, sessionId: string): Promise<number>;
  /** One message of the session by its id; null when the session (of that tenant) has none. */
  get(tenantId: string, sessionId: string, id: string): Promise<MessageRecord | null>;
}

/**
 * The head a new ledger entry chains to (null for an empty ledger): its seq, hash and time (an entry is never
 * earlier than the one before it), and the key that signed it.
 */
export type LedgerHead = { seq: number; hash: string; at: string; key_id: string } | null;

/** The characters of a waiting task's question that a session's detail keeps (TaskRepo.listSummaries). */
export const SUMMARY_QUESTION_MAX = 500;

export interface EvidenceRepo {
  /**
   * Appends to a tenant's ledger: `build` is given the head and returns the entries that follow it
   * (numbered and chained from it), from its `from`-th item on; no other entry comes between the head
   * and them. An adapter that cannot write them all at once (MongoDB without transactions) keeps what
   * it wrote, which is a part of the chain, and builds the rest on the new head. The payloads are kept
   * by digest (a digest already kept is not written again).
   */
  append(tenantId: string, build: (head: LedgerHead, from: number) => LedgerEntry[], payloads: LedgerPayload[]): Promise<LedgerEntry[]>;
  head(tenantId: string): Promise<LedgerEntry | null>;
  /** Oldest first: entries after `afterSeq`, at or after `since`, up to `limit`. */
  list(tenantId: string, q: { afterSeq?: number; since?: string; limit: number }): Promise<LedgerEntry[]>;
  /** The payloads of these digests that the tenant's ledger keeps. */
  payloads(tenantId: string, digests: string[]): Promise<LedgerPayload[]>;
  /** The tenant's first entry of `kind` whose subject names this report; null when it has none. */
  firstOfReport(tenantId: string, kind: string, reportId: string): Promise<LedgerEntry | null>;
  /**
   * The tenant's entries whose subject names this gate run (its seal's: a result per gate, then the run),
   * oldest first; empty when it has none.
   */
  ofGateRun(tenantId: string, gateRunId: string): Promise<LedgerEntry[]>;
}

export interface GateRunRepo {
  insert(run: GateRunRecord): Promise<void>;
  get(tenantId: string, id: string): Promise<GateRunRecord | null>;
  /** Applies `changes` only while the status is one of `ifStatusIn`; null when no row matched. */
  update(tenantId: string, id: string, changes: Partial<GateRunRecord>, ifStatusIn: GateRunStatus[]): Promise<GateRunRecord | null>;
  /** Newest first, optionally of one workspace. */
  list(tenantId: string, q: { workspace?: string; limit: number; cursor?: string }): Promise<Page<GateRunRecord>>;
  /** Keeps one gate's result of a gate run (a result kept twice for the same run and gate is kept once). */
  putResult(tenantId: string, gateRunId: string, result: GateResult): Promise<void>;
  /** The results of one gate run, by gate id. */
  results(tenantId: string, gateRunId: string): Promise<GateResult[]>;
  /**
   * The latest result of each gate of a workspace, by when it finished, with the gate run it is of: of a sealed
   * gate run, and of a gate that ran (not the stand-in, with no `definition_digest`, of one its run did not run).
   */
  latestResults(tenantId: string, workspace: string): Promise<{ gate_run_id: string; result: GateResult }[]>;
  /** The gate runs of a workspace that are running, newest first (their results are kept apart until sealed). */
  runningOf(tenantId: string, workspace: string): Promise<GateRunRecord[]>;
  /**
   * System use (the reconciler): running gate runs of every tenant made before a time, oldest first; `after`
   * (the last run of the page before) pages on, so runs still going never hide a lost one behind them.
   */
  listRunning(createdBefore: string, limit: number, after?: Pick<GateRunRecord, 'created_at' | 'id'>): Promise<GateRunRecord[]>;
}

export type TaskChanges = Partial<Pick<TaskRecord, 'status' | 'attempts' | 'run_ids' | 'output' | 'updated_at'>>;

/** A task without its output (up to 256 KB of its steps' outputs): what its status, order, dependencies and runs need. */
export type TaskBrief = Omit<TaskRecord, 'output'>;

export interface TaskRepo {
  /**
   * Inserts a batch of tasks of one session, all or none; 'id-taken' (nothing stored) when an id is taken in
   * its session, by a concurrent insert. With `maxHeld`, only while the session holds at most that many tasks
   * with the batch, else 'over-cap', checked as AutomationRepo.insert's cap (an IMMEDIATE transaction; on
   * MongoDB the session's lease, ServiceUnavailableError when it cannot be had). Both check the cap first: a
   * batch over it that also reuses a taken id is 'over-cap'. With a cap, a refused batch is never seen by a
   * reader; an insert that fails is taken back, but on MongoDB (no transaction) a reader may see part of it
   * until then, and without a cap a batch refused at a taken id shows the tasks before it until then.
   * With `whileLive` too, only while the batch's session is not archived, else 'archived' (nothing stored),
   * checked before the cap: in the same transaction in SQLite; on MongoDB under the session's lease, which an
   * archive does not take, so there an archive can still come between the check and the insert. With a cap the
   * batch's tasks are numbered (`position`, written on the records given) from the count the cap is checked
   * against: two batches that race never share a position, and a later batch's come after an earlier one's.
   * With `reopenAt` too, a session that has an outcome (every task it held had ended) and is not archived loses it
   * with the batch: its outcome becomes null and its `updated_at` `reopenAt`, in the insert's own transaction in
   * SQLite (no reader sees the new tasks and the session still ended); on MongoDB in one conditional write just
   * after the insert, under the session's lease. Its status stays: new tasks are pending, which moves no status
   * (an ended session is idle, or paused, and is so with work pending). The answer is then 'reopened', not 'inserted'.
   */
  insertMany(
    tasks: TaskRecord[],
    cap?: { maxHeld: number; whileLive?: boolean; reopenAt?: string },
  ): Promise<CappedInsert | 'reopened' | 'id-taken' | 'archived'>;
  get(tenantId: string, sessionId: string, id: string): Promise<TaskRecord | null>;
  /** The tasks of a session with these ids, in creation order; ids it does not have are left out. */
  getMany(tenantId: string, sessionId: string, ids: string[]): Promise<TaskRecord[]>;
  /** Every task of a session, in creation order. */
  list(tenantId: string, sessionId: string): Promise<TaskRecord[]>;
  /** The tasks of a session in a status, in creation order: a few among many, read through an index. */
  listIn(tenantId: string, sessionId: string, status: TaskStatus): Promise<TaskRecord[]>;
  /** Every task of a session without its output, in creation order: 10,000 tasks of 256 KB outputs are 2.5 GB with them. */
  listBriefs(tenantId: string, sessionId: string): Promise<TaskBrief[]>;
  /**
   * Every task of a session, in creation order, its output without its `result` and `steps` (what is left: its
   * status, summary, error, usage, the question it waits on, its run): a session's detail, a few KB a task. The
   * question is cut to SUMMARY_QUESTION_MAX characters (`question_truncated: true`): a model's question may be
   * 100,000, and 300 waiting tasks made a detail of 30 to 120 MB. The whole question is in the message log.
   */
  listSummaries(tenantId: string, sessionId: string): Promise<TaskRecord[]>;
  /** Applies `changes` only while the status is one of `ifStatusIn`; null when no row matched. */
  update(tenantId: string, sessionId: string, id: string, changes: TaskChanges, ifStatusIn: TaskStatus[]): Promise<TaskRecord | null>;
  /** How many of a session's tasks are in each status (statuses with none are absent). */
  counts(tenantId: string, sessionId: string): Promise<Partial<Record<TaskStatus, number>>>;
  /**
   * System use (the reconciler): tasks of every tenant in a status that has not ended, changed before a time, oldest first;
   * `after` (the last task of the page before) pages on, so tasks that wait for good never hide the rest.
   */
  listStale(status: LiveTaskStatus, updatedBefore: string, limit: number, after?: TaskRecord): Promise<TaskRecord[]>;
}

/** What the store knows of the deployment it belongs to. */
export interface DeploymentRepo {
  /**
   * The queue prefix of the deployment this store belongs to: the one given, on its first call for a store, else
   * the one recorded then (first writer wins). Processes of two prefixes on one store take each other's runs for lost.
   */
  claimQueuePrefix(prefix: string): Promise<string>;
  /** Records `prefix` as the deployment's, whatever was recorded (a deployment moved to a new prefix). */
  moveQueuePrefix(prefix: string): Promise<void>;
}

/**
 * Throws when the store no longer belongs to the deployment of `prefix` (a process of a new prefix moved it): a
 * process left running of the old one is not ready, and its reconciler takes no run for lost.
 */
export async function assertStoreIsOurs(store: Pick<Store, 'deployment'>, prefix: string): Promise<void> {
  const recorded = await store.deployment.claimQueuePrefix(prefix);
  if (recorded !== prefix)
    throw Object.assign(new Error(`the store moved to the deployment of queue prefix "${recorded}"; this process's is "${prefix}"`), {
      code: 'STORE_MOVED',
    });
}

export interface Store {
  readonly kind: 'sqlite' | 'mongo';
  readonly deployment: DeploymentRepo;
  readonly automations: AutomationRepo;
  readonly apiKeys: ApiKeyRepo;
  readonly runs: RunRepo;
  readonly idempotencyKeys: IdempotencyKeyRepo;
  readonly webhookSecrets: WebhookSecretRepo;
  readonly connections: ConnectionRepo;
  readonly notificationEndpoints: NotificationEndpointRepo;
  readonly notificationDeliveries: NotificationDeliveryRepo;
  readonly deliveries: DeliveryRepo;
  readonly sessions: SessionRepo;
  readonly agents: AgentRepo;
  readonly messages: MessageRepo;
  readonly tasks: TaskRepo;
  readonly evidence: EvidenceRepo;
  readonly gateRuns: GateRunRepo;
  /** Throws when the store cannot be reached or takes no write (it writes a row of its own to know). */
  ping(): Promise<void>;
  close(): Promise<void>;
}

/** A document as JSON text (its API representation), with its id for paging. */
export type JsonDoc = { id: string; json: string };

/**
 * Cursors are opaque to clients: the id of the last item seen and the list it was seen in, base64url-encoded.
 * A cursor of another list is refused: taken as a place in this one, it gave page 1 again (a client paging
 * for good) or an empty page. One issued before cursors named their list is taken as it always was.
 */
export function encodeCursor(lastId: string, list: string): string {
  return Buffer.from(JSON.stringify({ after: lastId, list })).toString('base64url');
}

export function decodeCursor(cursor: string | undefined, list: string): string | undefined {
  if (!cursor) return undefined;
  let parsed: unknown;
  try {
    parsed = JSON.parse(Buffer.from(cursor, 'base64url').toString('utf8'));
  } catch {
    // falls through to the error below
  }
  const given = parsed && typeof parsed === 'object' ? (parsed as { after?: unknown; list?: unknown }) : null;
  if (given && typeof given.after === 'string' && (given.list === undefined || given.list === list)) return given.after;
  throw new ValidationError(
    given && typeof given.list === 'string' && typeof given.after === 'string'
      ? `the cursor is one of another list (${given.list.slice(0, 40)}), not of ${list}`
      : 'the cursor is not one this service issued',
    [{ path: '/query/cursor', message: 'pass the next_cursor of a previous page of this list unchanged' }],
  );
}

/** Fetch one more than asked to learn whether a next page exists. */
export function toPage<T extends { id: string }>(rows: T[], limit: number, list: string): Page<T> {
  const items = rows.slice(0, limit);
  const last = items[items.length - 1];
  return { items, next_cursor: rows.length > limit && last ? encodeCursor(last.id, list) : null };
}
