// Runs: one execution of work, of any kind. A run is written `queued` before its job exists (the
// outbox); the tenant's slots decide whether its job is added now or when a slot frees; the
// reconciler re-admits queued runs that lost their job and fails running runs whose worker died.
import { createHash } from 'node:crypto';
import {
  AgentNotConfiguredError,
  ConflictError,
  IdempotencyKeyReusedError,
  NotFoundError,
  ValidationError,
  type FieldError,
  newId,
  jobIdOfRun,
  type Queues,
  percentile,
} from '../platform/index.js';
import type { Platform } from '../deps.js';
import type { AgentEndpoint } from './agent.js';
import type { TenantSlots } from './concurrency.js';
import { DEFAULT_AGENT_TOOLS, TERMINAL_RUN_STATUSES, type Run, type RunKind, type RunTrigger, type Step, type StepRecord } from '../store/index.js';
import { resolveWorkspace } from './workspace.js';

export type RunRequest = {
  kind: RunKind;
  goal?: string | null;
  steps?: Step[] | null;
  tool_allowlist?: string[];
  workspace?: string;
  budget_seconds?: number;
  max_steps?: number;
  inputs?: Record<string, unknown>;
  automation_id?: string | null;
  session_id?: string;
  trigger: RunTrigger;
  request_id?: string;
};

export const runScope = (sessionId: string) => `session:${sessionId}`;
const CANCEL_CHANNEL = (prefix: string) => `${prefix}:run-cancel`;
const cancelKey = (prefix: string, runId: string) => `${prefix}:run-cancel:${runId}`;
const IDEMPOTENCY_TTL_SECONDS = 24 * 3600;

export async function enqueueRun(queues: Queues, run: Pick<Run, 'id' | 'tenant_id' | 'request_id'>): Promise<void> {
  await queues
    .get('runs')
    .add(
      'run',
      { run_id: run.id, tenant_id: run.tenant_id, request_id: run.request_id },
      { jobId: jobIdOfRun(run.id), removeOnComplete: { count: 1000 }, removeOnFail: { count: 5000 } },
    );
}

/** Appends an event about a run to its session's log: the one way run events are written. */
export type RunLimits = { defaultBudgetSeconds: number; maxBudgetSeconds: number };

export type RunSettings = {
  workspaceRoot: string;
  agent: AgentEndpoint | undefined;
  childEnv: Record<string, string>;
  httpAllowPrivate: boolean;
  workerConcurrency: number;
};

export type RunsDeps = Pick<Platform, 'store' | 'clock' | 'log' | 'events' | 'queues' | 'redis' | 'metrics'> & {
  slots: TenantSlots;
  limits: RunLimits;
  settings: RunSettings;
};

export function appendRunEvent(events: Platform['events'], run: Pick<Run, 'id' | 'tenant_id' | 'session_id'>, type: string, data: Record<string, unknown>) {
  return events.append(runScope(run.session_id), { type, tenant_id: run.tenant_id, session_id: run.session_id, run_id: run.id, data });
}

