// Runs: one execution of work, of any kind. A run is written `queued` before its job exists (the
// outbox); the tenant's slots decide whether its job is added now or when a slot frees. Every change
// of status goes through transitions.ts; the reconciler repairs what a crash or a lost job left.
import path from 'node:path';
import type { Platform } from '../deps.js';
import {
  type AgentSnapshot,
  canonicalJson,
  ConflictError,
  IdempotencyKeyInUseError,
  IdempotencyKeyReusedError,
  idBefore,
  isTerminal,
  sha256Hex,
  jobIdOfRun,
  newId,
  NotFoundError,
  percentile,
  pruneInPages,
  redisBatch,
  redisOrUnavailable,
  ServiceUnavailableError,
  sweepTemp,
  TenantLineFullError,
  ValidationError,
  withTimeout,
  type ConnectionNames,
  type FieldError,
  type OverlapPolicy,
  type RetryPolicyInput,
  type Run,
  type RunDetail,
  type RunKind,
  type RunTrigger,
  type Step,
  type StepRecord,
} from '../platform/index.js';
import type { KeyClaim, RunQuery } from '../store/index.js';
import type { AgentEndpoint } from './agent.js';
import { createRunClaims } from './claims.js';
import type { TenantSlots } from './concurrency.js';
import { retryPolicyOf } from './retry.js';
import { REDIS_DEADLINE_MS, STORE_RETRY_AFTER_SECONDS, KeyHeld, type AfterStored, type Transitions } from './transitions.js';
import { allowlistOf, networkOf, requireAgentFor, type ToolPolicy } from './policy.js';
import { removeInSandbox, resolveWorkspace, sweepLeftovers, tenantRoot, tenantRootPath } from './workspace.js';
import type { Sandbox } from '../tools/index.js';

export type RunRequest = {
  kind: RunKind;
  goal?: string | null;
  steps?: Step[] | null;
  tool_allowlist?: string[];
  workspace?: string;
  budget_seconds?: number;
  max_steps?: number;
  retry?: RetryPolicyInput | null;
  network?: boolean;
  /** the connection each action tool acts through, by provider */
  connections?: ConnectionNames;
  inputs?: Record<string, unknown>;
  automation_id?: string | null;
  /** the automation's overlap policy (allow: none) */
  overlap?: OverlapPolicy;
  session_id?: string;
  rerun_of?: string;
  /** a session task's agent, as it is now */
  agent?: AgentSnapshot | null;
  /** vibe runs: run the gates on the scratch copy after the edits */
  gates?: boolean;
  trigger: RunTrigger;
  request_id?: string;
};

/**
 * An idempotency key of the service's own (a cron fire's, a webhook delivery's run, a task's run). It begins with
 * a NUL, which no HTTP header can carry: a client's Idempotency-Key of the same text never takes it first, which
 * would refuse that run for good (the same key, another request). Kept apart from clients' keys in Redis and the store.
 */
export const serviceKey = (name: string) => `\0${name}`;

export type RunLimits = {
  defaultBudgetSeconds: number;
  maxBudgetSeconds: number;
  /** the tool calls an attempt of a run with a goal (the agent plans) may make when it names no max_steps (absent: no bound) */
  defaultAgentMaxSteps?: number;
  /** the shortest interval an automation's cron trigger may fire at (absent: any) */
  cronMinIntervalSeconds?: number;
  /** the most automations a tenant keeps, archived ones aside (absent: any) */
  tenantMaxAutomations?: number;
  /** the most API keys not revoked a tenant may make through the API */
  tenantMaxApiKeys?: number;
  /** days an API key is kept once revoked or expired (absent or 0: for good) */
  apiKeysSpentKeptDays?: number;
  /** the most connections a tenant keeps (absent: any) */
  tenantMaxConnections?: number;
  /** the bytes of step output a tenant's runs stream into the event log a day, UTC (absent: no bound) */
  tenantOutputBytesPerDay?: number;
  /** how many times a run cut off by a crash (its worker lost) runs again, at once, before it ends `worker-lost` (absent: 0) */
  runLostReruns?: number;
};

/** A budget longer than the operator allows (SERVICE_RUN_MAX_BUDGET_SECONDS), as the error at `path`; null when it is not. */
export function budgetTooLong(limits: RunLimits, seconds: number, path: string): FieldError | null {
  return seconds > limits.maxBudgetSeconds ? { path, message: `must be at most ${limits.maxBudgetSeconds} (SERVICE_RUN_MAX_BUDGET_SECONDS)` } : null;
}

export type RunSettings = ToolPolicy & {
  workspaceRoot: string;
  /** days an ended run is kept after it was made (SERVICE_RUNS_KEPT_DAYS); 0 or absent: for good */
  runsKeptDays?: number;
  /** SERVICE_AUTH=none: one local tenant, whose workspace is the root itself */
  singleTenant: boolean;
  agent: AgentEndpoint | undefined;
  childEnv: Record<string, string>;
  httpAllowPrivate: boolean;
  workerConcurrency: number;
  /** gates run at once by one gate run on a copy (a vibe run's) */
  gatesConcurrency: number;
  /** gates of one tenant's gate runs running at once over every worker process (the gates queue's jobs) */
  gatesTenantConcurrency: number;
  /** the most tasks one session holds: every add, resume and listing reads them all */
  sessionMaxTasks: number;
  sessionMaxAgents: number;
};

