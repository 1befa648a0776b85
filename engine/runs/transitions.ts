// The only code that changes a run's status. Each transition is one conditional update in the store
// (the status, and the attempt, it expects), and when it applies it appends one typed event, records
// metrics, moves the tenant slot and, when the run has ended, calls the "run finished" hooks that
// sessions, gates and audits register. A transition that does not apply changes nothing.
//
//   queued  --start-->      running
//   running --finish-->     succeeded | failed | timed_out | canceled      (or queued again: a retry)
//   queued  --cancel-->     canceled
//   running --lose-->       failed (worker-lost)                           (or queued again: a retry)
//   running --interrupt-->  queued (attempt + 1): a deploy is not a failure
import type { Platform } from '../deps.js';
import {
  afterStored,
  EVENT_VALUE_MAX_BYTES,
  jobIdOfRun,
  REDIS_DEADLINE_MS,
  ServiceUnavailableError,
  untilTaken,
  withTimeout,
  type AttemptRecord,
  type ErrorInfo,
  type EventBody,
  type NewEvent,
  type Run,
  type RunStatus,
  type ServiceEvent,
  type StepRecord,
} from '../platform/index.js';
import type { IdempotencyRecord, KeyClaim } from '../store/index.js';
import type { TenantSlots } from './concurrency.js';
import { policyCovers, retryDelayMs } from './retry.js';

/** How long run creation waits for Redis before answering 202 on the strength of the store alone. */
export { REDIS_DEADLINE_MS };
export const STORE_RETRY_AFTER_SECONDS = 5;

export type RunFinishedHook = (run: Run) => Promise<void>;

/** Stores a record that goes with a new run (its run session): asked for with the run's own insert, so one commit holds both. */
export type RunCompanion = (run: Run) => Promise<void>;

/** Records what follows from one new run once it is stored (its task's move to `queued`), while the run is put in line. */
export type AfterStored = (run: Run) => Promise<void>;

/** A new run not stored: another request's record holds its Idempotency-Key (`RunRepo.insert`). */
export class KeyHeld extends Error {
  constructor(readonly held: IdempotencyRecord) {
    super(`the Idempotency-Key is held by run ${held.run_id}`);
  }
}

/**
 * What a check made before a run starts says: start it (null); refuse it, which cancels it (a session
 * task that already ended); or hold it, which leaves it queued, to be offered to a worker again later (a
 * task of a paused session).
 */
export type StartVerdict = null | { refuse: string } | { hold: string };
export type StartGuard = (run: Run) => Promise<StartVerdict>;

/** A run a guard held: still queued, its job to be tried again (the executor delays it). */
export type Held = { held: string };

/** How an attempt ended, as the executor saw it. */
export type Outcome = {
  status: Extract<RunStatus, 'succeeded' | 'failed' | 'timed_out' | 'canceled'>;
  error: ErrorInfo | null;
  summary: string | null;
  result?: Run['result'];
  usage?: Run['usage'];
};

/** What a transition left the run as: ended, queued again for another attempt, or not applied. */
export type Settled = { run: Run; next: 'ended' | 'retry' | 'interrupted' | 'held' } | null;

export type TransitionsDeps = Pick<Platform, 'store' | 'clock' | 'log' | 'events' | 'metrics' | 'queues'> & {
  slots: TenantSlots;
  /** the bytes of step output a tenant's runs stream into the event log a day (absent: no bound) */
  limits?: { tenantOutputBytesPerDay?: number; runLostReruns?: number };
};

/** A tenant's day of streamed output is counted by the UTC day; its counter outlives the day by one. */
const OUTPUT_BUDGET_TTL_SECONDS = 2 * 24 * 3600;
const OUTPUT_BUDGET_NOTICE =
  "\n[the output and messages that follow are not streamed: this tenant's runs streamed SERVICE_TENANT_OUTPUT_MB_PER_DAY today (UTC); each step's record keeps its last 64 KB of output, and its messages whole]\n";

export const sessionStream = (sessionId: string) => `session:${sessionId}`;

/**
 * A vibe run's changed paths as its end tells them: the first whose JSON fits EVENT_VALUE_MAX_BYTES, whole (a
 * path is a name to act on: never cut, as forEvent cuts a value), and whether more changed.
 */