export function runsOf(deps: RunsDeps) {
  const { store, clock, log, limits, events, slots, queues, redis, settings } = deps;
  const prefix = queues.prefix;

  /** Puts the run in line: its job now, or in its tenant's list until a slot frees. */
  async function admit(run: Run): Promise<void> {
    if (await slots.admit(run.tenant_id, run.id)) await enqueueRun(queues, run);
  }

  /** Frees a finished run's slot and sends the runs admitted in its place to the queue. */
  async function release(tenantId: string, runId: string): Promise<void> {
    for (const next of await slots.release(tenantId, runId)) {
      const run = await store.runs.get(tenantId, next);
      if (run?.status === 'queued') await enqueueRun(queues, run);
      else await release(tenantId, next);
    }
  }

  async function create(tenantId: string, req: RunRequest, id = newId('run')): Promise<Run> {
    const errors: FieldError[] = [];
    const steps = req.steps?.length ? req.steps : null;
    const goal = req.goal?.trim() ? req.goal : null;
    if (!steps && !goal) errors.push({ path: '/body', message: 'give the work to do: non-empty steps, or a goal for the agent' });
    const seconds = req.budget_seconds ?? limits.defaultBudgetSeconds;
    if (seconds > limits.maxBudgetSeconds)
      errors.push({ path: '/body/budget_seconds', message: `must be at most ${limits.maxBudgetSeconds} (SERVICE_RUN_MAX_BUDGET_SECONDS)` });
    if (errors.length) throw new ValidationError(errors.map((e) => `${e.path}: ${e.message}`).join('; '), errors);
    if (!steps && !settings.agent) {
      throw new AgentNotConfiguredError(
        'this run names a goal and no steps, and no agent endpoint is configured (SERVICE_AGENT_BASE_URL, SERVICE_AGENT_MODEL)',
      );
    }
    const workspace = await resolveWorkspace(settings.workspaceRoot, req.workspace);
    const now = clock.now().toISOString();
    const planned: StepRecord[] = (steps ?? []).map((s, index) => ({
      index,
      name: s.name ?? null,
      tool: s.tool,
      args: s.args ?? {},
      status: 'pending',
      source: 'plan',
      started_at: null,
      finished_at: null,
      duration_ms: null,
      output: null,
      error: null,
    }));
    const run: Run = {
      id,
      tenant_id: tenantId,
      kind: req.kind,
      status: 'queued',
      session_id: req.session_id ?? newId('ses'),
      automation_id: req.automation_id ?? null,
      trigger: req.trigger,
      goal,
      steps: planned,
      tool_allowlist: req.tool_allowlist ?? (steps ? [...new Set(steps.map((s) => s.tool))] : [...DEFAULT_AGENT_TOOLS]),
      workspace,
      budget: req.max_steps === undefined ? { seconds } : { seconds, max_steps: req.max_steps },
      usage: { steps: 0, model_turns: 0, seconds: 0 },
      inputs: req.inputs ?? {},
      agent_turns: [],
      summary: null,
      error: null,
      result: null,
      idempotency_key: null,
      request_id: req.request_id ?? null,
      created_at: now,
      started_at: null,
      finished_at: null,
      duration_ms: null,
    };
    await store.runs.insert(run);
    // run.queued is in the log before the job exists, so it always precedes run.started
    const [, admitted] = await Promise.all([
      appendRunEvent(events, run, 'run.queued', { kind: run.kind, trigger: run.trigger }),
      slots.admit(run.tenant_id, run.id),
    ]);
    if (admitted) await enqueueRun(queues, run);
    log.info({ tenant_id: tenantId, run_id: run.id, kind: run.kind, request_id: run.request_id }, 'run queued');
    return run;
  }

  async function mustGet(tenantId: string, id: string): Promise<Run> {
    const run = await store.runs.get(tenantId, id);
    if (!run) throw new NotFoundError(`no run ${id}`);
    return run;
  }

  return {
    create,
    get: mustGet,
    release,

    /** A session's events are its tenant's only: another tenant's session is a 404. */
    async assertSession(tenantId: string, sessionId: string): Promise<void> {
      const owned = await store.runs.listBySession(tenantId, sessionId, { limit: 1 });
      if (!owned.items.length) throw new NotFoundError(`no run session ${sessionId}`);
    },

    /**
     * Creates the run once per Idempotency-Key: the same key with the same request answers the same
     * run; with another request it is refused. Keys live 24 hours.
     */
    async createIdempotent(tenantId: string, key: string | undefined, fingerprint: unknown, req: RunRequest): Promise<{ run: Run; replayed: boolean }> {
      if (!key) return { run: await create(tenantId, req), replayed: false };
      const hash = createHash('sha256').update(JSON.stringify(fingerprint)).digest('hex');
      const slot = `${prefix}:idempotency:${tenantId}:${createHash('sha256').update(key).digest('hex')}`;
      const id = newId('run');
      const won = await redis.set(slot, JSON.stringify({ hash, run_id: id }), 'EX', IDEMPOTENCY_TTL_SECONDS, 'NX');
      if (won) {
        try {
          return { run: await create(tenantId, req, id), replayed: false };
        } catch (err) {
          await redis.del(slot);
          throw err;
        }
      }
      const held = JSON.parse((await redis.get(slot)) ?? '{}') as { hash?: string; run_id?: string };
      if (held.hash !== hash) throw new IdempotencyKeyReusedError('this Idempotency-Key was used with a different request');
      for (let i = 0; i < 50; i++) {
        const run = await store.runs.get(tenantId, held.run_id!);
        if (run) return { run, replayed: true };
        await new Promise((r) => setTimeout(r, 20)); // the first request is still writing it
      }
      throw new ConflictError('a request with this Idempotency-Key is still being handled; retry');
    },

    /** Cancels a queued run at once; asks the worker running a run to stop it. */
    async cancel(tenantId: string, id: string): Promise<Run> {
      const run = await mustGet(tenantId, id);
      if (TERMINAL_RUN_STATUSES.includes(run.status)) throw new ConflictError(`run ${id} is ${run.status} already`, { status: run.status });
      const now = clock.now();
      const canceled = await store.runs.update(
        tenantId,
        id,
        {
          status: 'canceled',
          finished_at: now.toISOString(),
          duration_ms: 0,
          error: { code: 'canceled', message: 'canceled before it started' },
          summary: 'canceled before it started',
        },
        ['queued'],
      );
      if (canceled) {
        await queues
          .get('runs')
          .remove(jobIdOfRun(id))
          .catch(() => 0);
        await release(tenantId, id);
        await appendRunEvent(events, run, 'run.finished', { status: 'canceled', summary: canceled.summary, error: canceled.error });
        return canceled;
      }
      // running: tell whichever worker holds it; the key covers a worker that has not subscribed yet
      await redis.set(cancelKey(prefix, id), '1', 'EX', 24 * 3600);
      await redis.publish(CANCEL_CHANNEL(prefix), id);
      return mustGet(tenantId, id);
    },

    /** Budget and concurrency hints for a tenant: what the studio shows before a run starts. */
    async reliabilityContext(tenantId: string) {
      const suggested: Record<string, number> = {};
      for (const kind of ['autonomy', 'vibe', 'automation'] as const) {
        const recent = await store.runs.recentDurations(tenantId, kind, 50);
        suggested[kind] = recent.length
          ? Math.min(limits.maxBudgetSeconds, Math.max(30, Math.ceil((percentile(recent, 95) * 1.5) / 1000)))
          : limits.defaultBudgetSeconds;
      }
      const queueDepths: Record<string, Record<string, number>> = {};
      for (const q of queues.all()) queueDepths[q.name] = await q.getJobCounts('waiting', 'active', 'delayed', 'prioritized', 'failed', 'completed');
      const workers = await queues.get('runs').getWorkersCount();
      return {
        budget: { default_seconds: limits.defaultBudgetSeconds, max_seconds: limits.maxBudgetSeconds, suggested_seconds: suggested },
        workers: { count: workers, concurrency_per_worker: settings.workerConcurrency },
        tenant: { max_running: slots.limit, running: await slots.running(tenantId), waiting: await slots.waiting(tenantId) },
        queues: queueDepths,
      };
    },

    async isCancelRequested(runId: string): Promise<boolean> {
      return (await redis.exists(cancelKey(prefix, runId))) === 1;
    },

    cancelChannel: CANCEL_CHANNEL(prefix),

    /**
     * Recovers from lost writes: a queued run with no job and no place in line goes back in line; a
     * running run whose job is gone (Redis lost it) ends failed with worker-lost.
     */
    async reconcile(olderThanMs = 10_000): Promise<{ requeued: number; lost: number }> {
      const before = new Date(clock.now().getTime() - olderThanMs).toISOString();
      const queue = queues.get('runs');
      let requeued = 0;
      let lost = 0;
      for (const run of await store.runs.listStale('queued', before, 500)) {
        if (await queue.getJob(jobIdOfRun(run.id))) continue;
        if (await slots.isWaiting(run.tenant_id, run.id)) continue;
        if (await slots.isAdmitted(run.tenant_id, run.id)) await enqueueRun(queues, run);
        else await admit(run);
        requeued++;
      }
      for (const run of await store.runs.listStale('running', before, 500)) {
        const overdue = new Date(run.started_at ?? run.created_at).getTime() + run.budget.seconds * 1000 + 60_000 < clock.now().getTime();
        if (!overdue || (await queue.getJob(jobIdOfRun(run.id)))) continue;
        const failed = await store.runs.update(
          run.tenant_id,
          run.id,
          {
            status: 'failed',
            finished_at: clock.now().toISOString(),
            error: { code: 'worker-lost', message: 'the run’s job was lost' },
            summary: 'failed: worker lost',
          },
          ['running'],
        );
        if (failed) {
          await appendRunEvent(events, run, 'run.finished', { status: 'failed', error: failed.error });
          await release(run.tenant_id, run.id);
          lost++;
        }
      }
      if (requeued || lost) log.warn({ requeued, lost }, 'reconciler repaired runs');
      return { requeued, lost };
    },
  };
}

export type Runs = ReturnType<typeof runsOf>;