export type RunsDeps = Pick<Platform, 'store' | 'clock' | 'log' | 'events' | 'queues' | 'redis' | 'metrics'> & {
  slots: TenantSlots;
  limits: RunLimits;
  settings: RunSettings;
  sandbox: Sandbox;
};

const CANCEL_CHANNEL = (prefix: string) => `${prefix}:run-cancel`;
const cancelKey = (prefix: string, runId: string) => `${prefix}:run-cancel:${runId}`;
/** What a cancel says of a run canceled between its attempts (waiting out a retry's backoff, put back in line by a deploy). */
const CANCELED_BEFORE_NEXT_ATTEMPT = 'canceled before its next attempt started';
/** Slot holders the reconciler reads at once. */
const HOLDERS_PAGE = 500;

/** stale runs the reconciler reads at a time, and at most in one pass (the next pass goes on from there) */
const STALE_PAGE = 500;
const STALE_PER_PASS = 10 * STALE_PAGE;
/** How long an Idempotency-Key is kept (a run's, and an automation create's). */
export const IDEMPOTENCY_TTL_SECONDS = 24 * 3600;
/** A claim whose run was never stored (its process died in between) frees the key this soon. */
export const IDEMPOTENCY_CLAIM_SECONDS = 30;
const REDIS_RETRY_AFTER_SECONDS = 2;
/** How long a request waits, in all, for the run of the request that holds its key (claiming it in turn each time it is let go). */
export const CLAIM_WAIT_MS = 5000;
const IDEMPOTENCY_IN_USE_RETRY_AFTER_SECONDS = 1;
/** a full line drains at the tenant's pace, which nothing here knows: a client asks again in half a minute */
const LINE_FULL_RETRY_AFTER_SECONDS = 30;
/** how long the line's length is waited for (Redis answers in a millisecond when it is there) */
const LINE_CHECK_DEADLINE_MS = 250;

export const keyReused = () => new IdempotencyKeyReusedError('this Idempotency-Key was used with a different request');
export const keyInUse = () =>
  new IdempotencyKeyInUseError('a request with this Idempotency-Key is still being handled; retry it after a moment', IDEMPOTENCY_IN_USE_RETRY_AFTER_SECONDS);

// removes an idempotency claim only if it is still ours: a claim that timed out may land later
const RELEASE_CLAIM = `if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`;

/**
 * What a request with an Idempotency-Key is recognised by when it comes again: the digest of its
 * canonical JSON (RFC 8785), so the same request with its fields in another order is the same request.
 */
export const fingerprintOf = (fingerprint: unknown) => sha256Hex(canonicalJson(fingerprint));
/** the digest of a key claimed before fingerprints were canonical (2026-11-24): of the JSON as the fields came */
const legacyFingerprintOf = (fingerprint: unknown) => sha256Hex(JSON.stringify(fingerprint));