function changedFilesTold(all: string[], cut = false): { changed_files: string[]; changed_files_truncated?: true } {
  let n = 0;
  for (let bytes = 2; n < all.length && (bytes += Buffer.byteLength(JSON.stringify(all[n])) + 1) <= EVENT_VALUE_MAX_BYTES; n++);
  const told = all.slice(0, n);
  return n < all.length || cut ? { changed_files: told, changed_files_truncated: true } : { changed_files: told };
}

/** How many of a session's latest events a run's end told again is looked for among (it was its run's last, or near). */
const TOLD_AGAIN_LOOKBACK = 500;

export function transitionsOf(deps: TransitionsDeps) {
  const { store, clock, log, events, metrics, queues, slots } = deps;
  const hooks: RunFinishedHook[] = [];
  /** the finished hooks that may run again (what they change, they change once): see finishedAgain */
  const repeatable: RunFinishedHook[] = [];
  const startHooks: RunFinishedHook[] = [];
  const guards: StartGuard[] = [];
  /** which runs a guard may hold: those give their tenant slot back while held, and take one again to start */
  const holdable: ((run: Run) => boolean)[] = [];
  const companions: RunCompanion[] = [];

  const outputPerDay = deps.limits?.tenantOutputBytesPerDay;
  /**
   * The text of an event whose size a run's own work makes without bound (a step's output, a message's text),
   * spent from the tenant's day; with the notice that takes its place once the day is spent. The other events
   * of a run's work carry a bounded start of what they tell (attempt.ts, forEvent).
   */
  const budgeted = (event: NewEvent, body: EventBody): { text: string; notice: NewEvent } | null => {
    if (body.type === 'step.output')
      return { text: body.data.text, notice: { ...event, type: 'step.output', data: { ...body.data, text: OUTPUT_BUDGET_NOTICE } } };
    if (body.type === 'message.created')
      return {
        text: body.data.text,
        notice: { ...event, type: 'message.created', data: { role: 'system', text: OUTPUT_BUDGET_NOTICE.trim(), step: body.data.step } },
      };
    return null;
  };
  const emit = (run: Pick<Run, 'id' | 'tenant_id' | 'session_id'>, body: EventBody) => {
    const event = { tenant_id: run.tenant_id, session_id: run.session_id, run_id: run.id, ...body };
    const spending = outputPerDay === undefined ? null : budgeted(event, body);
    if (!spending || outputPerDay === undefined) return events.append(sessionStream(run.session_id), event);
    // the event log lives in the shared Redis: what a run's work sizes spends the tenant's day of it
    const { text, notice } = spending;
    return events.appendWithin(sessionStream(run.session_id), event, {
      name: `output:${run.tenant_id}:${clock.now().toISOString().slice(0, 10)}`,
      // as the log keeps it: JSON, where a control character takes six bytes
      bytes: Buffer.byteLength(JSON.stringify(text)),
      limit: outputPerDay,
      ttlSeconds: OUTPUT_BUDGET_TTL_SECONDS,
      notice,
    });
  };

  /** Per run, its events that Redis refused at first and that are being tried again: its later events wait behind them. */
  const backlog = new Map<string, Promise<void>>();
  const behind = (runId: string, next: Promise<void>) => {
    backlog.set(runId, next);
    void next.finally(() => backlog.get(runId) === next && backlog.delete(runId));
  };

  /**
   * An event of a run, its transitions' and its steps'. Redis not taking it does not undo what it tells,
   * and must not lose it (a stream would wait for good for a `run.finished` never written) or let a later
   * one pass it (a `run.started` after its `run.finished`): it is tried again in the background, with
   * backoff, for about five minutes, and the run's events asked for meanwhile follow it, in order. Settles
   * after the first try (at once for an event that waits behind another), never rejected.
   */
  const emitInOrder = (run: Pick<Run, 'id' | 'tenant_id' | 'session_id'>, body: EventBody): Promise<void> => {
    const about = { run_id: run.id, what: body.type };
    const waiting = backlog.get(run.id);
    if (waiting) {
      behind(
        run.id,
        waiting.then(() => untilTaken(() => emit(run, body), log, about, true)),
      );
      return Promise.resolve();
    }
    return emit(run, body).then(
      () => undefined,
      (err: Error) => {
        log.warn({ ...about, err: err.message }, 'Redis did not take an event of a run; trying again, its later events after it');
        // another event of the run refused in the same round trip went first: this one follows it
        behind(
          run.id,
          (backlog.get(run.id) ?? Promise.resolve()).then(() => untilTaken(() => emit(run, body), log, about, false)),
        );
      },
    );
  };

  /**
   * Redis work that follows a committed transition, other than its events (emitInOrder): the release of
   * its slot. Tried now, and if Redis does not take it, again in the background with backoff for about five
   * minutes (untilTaken). The returned promise settles after the first try, never rejected.
   */
  function persist(work: () => Promise<unknown>, about: { run_id: string; what: string }): Promise<void> {
    return work().then(
      () => undefined,
      (err: Error) => {
        log.warn({ ...about, err: err.message }, 'Redis did not take the work of a committed transition; trying again');
        void untilTaken(work, log, about, false);
      },
    );
  }

  /** Adds the job of a run's current attempt; adding it twice is a no-op (the job id is deterministic). */
  async function enqueue(run: Pick<Run, 'id' | 'tenant_id' | 'request_id' | 'attempt' | 'session_id' | 'trigger'>, delayMs = 0): Promise<void> {
    await queues.get('runs').add(
      'run',
      { run_id: run.id, tenant_id: run.tenant_id, attempt: run.attempt, request_id: run.request_id },
      {
        jobId: jobIdOfRun(run, run.attempt),
        delay: delayMs,
        // infrastructure errors (the store or Redis briefly away) are retried; a run's own failure is not
        attempts: 5,
        backoff: { type: 'exponential', delay: 1000 },
        removeOnComplete: { count: 1000 },
        removeOnFail: { count: 5000 },
      },
    );
  }

  /**
   * What Redis refused of a new run, tried again in the background until it takes it (untilTaken, about five
   * minutes; past that the reconciler's): its run.queued `event`, before its job; then its place in line when
   * `admitted` is not known (the admission was refused; admitting again is a no-op), or its job when it was admitted.
   */
  function refused(run: Run, err: Error, event: EventBody | null, admitted?: boolean): void {
    log.warn({ run_id: run.id, err: err.message }, 'Redis refused a part of a new run; trying again');
    void (async () => {
      if (event) await untilTaken(() => emit(run, event), log, { run_id: run.id, what: event.type }, false);
      if (admitted === false) return;
      await untilTaken(() => (admitted ? enqueue(run) : admit(run)), log, { run_id: run.id, what: 'its place in line' }, Boolean(event));
    })();
  }

  /** Puts a queued run in line: its job now, or in its tenant's list until a slot frees. */
  async function admit(run: Run): Promise<void> {
    if (await slots.admit(run.tenant_id, run.id)) await enqueue(run);
  }

  /** Frees a run's slot and sends the runs admitted in its place to the queue. */
  async function release(tenantId: string, runId: string): Promise<void> {
    const { admitted, parked } = await slots.release(tenantId, runId);
    for (const next of [...admitted, ...parked]) {
      const run = await store.runs.get(tenantId, next);
      if (run?.status !== 'queued') await release(tenantId, next);
      else if (parked.includes(next)) await offerNow(run);
      else await enqueue(run);
    }
  }

  /** Offers a queued run whose job waits, delayed (held at its start), to the workers now; its job again if it has none. */
  async function offerNow(run: Run): Promise<void> {
    const job = await queues.get('runs').getJob(jobIdOfRun(run, run.attempt));
    if (!job) return enqueue(run);
    // promoted by another process meanwhile, or taken by a worker: nothing to do
    if (await job.isDelayed()) await job.promote().catch(() => undefined);
  }

  /**
   * Whether a run whose attempt was cut off by a crash runs again, at once, as its next attempt (DESIGN: execution is at
   * least once): while it has been lost fewer than SERVICE_RUN_LOST_RERUNS times, so a run that takes its worker down
   * each time ends. A session task's run ends instead: its task runs again as its own next attempt (max_attempts).
   */
  const rerunsAfterLoss = (run: Run) =>
    run.kind !== 'session_task' && run.attempts.filter((a) => a.outcome === 'lost').length < (deps.limits?.runLostReruns ?? 0);

  /** the attempt follows one its retry policy retried, whose settling gave the run's slot back */
  const afterRetry = (run: Run) => run.attempt > 1 && run.attempts.at(-1)?.outcome !== 'interrupted';

  const elapsed = (run: Run, at: Date) => at.getTime() - new Date(run.started_at ?? run.created_at).getTime();

  /** the start of a run's first attempt that started (its own while it runs its first), or null: a run's span is from it */
  const firstStartOf = (run: Run): string | null => run.attempts.find((a) => a.started_at)?.started_at ?? run.started_at;

  /** `usage`: what the attempt used, kept with it when the run goes on to another attempt (which starts from nothing) */
  const attemptRecord = (
    run: Run,
    outcome: AttemptRecord['outcome'],
    status: RunStatus,
    error: ErrorInfo | null,
    at: Date,
    usage: Run['usage'],
  ): AttemptRecord => ({
    attempt: run.attempt,
    outcome,
    status,
    error,
    started_at: run.started_at,
    finished_at: at.toISOString(),
    duration_ms: run.started_at ? elapsed(run, at) : null,
    usage,
  });

  /**
   * Runs the hooks of a run's start or end, one after another; one that fails is logged and the rest
   * still run. Called in the turn the run's event is asked for: what they append follows that event in
   * the log (appends keep the order they are asked in), and their first Redis work and writes share
   * the run's round trip and commit instead of waiting for it.
   */
  async function runHooks(list: RunFinishedHook[], run: Run, what: string): Promise<void> {
    for (const hook of list) {
      try {
        await hook(run);
      } catch (err) {
        log.error({ err, run_id: run.id }, `a ${what} hook failed`);
      }
    }
  }

  /** What the end of a run tells. */
  const finishedEvent = (run: Run): EventBody => ({
    type: 'run.finished',
    data: {
      status: run.status,
      attempt: run.attempt,
      summary: run.summary,
      error: run.error,
      duration_ms: run.duration_ms,
      result: run.result?.changed_files ? changedFilesTold(run.result.changed_files, run.result.changed_files_truncated) : null,
    },
  });

  /** Who is offered a run's end told again (the notifications, whose deliveries of an event are made once). */
  let offerAgain: ((event: ServiceEvent) => Promise<unknown>) | null = null;

  /**
   * A run's end told again by a job delivered again: the process that stored it may have died before its event,
   * or between its event and what the event is offered to (its notifications' deliveries). The event is appended
   * when the run's log lacks it among its latest, else offered again.
   */
  async function toldAgain(run: Run): Promise<void> {
    const latest = await events.newestFirst(sessionStream(run.session_id), '0-0', '+', TOLD_AGAIN_LOOKBACK);
    const told = latest.find((e) => e.type === 'run.finished' && e.run_id === run.id && (e.data as { attempt?: number }).attempt === run.attempt);
    if (!told) await emitInOrder(run, finishedEvent(run));
    else await offerAgain?.(told);
  }

  const queuedEvent = (run: Run): EventBody => ({
    type: 'run.queued',
    data: { kind: run.kind, trigger: run.trigger, attempt: run.attempt, rerun_of: run.rerun_of },
  });

  /**
   * A new run the reconciler puts in line (it has no job): its `run.queued` is appended first when its log lacks it
   * among its latest events (its process died between storing the run and telling it, or Redis refused the event
   * for longer than its retries), so the log still says it was queued before it says it started.
   */
  async function toldQueued(run: Run): Promise<void> {
    if (run.attempt !== 1) return;
    const latest = await events.newestFirst(sessionStream(run.session_id), '0-0', '+', TOLD_AGAIN_LOOKBACK);
    if (!latest.some((e) => e.type === 'run.queued' && e.run_id === run.id)) await emitInOrder(run, queuedEvent(run));
  }

  /** The end of a run: event, metrics, slot, hooks. */
  async function ended(run: Run): Promise<void> {
    metrics.runDuration.observe({ kind: run.kind, status: run.status }, (run.duration_ms ?? 0) / 1000);
    metrics.runsFinished.inc({ kind: run.kind, status: run.status, reason: run.error?.code ?? 'none' });
    // the event and the slot in one round trip: both are asked for before either is waited for
    const told = Promise.all([emitInOrder(run, finishedEvent(run)), persist(() => release(run.tenant_id, run.id), { run_id: run.id, what: 'slot release' })]);
    log.info(
      { tenant_id: run.tenant_id, run_id: run.id, status: run.status, attempt: run.attempt, duration_ms: run.duration_ms, request_id: run.request_id },
      'run finished',
    );
    await Promise.all([told, runHooks(hooks, run, 'run-finished')]);
  }

  /**
   * An attempt that ended with `status`: the run ends, or (its retry policy says so) goes back to the
   * queue for its next attempt after a backoff. It gives its tenant slot back while it waits (a backoff is up
   * to 15 minutes, and ten flaky runs held a tenant's every slot with nothing running), and takes one again,
   * or its place in the tenant's line, when its next attempt's job comes (`start`).
   */
  async function settleAttempt(
    run: Run,
    status: Outcome['status'],
    changes: Partial<Run>,
    outcome: AttemptRecord['outcome'],
    steps: StepRecord[],
  ): Promise<Settled> {
    const at = clock.now();
    const error = changes.error ?? null;
    // a retry policy that covers the status decides alone (spent, the run ends); else a lost attempt may run again
    const delay = status === 'canceled' ? null : policyCovers(run, status) ? retryDelayMs(run, status) : outcome === 'lost' && rerunsAfterLoss(run) ? 0 : null;
    const retried =
      delay === null
        ? null
        : await store.runs.update(
            run.tenant_id,
            run.id,
            {
              status: 'queued',
              attempt: run.attempt + 1,
              attempts: [...run.attempts, attemptRecord(run, outcome === 'lost' ? 'lost' : 'retried', status, error, at, changes.usage ?? run.usage)],
              started_at: null,
              usage: { steps: 0, model_turns: 0, seconds: 0 },
              error,
              summary: null,
              result: null,
            },
            // only while no cancel was asked: one asked meanwhile ends the run canceled (below), it never runs again
            { status: ['running'], attempt: run.attempt, uncanceled: true },
            steps,
          );
    if (delay !== null && retried) {
      await emitInOrder(retried, { type: 'run.retrying', data: { attempt: run.attempt, next_attempt: retried.attempt, status, error, delay_ms: delay } });
      metrics.runsRetried.inc({ kind: run.kind, status });
      // freed before its job is added, so that an attempt due at once takes its slot again after, not before. Tried
      // once: a release tried again later could take the slot of the next attempt, running by then, and let the
      // tenant past its cap; one Redis refused keeps the slot through the backoff (the next attempt has it)
      await release(run.tenant_id, run.id).catch((err: Error) =>
        log.warn({ run_id: run.id, err: err.message }, 'a retried run keeps its slot through its backoff: Redis did not take its release'),
      );
      await enqueue(retried, delay);
      log.warn({ run_id: run.id, attempt: run.attempt, status, error_code: error?.code, delay_ms: delay }, 'run attempt failed; retrying');
      return { run: retried, next: 'retry' };
    }
    const end = (ending: RunStatus, more: Partial<Run>) =>
      store.runs.update(
        run.tenant_id,
        run.id,
        {
          ...changes,
          ...more,
          status: ending,
          ...(outcome === 'lost'
            ? { attempts: [...run.attempts, attemptRecord(run, 'lost', ending, more.error ?? error, at, changes.usage ?? run.usage)] }
            : {}),
          finished_at: at.toISOString(),
          // the run's span, over every attempt (each attempt's own is in `attempts`), as a cancel between two counts it
          started_at: firstStartOf(run),
          duration_ms: Math.max(0, at.getTime() - Date.parse(firstStartOf(run) ?? run.created_at)),
        },
        // any other end only while no cancel was asked: a cancel answered 202 while the attempt ran ends it canceled
        { status: ['running'], attempt: run.attempt, uncanceled: ending !== 'canceled' },
        steps,
      );
    let done = await end(status, {});
    if (!done && status !== 'canceled') {
      // a cancel asked (and answered 202) after the attempt's work ended, before this end was written: the end is
      // the cancel's, with what the attempt did kept (its steps, result and usage); its own end is in the summary
      const now = await store.runs.get(run.tenant_id, run.id);
      if (now?.status === 'running' && now.attempt === run.attempt && now.cancel_requested_at)
        done = await end('canceled', {
          error: { code: 'canceled', message: 'canceled while running' },
          summary: `canceled (its attempt had ended ${status.replace('_', ' ')})`,
        });
    }
    if (!done) return null;
    await ended(done);
    return { run: done, next: 'ended' };
  }

  const api = {
    /**
     * A new run: stored `queued` first (the outbox; a failure here is the caller's 503), with the
     * records that go with every run in the same commit; then its run.queued event and its place in line, and
     * beside them `after`, this run's own follow-up, which only a stored run gets. When Redis does not
     * answer within REDIS_DEADLINE_MS the run is still accepted: what is pending completes when Redis
     * returns, and the reconciler queues the run if it never does.
     */
    async queue(run: Run, after?: AfterStored, key?: KeyClaim): Promise<void> {
      const inserting = store.runs.insert(run, key);
      const records = () => companions.map((companion) => companion(run));
      // with a key the run may not be stored (KeyHeld): then its records must not be, so they wait for it (a commit later)
      const [stored, ...others] = await Promise.allSettled([
        inserting,
        ...(key ? [inserting.then((held) => (held ? undefined : Promise.all(records())))] : records()),
      ]);
      if (stored.status === 'rejected') {
        log.error({ err: stored.reason, run_id: run.id }, 'a run could not be stored');
        throw new ServiceUnavailableError('the store did not accept the run; retry shortly', STORE_RETRY_AFTER_SECONDS, { cause: stored.reason });
      }
      if (stored.value) throw new KeyHeld(stored.value);
      // the run stands without them: it runs, and what follows it (its session's status) finds nothing to move
      for (const other of others) if (other.status === 'rejected') log.error({ err: other.reason, run_id: run.id }, 'a record of the run was not stored');
      // run.queued is in the log before the job exists, so it always precedes run.started
      const queued = queuedEvent(run);
      const lined = Promise.allSettled([emit(run, queued), slots.admit(run.tenant_id, run.id)]).then(([told, placed]) => {
        if (told.status === 'fulfilled' && placed.status === 'fulfilled')
          return placed.value ? enqueue(run).catch((err: Error) => refused(run, err, null, true)) : undefined;
        // Redis answered with an error (a failover's READONLY, LOADING, OOM), not silence: what it refused is tried
        // again in the background, in order, rather than left to the reconciler's next pass
        const err = (told.status === 'rejected' ? told : (placed as PromiseRejectedResult)).reason as Error;
        refused(run, err, told.status === 'rejected' ? queued : null, placed.status === 'fulfilled' ? placed.value : undefined);
      });
      // as with the records above, the run stands (and its request succeeds) whatever becomes of this;
      // the caller waits for it if it needs to
      after?.(run).catch((err: unknown) => log.error({ err, run_id: run.id }, 'a record of the run was not stored'));
      try {
        await withTimeout(lined, REDIS_DEADLINE_MS, 'Redis answer');
      } catch (err) {
        lined.catch(() => undefined);
        log.warn({ run_id: run.id, err: (err as Error).message }, 'run stored but not yet in line: it is queued when Redis answers');
      }
    },
    enqueue,
    admit,
    toldQueued,
    release,
    offerNow,

    /**
     * Registers what to do when any run ends (sessions, gates and audits): once per run, with its event asked
     * for first. `repeatable`: the hook may run again for the same end (see finishedAgain).
     */
    onRunFinished(hook: RunFinishedHook, opts: { repeatable?: boolean } = {}): void {
      hooks.push(hook);
      if (opts.repeatable) repeatable.push(hook);
    },

    /**
     * The repeatable finished hooks of a run found ended by a job delivered again: the process that stored
     * its end may have died before its hooks ran (its job was not completed, so it stalled and came back).
     */
    async finishedAgain(run: Run): Promise<void> {
      await toldAgain(run).catch((err: Error) => log.warn({ run_id: run.id, err: err.message }, 'a run’s end was not told again'));
      await runHooks(repeatable, run, 'run-finished (again)');
    },

    /** Registers who is offered a run's end again when a job delivered again finds the run ended (toldAgain). */
    offerEndAgainTo(offer: (event: ServiceEvent) => Promise<unknown>): void {
      offerAgain = offer;
    },

    /** Registers a record stored with each new run (a run's session). */
    storeWithRun(companion: RunCompanion): void {
      companions.push(companion);
    },

    /** Registers what to do when an attempt of any run starts (a session task goes `running`). */
    onRunStarted(hook: RunFinishedHook): void {
      startHooks.push(hook);
    },

    /**
     * Registers a check made before an attempt starts; a run it refuses is canceled instead. `mayHold` names
     * the runs it may hold (for as long as their session is paused, say): a held run gives its tenant slot
     * back, so that the tenant's other runs are not kept waiting behind it, and takes one again (or its
     * place in the tenant's line) once it may start.
     */
    guardStart(guard: StartGuard, mayHold?: (run: Run) => boolean): void {
      guards.push(guard);
      if (mayHold) holdable.push(mayHold);
    },

    /**
     * queued -> running, for the attempt the job was made for; or queued -> canceled when a guard
     * refuses it (the fence of a session task that already ended: it never runs again); or nothing,
     * when a guard holds it (its session is paused).
     */
    async start(run: Run, sandbox: string | null): Promise<Run | Held | null> {
      for (const guard of guards) {
        const verdict = await guard(run);
        if (verdict && 'hold' in verdict) {
          await release(run.tenant_id, run.id);
          return { held: verdict.hold };
        }
        if (verdict) {
          log.warn({ run_id: run.id, reason: verdict.refuse }, 'run refused at start');
          await api.cancel(run, verdict.refuse);
          return null;
        }
      }
      // a run that may have been held, or that waited out a retry's backoff, gave its slot back: it has one
      // (admitted), takes a free one, or waits in its tenant's line, its job offered again later (a slot freed for
      // it finds the job there). One canceled meanwhile and put in line is let go when its turn comes: a release
      // passes over a run no longer queued. (An attempt after an interruption kept its slot: admitted already.)
      const admits = afterRetry(run) || holdable.some((may) => may(run));
      if (admits && !(await slots.admit(run.tenant_id, run.id, true))) return { held: 'waiting in its tenant’s line' };
      const at = clock.now();
      const started = await store.runs.update(
        run.tenant_id,
        run.id,
        { status: 'running', started_at: at.toISOString(), sandbox },
        { status: ['queued'], attempt: run.attempt },
      );
      if (!started) {
        // ended meanwhile (canceled, its session archived): the slot it took again goes back, as its end gave it. Not
        // when another process won the start of this attempt (its job delivered twice): the slot is that run's now,
        // and given back it let the next run of the tenant's line start beside it, over the tenant's limit
        const now = admits ? await store.runs.get(run.tenant_id, run.id) : null;
        if (admits && !(now?.status === 'running' && now.attempt === run.attempt)) await release(run.tenant_id, run.id);
        return null;
      }
      const queuedMs = Math.max(0, at.getTime() - new Date(run.attempts.at(-1)?.finished_at ?? run.created_at).getTime());
      metrics.runQueueWait.observe({ kind: run.kind }, queuedMs / 1000);
      // the event is asked for first, and not waited for: the attempt's steps, whose events follow it in the
      // log, start once the hooks have what they write (a session task's move), not a round trip later. Like
      // every event of a committed transition it is tried again until Redis takes it
      void emitInOrder(started, { type: 'run.started', data: { kind: run.kind, attempt: run.attempt, budget: run.budget, queued_ms: queuedMs, sandbox } });
      await runHooks(startHooks, started, 'run-started');
      return started;
    },

    /** running -> an end, or queued again when the retry policy asks for another attempt. */
    finish(run: Run, outcome: Outcome, steps: StepRecord[] = []): Promise<Settled> {
      const usage = outcome.usage ?? run.usage;
      const seconds = elapsed(run, clock.now()) / 1000;
      return settleAttempt(
        run,
        outcome.status,
        { error: outcome.error, summary: outcome.summary, result: outcome.result ?? run.result, usage: { ...usage, seconds } },
        'retried',
        steps,
      );
    },

    /**
     * running -> failed (worker-lost): the worker running it died, or its job was lost. Retried by
     * policy; or canceled, never retried, when a cancel was asked for before (the worker that would have
     * stopped it is gone). The steps it left running end failed with the attempt, and are counted.
     */
    async lose(run: Run, message: string, askedInRedis = false): Promise<Settled> {
      // a cancel asked of its attempt, as Redis says, or as the store kept it (Redis may have lost its key)
      const cancelRequested = askedInRedis || Boolean(run.cancel_requested_at);
      const at = clock.now();
      const error = cancelRequested ? { code: 'canceled', message: `canceled; ${message}` } : { code: 'worker-lost', message };
      const [recorded, turns] = await Promise.all([store.runs.steps(run.tenant_id, run.id, run.attempt), store.runs.turns(run.tenant_id, run.id, run.attempt)]);
      const cut = recorded
        .filter((s) => s.status === 'running')
        .map((s): StepRecord => ({
          ...s,
          status: 'failed',
          finished_at: at.toISOString(),
          duration_ms: s.started_at ? Math.max(0, at.getTime() - Date.parse(s.started_at)) : null,
          error,
        }));
      // the attempt's time is counted up to now, as an end written by its worker counts it; its steps and
      // model turns (tokens too) from what the attempt kept as it went (the run's own usage is written at its end)
      const usage: Run['usage'] = { ...run.usage, steps: recorded.length, model_turns: turns.length, seconds: elapsed(run, at) / 1000 };
      for (const t of turns) {
        if (t.usage?.prompt_tokens) usage.prompt_tokens = (usage.prompt_tokens ?? 0) + t.usage.prompt_tokens;
        if (t.usage?.completion_tokens) usage.completion_tokens = (usage.completion_tokens ?? 0) + t.usage.completion_tokens;
      }
      const changes = { error, summary: cancelRequested ? 'canceled' : 'failed: worker lost', usage };
      return settleAttempt(run, cancelRequested ? 'canceled' : 'failed', changes, 'lost', cut);
    },

    /**
     * Keeps in the store that a cancel was asked of the running attempt (`attempt`): read where a lost attempt
     * is ended (lose) and where an attempt starts or fails, even once Redis has lost the cancel's key.
     */
    async askCancel(run: Run): Promise<void> {
      if (run.cancel_requested_at) return;
      await store.runs.update(run.tenant_id, run.id, { cancel_requested_at: clock.now().toISOString() }, { status: ['running'], attempt: run.attempt });
    },

    /**
     * queued -> canceled: a run whose attempt never started (its job, if any, is removed). One that ran
     * attempts before (it waited out a retry's backoff, a deploy put it back in line) keeps its first start,
     * and its duration covers them; one that never ran lasted 0 ms, and has no start.
     */
    async cancel(run: Run, message: string): Promise<Run | null> {
      const at = clock.now();
      const firstStart = firstStartOf(run);
      const canceled = await store.runs.update(
        run.tenant_id,
        run.id,
        {
          status: 'canceled',
          finished_at: at.toISOString(),
          ...(firstStart ? { started_at: firstStart } : {}),
          duration_ms: firstStart ? Math.max(0, at.getTime() - Date.parse(firstStart)) : 0,
          error: { code: 'canceled', message },
          summary: message,
        },
        { status: ['queued'] },
      );
      if (!canceled) return null;
      // committed: the job's removal and the end's event, slot and hooks are Redis work that a Redis away
      // holds no longer than REDIS_DEADLINE_MS (they complete when it returns; a job left finds the run ended)
      await afterStored(
        Promise.all([
          queues
            .get('runs')
            .remove(jobIdOfRun(run, canceled.attempt))
            .catch(() => 0),
          ended(canceled),
        ]),
        log,
        { run_id: run.id },
        'the end of a canceled run',
      );
      return canceled;
    },

    /**
     * running -> queued as attempt + 1, at once: the worker is going away (a deploy), which is not the
     * run's failure and does not count against its retry policy. The slot stays held.
     */
    async interrupt(run: Run, reason: string, steps: StepRecord[] = [], usage: Run['usage'] = run.usage): Promise<Run | null> {
      const at = clock.now();
      const requeued = await store.runs.update(
        run.tenant_id,
        run.id,
        {
          status: 'queued',
          attempt: run.attempt + 1,
          attempts: [...run.attempts, attemptRecord(run, 'interrupted', 'running', null, at, { ...usage, seconds: elapsed(run, at) / 1000 })],
          started_at: null,
          usage: { steps: 0, model_turns: 0, seconds: 0 },
        },
        { status: ['running'], attempt: run.attempt },
        steps,
      );
      if (!requeued) return null;
      await emitInOrder(requeued, { type: 'run.interrupted', data: { attempt: run.attempt, next_attempt: requeued.attempt, reason } });
      await enqueue(requeued);
      log.warn({ run_id: run.id, attempt: run.attempt, reason }, 'run interrupted; queued for another worker');
      return requeued;
    },

    /** An event of a run (its steps', its workspace's): see emitInOrder. */
    emit: emitInOrder,
  };
  return api;
}

export type Transitions = ReturnType<typeof transitionsOf>;