export function runsOf(deps: RunsDeps, transitions: Transitions) {
  const { store, clock, log, limits, slots, queues, redis, settings } = deps;
  const prefix = queues.prefix;
  const rerunGuards: ((run: Run) => Promise<void>)[] = [];
  // the executor reads it as a run starts: in the engine's batch, with the run.started event
  const batch = redisBatch(redis);
  const claims = createRunClaims(redis, prefix);
  batch.define('key.exists', { keys: 1, args: 0, lua: `return redis.call('EXISTS', KEYS[1])` });
  // an idempotency key's claim and its day-long hold ride in the batch too (with a task's run, say)
  batch.define('key.claim', { keys: 1, args: 2, lua: `return redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2], 'NX')` });
  batch.define('key.expire', { keys: 1, args: 1, lua: `return redis.call('EXPIRE', KEYS[1], ARGV[1])` });

  /** What a run request becomes, or why it is refused: nothing is stored here. */
  async function admit(tenantId: string, req: RunRequest) {
    const errors: FieldError[] = [];
    const steps = req.steps?.length ? req.steps : null;
    const goal = req.goal?.trim() ? req.goal : null;
    if (!steps && !goal) errors.push({ path: '/body', message: 'give the work to do: non-empty steps, or a goal for the agent' });
    const seconds = req.budget_seconds ?? limits.defaultBudgetSeconds;
    const tooLong = budgetTooLong(limits, seconds, '/body/budget_seconds');
    if (tooLong) errors.push(tooLong);
    if (req.gates && req.kind !== 'vibe') errors.push({ path: '/body/gates', message: 'gates: true is for vibe runs; other runs have a gates step' });
    if (errors.length) throw new ValidationError(errors.map((e) => `${e.path}: ${e.message}`).join('; '), errors);
    requireAgentFor(settings, steps, 'this run');
    const tool_allowlist = allowlistOf(settings, req.tool_allowlist, steps, '/body/tools');
    const network = networkOf(settings, req.network);
    const workspace = await resolveWorkspace(await tenantRoot(settings, tenantId), req.workspace);
    return { steps, goal, seconds, tool_allowlist, network, workspace };
  }

  /**
   * Refuses new work while the tenant's line is full (SERVICE_TENANT_MAX_WAITING): new runs, and tasks when
   * they are added to a session (a task's own runs, made as its DAG moves on, never are). A Redis that does
   * not answer within LINE_CHECK_DEADLINE_MS lets the work in: the cap is soft, and a stored run waits for
   * Redis (the request's own wait for Redis, REDIS_DEADLINE_MS, comes after this one).
   */
  /** Room in the tenant's line for `adding` more runs (a batch of tasks: those that may start at once). */
  async function assertRoom(tenantId: string, adding = 1): Promise<void> {
    const asking = slots.hasRoom(tenantId, adding);
    const room = await withTimeout(asking, LINE_CHECK_DEADLINE_MS, 'Redis answer').catch(() => (asking.catch(() => undefined), true));
    if (!room)
      throw new TenantLineFullError(
        adding > 1
          ? `tenant ${tenantId}'s line of runs waiting for a slot has no room for ${adding} more (SERVICE_TENANT_MAX_WAITING, ${slots.maxWaiting}); retry once they drain`
          : `tenant ${tenantId} has ${slots.maxWaiting} runs waiting for a slot already (SERVICE_TENANT_MAX_WAITING); retry once they drain`,
        LINE_FULL_RETRY_AFTER_SECONDS,
      );
  }

  /** `admit`, and for work that is new (not a task's run) room in the tenant's line. */
  async function admitNew(tenantId: string, req: RunRequest): Promise<Awaited<ReturnType<typeof admit>>> {
    const admitted = await admit(tenantId, req);
    if (req.kind !== 'session_task') await assertRoom(tenantId);
    return admitted;
  }

  /** With `key`, the run takes its Idempotency-Key's record (dated as the run) in its own commit, or is not made (KeyHeld). */
  async function create(tenantId: string, req: RunRequest, id = newId('run'), after?: AfterStored, key?: (run: Run) => KeyClaim): Promise<Run> {
    const { steps, goal, seconds, tool_allowlist, network, workspace } = await admitNew(tenantId, req);
    // an agent's loop is bounded by its steps as well as its time: each step is kept with the run. A plan's
    // `agent` step is such a loop too (it was bounded by time alone: 755 steps in 3 s of a model that looped),
    // with the plan's own steps on top of the loop's allowance
    const agentSteps = steps?.some((s) => s.tool === 'agent') && limits.defaultAgentMaxSteps !== undefined;
    const maxSteps = req.max_steps ?? (goal ? limits.defaultAgentMaxSteps : agentSteps ? steps!.length + limits.defaultAgentMaxSteps! : undefined);
    const run: Run = {
      id,
      tenant_id: tenantId,
      kind: req.kind,
      status: 'queued',
      session_id: req.session_id ?? newId('ses'),
      automation_id: req.automation_id ?? null,
      ...(req.overlap && req.overlap !== 'allow' ? { overlap: req.overlap } : {}),
      trigger: req.trigger,
      goal,
      plan: steps,
      tool_allowlist,
      workspace,
      network,
      ...(req.connections && Object.keys(req.connections).length ? { connections: req.connections } : {}),
      sandbox: null,
      budget: maxSteps === undefined ? { seconds } : { seconds, max_steps: maxSteps },
      retry: retryPolicyOf(req.retry),
      attempt: 1,
      attempts: [],
      rerun_of: req.rerun_of ?? null,
      agent: req.agent ?? null,
      ...(req.gates ? { gates: true } : {}),
      usage: { steps: 0, model_turns: 0, seconds: 0 },
      inputs: req.inputs ?? {},
      summary: null,
      error: null,
      result: null,
      request_id: req.request_id ?? null,
      created_at: clock.now().toISOString(),
      started_at: null,
      finished_at: null,
      duration_ms: null,
    };
    await transitions.queue(run, after, key?.(run));
    log.info({ tenant_id: tenantId, run_id: run.id, kind: run.kind, request_id: run.request_id }, 'run queued');
    return run;
  }

  /**
   * The plan's steps an attempt has not reached. Each plan step reached has a record (one skipped by its
   * `if` too) but an `agent` step, whose tool calls are records of their own: it was reached when a plan
   * step after it was, or when agent steps were recorded after the last plan step. A run that succeeded
   * reached them all.
   */
  function notReached(run: Run, recorded: StepRecord[]): NonNullable<Run['plan']> {
    const plan = run.plan ?? [];
    if (run.status === 'succeeded') return [];
    const fromPlan = recorded.filter((s) => s.source === 'plan');
    const lastPlan = fromPlan.at(-1)?.index ?? -1;
    let agentAfter = recorded.some((s) => s.source === 'agent' && s.index > lastPlan);
    let left = fromPlan.length;
    let next = 0;
    for (; next < plan.length; next++) {
      if (plan[next]!.tool !== 'agent') {
        if (left === 0) break;
        left--;
      } else if (left === 0) {
        if (!agentAfter) break;
        agentAfter = false;
      }
    }
    return plan.slice(next);
  }

  async function mustGet(tenantId: string, id: string): Promise<Run> {
    const run = await store.runs.get(tenantId, id);
    if (!run) throw new NotFoundError(`no run ${id}`);
    return run;
  }

  /** The steps of a run's current attempt: those recorded, and the plan's steps not reached yet as pending. */
  async function stepsOf(run: Run): Promise<StepRecord[]> {
    const recorded = await store.runs.steps(run.tenant_id, run.id, run.attempt);
    const pending = notReached(run, recorded).map((s, i): StepRecord => ({
      index: recorded.length + i,
      name: s.name ?? null,
      tool: s.tool,
      args: s.args ?? {},
      // an ended run that started, in this attempt or an earlier one, skipped them: never `pending` again
      status: isTerminal(run.status) && (run.started_at || run.attempts.length) ? 'skipped' : 'pending',
      source: 'plan',
      started_at: null,
      finished_at: null,
      duration_ms: null,
      output: null,
      error: null,
    }));
    return [...recorded, ...pending];
  }

  /**
   * Creates the run once per Idempotency-Key: the same key with the same request answers the same
   * run; with another request it is refused. Keys live 24 hours. When Redis cannot hold the key, the
   * request is refused with 503 rather than risk running twice. `after` follows a run made here once it
   * is stored (not one replayed). A request given as a function is made only when the key is new: a
   * retry answers the run it started even when a new request would now be refused (its automation
   * disabled since, say).
   */
  async function createIdempotent(
    tenantId: string,
    key: string | undefined,
    fingerprint: unknown,
    request: RunRequest | (() => Promise<RunRequest>),
    after?: AfterStored,
  ): Promise<{ run: Run; replayed: boolean }> {
    const requestNow = () => (typeof request === 'function' ? request() : Promise.resolve(request));
    if (!key) return { run: await create(tenantId, await requestNow(), undefined, after), replayed: false };
    const hash = fingerprintOf(fingerprint);
    const keyDigest = sha256Hex(key);
    const slot = `${prefix}:idempotency:${tenantId}:${keyDigest}`;
    const id = newId('run');
    const claim = JSON.stringify({ hash, run_id: id });
    const unavailable = (err: unknown) =>
      new ServiceUnavailableError('Redis did not answer; retry this request with the same Idempotency-Key', REDIS_RETRY_AFTER_SECONDS, { cause: err });
    // A request that finds the key claimed waits for the claim's run; when the claim is let go meanwhile (its
    // request was refused, or failed before storing its run), this one claims the key in turn and is answered
    // as the first would have been had it come alone (its own 400 or 422, say)
    // one wait in all, however often the key is let go and claimed again
    const until = Date.now() + CLAIM_WAIT_MS;
    // each claim lost is another request's progress: only the wait bounds how often this one tries
    while (Date.now() < until) {
      const claiming = batch.call<'OK' | null>('key.claim', [slot], [claim, IDEMPOTENCY_CLAIM_SECONDS]);
      let won: string | null;
      try {
        won = await withTimeout(claiming, REDIS_DEADLINE_MS, 'Redis answer');
      } catch (err) {
        // the claim is still queued on the connection: take it back after it lands, so a retry is not refused
        void claiming.then(() => redis.eval(RELEASE_CLAIM, 1, slot, claim)).catch(() => undefined);
        throw unavailable(err);
      }
      if (won) return createClaimed(tenantId, { slot, claim, keyDigest, hash, id }, requestNow, until, after);
      const held = await heldClaim(slot).catch((err: unknown) => {
        throw unavailable(err);
      });
      if (!held) continue; // let go between the two reads
      if (held.hash !== hash && held.hash !== legacyFingerprintOf(fingerprint)) throw keyReused();
      while (Date.now() < until) {
        const run = await store.runs.get(tenantId, held.run_id);
        if (run) return { run, replayed: true };
        await new Promise((r) => setTimeout(r, 20)); // the first request is still writing it
        const now = await heldClaim(slot).catch(() => held);
        if (now?.run_id !== held.run_id) break; // let go (or expired): claim it in turn
      }
    }
    throw keyInUse();
  }

  /**
   * The stored run a tenant's Idempotency-Key holds, or null (none yet, or Redis and the store cannot say
   * now). It only reads: a caller that would check a new request first (its tenant's line, its session)
   * skips the checks for a retry, which `createIdempotent` answers with that run whatever they would say.
   * `assertSame` throws the 422 `createIdempotent` would for a request of another fingerprint: a caller that
   * learns its request's fingerprint before it pays for the request's input (an upload's digest) asks first.
   */
  async function heldRun(tenantId: string, key: string): Promise<{ run: Run; assertSame(fingerprint: unknown): void } | null> {
    const keyDigest = sha256Hex(key);
    try {
      const claimed = await heldClaim(`${prefix}:idempotency:${tenantId}:${keyDigest}`);
      // Redis forgets a key when it loses its data: the store keeps each key's run too, for its day
      const since = new Date(clock.now().getTime() - IDEMPOTENCY_TTL_SECONDS * 1000).toISOString();
      const record = claimed ? null : await store.idempotencyKeys.get(tenantId, keyDigest, since);
      const runId = claimed?.run_id ?? record?.run_id;
      const run = runId ? await store.runs.get(tenantId, runId) : null;
      if (!run) return null;
      const hash = claimed ? claimed.hash : record!.fingerprint;
      return {
        run,
        assertSame(fingerprint) {
          if (hash !== fingerprintOf(fingerprint) && hash !== legacyFingerprintOf(fingerprint)) throw keyReused();
        },
      };
    } catch {
      // not knowing is answered as a new request is: checked first
      return null;
    }
  }

  /** What holds an idempotency key now: its request's fingerprint and run; null when nothing does. */
  async function heldClaim(slot: string): Promise<{ hash?: string; run_id: string } | null> {
    const holding = await withTimeout(redis.get(slot), REDIS_DEADLINE_MS, 'Redis answer');
    return holding === null ? null : (JSON.parse(holding) as { hash?: string; run_id: string });
  }

  /**
   * The run of a request that holds its key's claim in Redis: the run of the key's record in the store, or
   * a new one. The new run takes the key's record in its own commit, so a request that finds Redis without
   * the key (it lost its data) while another request of the same key is still storing its run waits for
   * that run instead of making a second one.
   */
  async function createClaimed(
    tenantId: string,
    c: { slot: string; claim: string; keyDigest: string; hash: string; id: string },
    requestNow: () => Promise<RunRequest>,
    until: number,
    after?: AfterStored,
  ): Promise<{ run: Run; replayed: boolean }> {
    const { slot, claim, keyDigest, hash, id } = c;
    const fromStore = async <T>(read: () => Promise<T>): Promise<T> => {
      try {
        return await read();
      } catch (err) {
        throw new ServiceUnavailableError('the store did not answer; retry this request with the same Idempotency-Key', STORE_RETRY_AFTER_SECONDS, {
          cause: err,
        });
      }
    };
    try {
      // Redis forgets a key when it loses its data: the store keeps each key's run too, for its day
      const now = clock.now().getTime();
      const since = new Date(now - IDEMPOTENCY_TTL_SECONDS * 1000).toISOString();
      // a record whose run is not stored after the claim's lifetime is one whose request died before storing it
      const pendingSince = (at: string) => new Date(Date.parse(at) - IDEMPOTENCY_CLAIM_SECONDS * 1000).toISOString();
      let held = await fromStore(() => store.idempotencyKeys.get(tenantId, keyDigest, since));
      for (;;) {
        const earlier = held && (await fromStore(() => store.runs.get(tenantId, held!.run_id)));
        if (held && earlier) {
          // Redis holds the key again for the rest of its day, as it did before it lost it (if it cannot,
          // the claim is taken back below and the next retry reads the store again)
          const leftMs = Date.parse(held.created_at) + IDEMPOTENCY_TTL_SECONDS * 1000 - clock.now().getTime();
          const restored = await withTimeout(
            redis.set(slot, JSON.stringify({ hash: held.fingerprint, run_id: earlier.id }), 'PX', Math.max(1000, leftMs)),
            REDIS_DEADLINE_MS,
            'Redis answer',
          ).catch(() => null);
          if (!restored) await redis.eval(RELEASE_CLAIM, 1, slot, claim).catch(() => undefined);
          if (held.fingerprint !== hash) throw keyReused();
          return { run: earlier, replayed: true };
        }
        if (!held || held.created_at <= pendingSince(clock.now().toISOString())) {
          const key = (run: Run): KeyClaim => ({
            record: { tenant_id: tenantId, key_digest: keyDigest, fingerprint: hash, run_id: id, created_at: run.created_at },
            since,
            pendingSince: pendingSince(run.created_at),
          });
          try {
            const run = await create(tenantId, await requestNow(), id, after, key);
            // stored: the key now holds for its full day (not waited for: the claim already holds it for 30 s)
            void batch.call('key.expire', [slot], [IDEMPOTENCY_TTL_SECONDS]).catch(() => undefined);
            return { run, replayed: false };
          } catch (err) {
            if (!(err instanceof KeyHeld)) throw err;
            held = err.held; // taken by another request meanwhile: its run is the answer
            continue;
          }
        }
        // another request's record, its run still being stored
        if (held.fingerprint !== hash) throw keyReused();
        if (Date.now() >= until) throw keyInUse();
        await new Promise((r) => setTimeout(r, 20));
        held = await fromStore(() => store.idempotencyKeys.get(tenantId, keyDigest, since));
      }
    } catch (err) {
      await redis.eval(RELEASE_CLAIM, 1, slot, claim).catch(() => undefined);
      throw err;
    }
  }

  /** The request that made a run, so it can be made again. */
  function requestOf(run: Run): RunRequest {
    return {
      kind: run.kind,
      goal: run.goal,
      steps: run.plan,
      tool_allowlist: run.tool_allowlist,
      workspace: workspaceOf(run),
      budget_seconds: run.budget.seconds,
      max_steps: run.budget.max_steps,
      retry: run.retry,
      network: run.network,
      connections: run.connections,
      inputs: run.inputs,
      automation_id: run.automation_id,
      overlap: run.overlap,
      agent: run.agent ?? null,
      gates: run.gates,
      trigger: run.trigger,
    };
  }

  /** The run's workspace as the caller named it: relative to its tenant's root, never the server's path. */
  function workspaceOf(run: Pick<Run, 'workspace' | 'tenant_id'>): string {
    return path.relative(tenantRootPath(settings, run.tenant_id), run.workspace) || '.';
  }

  /** where the reconciler's last pass stopped reading, by status: a long line is read over several passes, every run in turn */
  const staleCursor: Record<'queued' | 'running', { created_at: string; id: string } | undefined> = { queued: undefined, running: undefined };

  /**
   * Runs of every tenant in `status` created before `before`, oldest first, a page at a time: at most
   * STALE_PER_PASS, from where the last pass stopped, and from the oldest again once the end is reached.
   */
  async function* staleRuns(status: 'queued' | 'running', before: string): AsyncGenerator<Run> {
    for (let read = 0; read < STALE_PER_PASS;) {
      const page = await store.runs.listStale(status, before, STALE_PAGE, staleCursor[status]);
      const last = page.at(-1);
      staleCursor[status] = page.length < STALE_PAGE || !last ? undefined : { created_at: last.created_at, id: last.id };
      yield* page;
      read += page.length;
      if (!staleCursor[status]) return;
    }
  }

  async function isCancelRequested(runId: string): Promise<boolean> {
    return (await batch.call<number>('key.exists', [cancelKey(prefix, runId)], [])) === 1;
  }

  return {
    create,
    createIdempotent,
    heldRun,
    /** Throws what `create` would refuse this request for, storing nothing (a caller about to pay for the request's input asks first). */
    assertAcceptable: async (tenantId: string, req: RunRequest): Promise<void> => void (await admitNew(tenantId, req)),
    assertRoom,
    workspaceOf,
    /** Registers a check of a finished run about to be re-run; it throws the problem that refuses it. */
    guardRerun(guard: (run: Run) => Promise<void>): void {
      rerunGuards.push(guard);
    },
    onRunFinished: transitions.onRunFinished,
    onRunStarted: transitions.onRunStarted,
    storeWithRun: transitions.storeWithRun,
    guardStart: transitions.guardStart,

    async get(tenantId: string, id: string): Promise<RunDetail> {
      const run = await mustGet(tenantId, id);
      const [steps, agent_turns] = await Promise.all([stepsOf(run), store.runs.turns(tenantId, id, run.attempt)]);
      return { ...run, steps, agent_turns };
    },

    list(tenantId: string, q: Omit<RunQuery, 'limit'> & { limit?: number }) {
      return store.runs.list(tenantId, { ...q, limit: q.limit ?? 20 });
    },

    /** The newest run of a run session. A session's events are its tenant's only: another tenant's session is a 404. */
    async sessionRun(tenantId: string, sessionId: string): Promise<Run> {
      const [newest] = (await store.runs.list(tenantId, { session_id: sessionId, limit: 1 })).items;
      if (!newest) throw new NotFoundError(`no run session ${sessionId}`);
      return newest;
    },

    /**
     * A new run of the same request as a finished one, linked to it; its own session. What a run came
     * from may refuse (an automation disabled or archived since); a session task's run is re-run by its
     * session, never on its own (it would run outside its DAG, under a session that does not list it).
     */
    async rerun(tenantId: string, id: string, key: string | undefined, requestId: string): Promise<{ run: Run; replayed: boolean }> {
      const first = await mustGet(tenantId, id);
      if (!isTerminal(first.status)) throw new ConflictError(`run ${id} is ${first.status}; re-run it once it has finished`, { status: first.status });
      if (first.kind === 'session_task')
        throw new ConflictError(
          `run ${id} is a task's run of session ${first.session_id}: its task retries up to its max_attempts; add a task to run it again`,
          {
            kind: first.kind,
          },
        );
      // checked only when the key is new: a retry answers the re-run it started, whatever changed since
      return createIdempotent(tenantId, key, { rerun_of: id }, async (): Promise<RunRequest> => {
        for (const guard of rerunGuards) await guard(first);
        return {
          ...requestOf(first),
          rerun_of: first.id,
          trigger: { type: 'rerun', run_id: first.id, request_id: requestId },
          request_id: requestId,
        };
      }).catch((err: unknown) => {
        // the request has no body: what the checks refuse is the run's state under today's settings (a workspace
        // gone since, a budget over a SERVICE_RUN_MAX_BUDGET_SECONDS lowered since), not a field of the request
        if (!(err instanceof ValidationError)) throw err;
        if (err.errors.some((e) => e.path === '/body/workspace'))
          throw new ConflictError(`run ${id}'s workspace ${workspaceOf(first)} is no longer a folder inside the workspace root: it cannot run there again`, {
            workspace: workspaceOf(first),
          });
        const fields = err.errors.map((e) => ({ field: e.path.replace(/^\/body\//, ''), message: e.message }));
        throw new ConflictError(`run ${id} cannot run again as it ran: ${fields.map((f) => `its ${f.field} ${f.message}`).join('; ')}`, { fields });
      });
    },

    /** Cancels a queued run at once (its summary `why`, when given); asks the worker running a run to stop it. */
    async cancel(tenantId: string, id: string, why?: string): Promise<Run> {
      let run = await mustGet(tenantId, id);
      const ended = (r: Run) => new ConflictError(`run ${id} is ${r.status} already`, { status: r.status });
      if (isTerminal(run.status)) throw ended(run);
      if (run.status === 'queued') {
        // a run after its first attempt waits for its next (a retry's backoff, a deploy): it did start
        const canceled = await transitions.cancel(run, why ?? (run.attempt > 1 ? CANCELED_BEFORE_NEXT_ATTEMPT : 'canceled before it started'));
        if (canceled) return canceled;
        // it moved meanwhile: another cancel ended it (this one is as late as one sent after it), or it started
        run = await mustGet(tenantId, id);
        if (isTerminal(run.status)) throw ended(run);
      }
      // running: the ask kept in the store first (a worker lost after it, its run repaired by the reconciler,
      // ends canceled, never retried, even if Redis loses its key meanwhile); then tell whichever worker holds
      // it; the key covers a worker that has not subscribed yet. Without Redis no worker can be told: a 503 the
      // client retries
      await transitions.askCancel(run);
      await redisOrUnavailable(redis, 'asking the worker to stop the run', async () => {
        await redis.set(cancelKey(prefix, id), '1', 'EX', 24 * 3600);
        await redis.publish(CANCEL_CHANNEL(prefix), id);
      });
      const now = await mustGet(tenantId, id);
      // it ended on its own meanwhile: the cancel came too late, as for a run found ended above
      if (isTerminal(now.status) && now.status !== 'canceled') throw ended(now);
      // its attempt settled meanwhile and it waits for its next: canceled there, never retried, its slot freed
      if (now.status === 'queued') return (await transitions.cancel(now, CANCELED_BEFORE_NEXT_ATTEMPT)) ?? (await mustGet(tenantId, id));
      return now;
    },

    /**
     * Budget and concurrency hints for a tenant: what the studio shows before a run starts. Only the tenant's
     * own figures and the deployment's settings: the queues' depths count the jobs of every tenant, and would
     * tell one how busy the others are (operators read them on /metrics and /admin/queues).
     */
    async reliabilityContext(tenantId: string) {
      const suggested: Record<string, number> = {};
      for (const kind of ['autonomy', 'vibe', 'automation'] as const) {
        // runs that started and ran to their end or their budget (the store's recentDurations): one canceled
        // before it started lasted 0 ms, which would bring the suggestion down to its floor
        const recent = await store.runs.recentDurations(tenantId, kind, 50);
        suggested[kind] = recent.length
          ? Math.min(limits.maxBudgetSeconds, Math.max(30, Math.ceil((percentile(recent, 95) * 1.5) / 1000)))
          : limits.defaultBudgetSeconds;
      }
      // the workers and the tenant's line live in Redis: without it, a 503 rather than a request held for the outage
      return redisOrUnavailable(redis, 'reading the workers and the tenant slots', async () => {
        const workers = await queues.get('runs').getWorkersCount();
        return {
          budget: { default_seconds: limits.defaultBudgetSeconds, max_seconds: limits.maxBudgetSeconds, suggested_seconds: suggested },
          workers: { count: workers, concurrency_per_worker: settings.workerConcurrency },
          tenant: { max_running: slots.limit, max_waiting: slots.maxWaiting, running: await slots.running(tenantId), waiting: await slots.waiting(tenantId) },
        };
      });
    },

    /** Offers a queued run to the workers now: its job, delayed because a guard held it (its session was paused), is promoted. */
    offerNow: transitions.offerNow,

    /** Removes the scratch copies, checkouts and checkouts' temp folders that attempts of a process that died left (a worker's start asks); how many went. */
    sweepLeftovers: async () =>
      (await sweepTemp()) +
      (await sweepLeftovers(
        settings,
        async (tenantId, runId) => (await store.runs.get(tenantId, runId))?.status ?? null,
        // in the sandbox, the folder bound as its workspace: a link a step swapped in leads nowhere outside it (as the
        // checkout's own folder is made)
        (dir, parent, name) => removeInSandbox(deps.sandbox, dir, parent, name, settings.childEnv.PATH),
      )),

    isCancelRequested,
    /** which runs the live worker processes are executing (each process beats its own list) */
    claims,

    cancelChannel: CANCEL_CHANNEL(prefix),

    /**
     * Repairs what crashes and lost jobs leave, so no run is stuck: a running run whose job is gone,
     * failed or completed (its worker died, or Redis lost it) is lost (failed worker-lost, or retried by
     * its policy), unless a live worker process claims it (runs.claims: that process is still running
     * it), when its slot is given back if Redis lost it; then a queued run whose job is gone, failed or
     * completed goes back in line; a tenant slot held by a run that ended before the window, or no
     * longer exists, is freed. `isExecuting` tells the runs this process is executing right now, which
     * are never touched. Every stale run is looked at in turn, however long a tenant's line: a pass
     * reads up to STALE_PER_PASS of each status and the next goes on from there.
     */
    async reconcile(opts: { olderThanMs?: number; isExecuting?: (runId: string) => boolean } = {}): Promise<{ requeued: number; lost: number; freed: number }> {
      const before = new Date(clock.now().getTime() - (opts.olderThanMs ?? 10_000)).toISOString();
      const queue = queues.get('runs');
      let requeued = 0;
      let lost = 0;
      const [elsewhere, lines] = await Promise.all([claims.elsewhere(), slots.holders()]);
      const admitted = (run: Run) => lines.get(run.tenant_id)?.admitted.has(run.id) ?? false;
      /** a run that may be running somewhere keeps its slot, or gets it back when Redis lost it */
      // a running run's slot, given back unless it holds it: read again first, since the list is a snapshot and a run
      // that ended since (its end gave its slot back) would hold one again for a pass or two
      const keepSlot = async (run: Run) => {
        if (admitted(run)) return;
        const now = await store.runs.get(run.tenant_id, run.id);
        if (now?.status === 'running' && now.attempt === run.attempt) await slots.restore(run.tenant_id, run.id);
      };
      // running runs first: one still running somewhere has its slot back before a queued run is admitted
      for await (const run of staleRuns('running', before)) {
        if (opts.isExecuting?.(run.id) || elsewhere?.has(run.id)) {
          await keepSlot(run);
          continue;
        }
        const job = await queue.getJob(jobIdOfRun(run, run.attempt));
        const state = job ? await job.getState() : 'missing';
        // unknown: its hash is in no list of the queue (Redis evicted the list, or lost part of its data): nothing will run it
        if (state !== 'missing' && state !== 'failed' && state !== 'completed' && state !== 'unknown') {
          if (state === 'active') await keepSlot(run);
          continue;
        }
        // the registry of claims is incomplete (just made, or made again after Redis lost its data): the
        // run may be running somewhere, so it is judged at a later pass
        if (elsewhere === null) {
          await keepSlot(run);
          continue;
        }
        const why = `the run's job was ${state === 'missing' || state === 'unknown' ? 'lost' : state} while the run was running`;
        if (await transitions.lose(run, why, await isCancelRequested(run.id).catch(() => false))) lost++;
      }
      for await (const run of staleRuns('queued', before)) {
        // in its tenant's line: its job is made when a slot frees
        if (lines.get(run.tenant_id)?.waiting.has(run.id)) continue;
        const job = await queue.getJob(jobIdOfRun(run, run.attempt));
        if (job) {
          const state = await job.getState();
          if (state === 'failed') {
            await job.retry('failed');
            requeued++;
            continue;
          }
          // waiting, delayed, active, prioritized: on its way; unknown (in no list of the queue) never will be
          if (state !== 'completed' && state !== 'unknown') continue;
        }
        // the list is a snapshot: a worker may have taken the run since (its job then completed, or was
        // already trimmed away with the completed ones), and a run that moved on is not queued again
        const current = await store.runs.get(run.tenant_id, run.id);
        if (current?.status !== 'queued' || current.attempt !== run.attempt) continue;
        await job?.remove();
        await transitions.toldQueued(current);
        if (admitted(run)) await transitions.enqueue(run);
        else await transitions.admit(run);
        requeued++;
      }
      let freed = 0;
      for (const [tenantId, line] of lines) {
        const runIds = [...new Set([...line.admitted, ...line.waiting])];
        // read by the page, status and end only: a tenant's backlog may hold many thousand runs
        for (let i = 0; i < runIds.length; i += HOLDERS_PAGE) {
          const page = runIds.slice(i, i + HOLDERS_PAGE);
          const found = new Map((await store.runs.statusOf(tenantId, page)).map((r) => [r.id, r]));
          for (const runId of page) {
            const run = found.get(runId);
            // a run that ended within the window is being released by its own transition, in its end's round trip
            if (run && (!isTerminal(run.status) || (run.finished_at ?? '') > before)) continue;
            await transitions.release(tenantId, runId);
            freed++;
          }
        }
      }
      // the store's idempotency keys past their day (Redis's expire by themselves): a page at a time until
      // none is left, within a bound, so a pass keeps up with any rate of keyed runs and is never held long
      const expired = new Date(clock.now().getTime() - IDEMPOTENCY_TTL_SECONDS * 1000).toISOString();
      await pruneInPages((limit) => store.idempotencyKeys.prune(expired, limit));
      // runs made and ended more than SERVICE_RUNS_KEPT_DAYS ago, with their steps, turns and own session: by id,
      // which is the time it was made (a run still queued or running then is kept its days after it ends); a
      // session task's runs stay with their session (a task waiting for an answer continues its run's conversation)
      if (settings.runsKeptDays) {
        // never before its Idempotency-Key's day is over, with an hour to spare (SERVICE_RUNS_KEPT_DAYS=1): a key
        // Redis still held for a run deleted would answer its retries "still being handled" until it lapsed
        const cutoff = clock.now().getTime() - Math.max(settings.runsKeptDays * 86_400_000, IDEMPOTENCY_TTL_SECONDS * 1000 + 3_600_000);
        // (days that reach back before 1970, as SERVICE_RUNS_KEPT_DAYS may, leave nothing to delete: no id is made there)
        if (cutoff > 0) await pruneInPages((limit) => store.runs.prune(idBefore('run', cutoff), new Date(cutoff).toISOString(), limit));
      }
      if (requeued || lost || freed) log.warn({ requeued, lost, freed }, 'reconciler repaired runs');
      return { requeued, lost, freed };
    },
  };
}

export type Runs = ReturnType<typeof runsOf>;
