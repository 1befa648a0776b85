// Executes one attempt of a run in a worker. The job carries the attempt it was made for, so a job
// of an earlier attempt delivered again does nothing; a run found `running` when its job is delivered
// again belonged to a worker that died (it is lost: failed, or retried by its policy), unless a live
// worker process still claims it (its job's lock lapsed while Redis paused: that worker still runs it). The budget is
// an AbortSignal: at the deadline the step in flight is aborted and its processes killed. A worker
// that is shutting down interrupts its attempts: they go back to the queue for another worker.
import fs from 'node:fs/promises';
import { CONNECTION_PROVIDERS, isTerminal, type ConnectionProvider, type ErrorInfo, type Run, type StepRecord } from '../platform/index.js';
import { startAttempt, type Attempt, type StopReason } from './attempt.js';
import { modelClientOf } from './agent.js';
import { agentProgram, stepsProgram, vibeProgram, type CopyGates, type WorkOutcome } from './programs.js';
import type { Runs, RunsDeps } from './runs.js';
import type { Held, Outcome, Settled, Transitions } from './transitions.js';
import type { AuditActions, ConnectionActions, GateActions, SessionActions } from '../tools/index.js';
import { makeScratch, scratchRoot, tenantRootPath } from './workspace.js';

/** The providers a run may act on: the action tools of its allowlist (which holds every tool of its plan). */
function providersOf(run: Run): ConnectionProvider[] {
  return CONNECTION_PROVIDERS.filter((p) => run.tool_allowlist.includes(p));
}

/** How many times the settling write is tried while its job waits; then again in the background (SETTLE_LATER_MS). */
const SETTLE_TRIES = 4;
/** How long a settling write the store keeps refusing is tried in the background, the run still claimed, before it is given up. */
const SETTLE_LATER_MS = 5 * 60_000;

/** A transition the store refused SETTLE_TRIES times: the attempt's work is done, and its end must not be lost. */
class Unsettled extends Error {
  constructor(
    readonly what: () => Promise<Settled | Run | null>,
    cause: unknown,
  ) {
    super(`the store did not take the run's end: ${(cause as Error).message}`, { cause });
  }
}

/** The signals a platform sends every process of a machine it stops (Heroku's dynos: all of them, children too). */
const SHUTDOWN_SIGNALS = new Set(['SIGTERM', 'SIGINT', 'SIGHUP']);
/** How long a step killed by one of them waits to learn whether its worker is shutting down (both signals arrive together). */
const SHUTDOWN_SIGNAL_WAIT_MS = 500;

/** What runs may act on beyond their workspace: their tenant's sessions, their workspace's gates. */
export type RunActions = {
  sessionActions?: (run: Run) => SessionActions;
  gateActions?: (run: Run) => GateActions | undefined;
  auditActions?: (run: Run) => AuditActions | undefined;
  /** the tenant's connections, for the action tools */
  connectionActions?: (run: Run) => ConnectionActions | undefined;
  /** a vibe run's gates on its scratch copy */
  copyGates?: CopyGates;
};

/** An attempt this process executes: its stop, and whose it is. */
type InFlight = { controller: AbortController; runId: string; tenantId: string; attempt: number };

export function executorOf(deps: RunsDeps, runs: Runs, transitions: Transitions, actions: RunActions = {}) {
  const { store, log, settings } = deps;
  /** the AbortController of each run this process is executing (and its tenant), for cancel requests and shutdown */
  // keyed by the run and its attempt: an attempt taken for lost may still run here when its next one is delivered here too
  const inFlight = new Map<string, InFlight>();
  const inFlightKey = (runId: string, attempt: number) => `${runId} ${attempt}`;
  /** the attempts of a run this process executes */
  const attemptsOf = (runId: string) => [...inFlight.values()].filter((r) => r.runId === runId);
  const SUPERSEDED: StopReason = {
    status: 'canceled',
    error: { code: 'superseded', message: 'the run went on without this attempt (taken for lost)' },
  };
  /** the runs this process executes, from before their start until their end is written (a count: two attempts may overlap) */
  const claimed = new Map<string, number>();
  /** the ends the store refused, being tried again in the background (settleLater) */
  const settling = new Set<Promise<void>>();
  const model = settings.agent ? modelClientOf(settings.agent) : undefined;
  /** set when this process starts shutting down (its workers close) */
  let draining = false;
  const drainingSoon = async (): Promise<boolean> => {
    for (const until = Date.now() + SHUTDOWN_SIGNAL_WAIT_MS; !draining && Date.now() < until;) await new Promise((r) => setTimeout(r, 20));
    return draining;
  };
  /**
   * A step whose process died of a shutdown signal as this worker shut down: the platform stopped the machine
   * (signalling every process on it), which is a deploy, not the run's failure. Such an attempt goes back to
   * the queue, as one interrupted at the end of the grace period does.
   */
  const cutByShutdown = async (steps: StepRecord[]): Promise<boolean> => {
    const last = steps.at(-1);
    const signal = last?.status === 'failed' ? (last.output as { signal?: unknown } | null)?.signal : null;
    return typeof signal === 'string' && SHUTDOWN_SIGNALS.has(signal) && (await drainingSoon());
  };

  /**
   * A transition whose store write fails is tried again a few times (the work is done; a brief
   * outage of the store must not lose its result). Past that it is Unsettled: execute goes on trying it in
   * the background, the run still claimed by this process, so that no job delivered again takes it for lost
   * and runs it again.
   */
  async function settle(what: () => Promise<Settled | Run | null>): Promise<Settled | Run | null> {
    for (let i = 1; ; i++) {
      try {
        return await what();
      } catch (err) {
        if (i >= SETTLE_TRIES) throw new Unsettled(what, err);
        log.warn({ err: (err as Error).message, try: i }, 'settling a run failed; trying again');
        await new Promise((r) => setTimeout(r, 250 * 2 ** i));
      }
    }
  }

  /** An Unsettled transition tried again, every 5 s at most, for SETTLE_LATER_MS; then left to the reconciler, which takes the run for lost. */
  async function settleLater(runId: string, unsettled: Unsettled): Promise<void> {
    log.error({ run_id: runId, err: unsettled.message }, 'the store refused a run’s end; trying again in the background');
    for (let i = 0, until = Date.now() + SETTLE_LATER_MS; Date.now() < until; i++) {
      await new Promise((r) => setTimeout(r, Math.min(5000, 500 * 2 ** i)));
      try {
        await unsettled.what();
        log.warn({ run_id: runId }, 'a run’s end the store had refused is stored');
        return;
      } catch (err) {
        log.warn({ run_id: runId, err: (err as Error).message }, 'the store still refuses a run’s end');
      }
    }
    log.error({ run_id: runId }, 'a run’s end was not stored: the reconciler takes the run for lost');
  }

  /** Puts an interrupted attempt back in the queue; the steps it changed are written once, with it, and what it used is kept. */
  /**
   * The attempt goes back to the queue, at once: it is asked at the end of a shutdown's grace. Its checkout stays,
   * for its next attempt's checkout to make again (or the sweep at a worker's start, once the run has ended):
   * removing a large one first could take the grace's last seconds.
   */
  async function interrupted(run: Run, reason: string, a: Pick<Attempt, 'close' | 'drained' | 'usage'>): Promise<Settled> {
    const steps = a.close();
    return (await settle(() => transitions.interrupt(run, reason, steps, a.usage)).finally(a.drained)) ? { run, next: 'interrupted' } : null;
  }

  async function execute(runId: string, tenantId: string, attempt: number): Promise<Settled> {
    const found = await store.runs.get(tenantId, runId);
    if (!found) return null;
    if (isTerminal(found.status)) {
      // its end stored by a process that may have died before it freed the slot and ran the hooks
      await Promise.all([transitions.release(tenantId, runId), transitions.finishedAgain(found)]);
      return null;
    }
    // a job of an earlier attempt, delivered again after the run moved on, does nothing
    if (found.attempt !== attempt) return null;
    if (found.status === 'running') {
      if (claimed.has(runId)) return null; // still executing (or settling) here: the job was re-delivered after a stall
      // another live process still runs it (or, the registry just made again, it cannot be told yet):
      // the job waits and is looked at again, and the run ends by that process's hand
      const elsewhere = await runs.claims.elsewhere();
      if (elsewhere === null || elsewhere.has(runId)) return { run: found, next: 'held' };
      // a previous delivery started it and its worker died: its steps may have had effects
      return transitions.lose(found, 'the worker running this attempt stopped', await runs.isCancelRequested(runId).catch(() => false));
    }
    // the same attempt delivered twice to this process while it was still queued (a stall's re-delivery): one runs
    // it, and this copy, which holds the job's lock now, puts the job off (held) rather than complete it: the first
    // copy may yet be held or fail at its start, and its job would be gone; back, it finds the run as that copy left it
    if (inFlight.has(inFlightKey(runId, attempt))) return { run: found, next: 'held' };
    // claimed (told to the other processes) from before its start until its end is written: a job
    // delivered again meanwhile, or a reconcile elsewhere, never takes it for lost
    claimed.set(runId, (claimed.get(runId) ?? 0) + 1);
    const unclaim = () => {
      const n = (claimed.get(runId) ?? 1) - 1;
      if (n > 0) claimed.set(runId, n);
      else claimed.delete(runId);
    };
    let later = false;
    try {
      return await attemptOf(found);
    } catch (err) {
      if (!(err instanceof Unsettled)) throw err;
      // its work done and its end refused: still claimed while it is tried again (a job delivered again meanwhile
      // finds it executing here), its job completed: the end is this process's to store
      later = true;
      const pending = settleLater(runId, err).finally(() => {
        unclaim();
        settling.delete(pending);
      });
      settling.add(pending);
      return null;
    } finally {
      if (!later) unclaim();
    }
  }

  /** Whether a cancel was asked of the run: as Redis says, or as the store kept it (Redis may have lost its key). */
  async function cancelAsked(run: Run): Promise<boolean> {
    if (await runs.isCancelRequested(run.id).catch(() => false)) return true;
    return Boolean((await store.runs.get(run.tenant_id, run.id).catch(() => null))?.cancel_requested_at);
  }

  /** One attempt of a queued run: started, executed, settled. */
  async function attemptOf(found: Run): Promise<Settled> {
    const runId = found.id;
    // registered before the start, so a cancel request published from here on reaches it; the key
    // covers one published before, and is read while the start is written
    const controller = new AbortController();
    const key = inFlightKey(runId, found.attempt);
    // an earlier attempt of the run still here was taken for lost (this one exists only so): it stops now
    for (const earlier of attemptsOf(runId)) if (earlier.attempt < found.attempt) earlier.controller.abort(SUPERSEDED);
    inFlight.set(key, { controller, runId, tenantId: found.tenant_id, attempt: found.attempt });
    let started: Run | Held | null = null;
    let cancelRequested = false;
    try {
      // unanswered, the key counts as unset: a cancel published from now on still reaches the controller
      [started, cancelRequested] = await Promise.all([transitions.start(found, deps.sandbox.kind), runs.isCancelRequested(runId).catch(() => false)]);
      // one asked of an earlier attempt, kept in the store where Redis may have lost its key
      cancelRequested ||= Boolean(found.cancel_requested_at);
    } finally {
      if ((!started || 'held' in started) && inFlight.get(key)?.controller === controller) inFlight.delete(key);
    }
    if (!started) return null; // canceled meanwhile
    if ('held' in started) return { run: found, next: 'held' }; // still queued: its job is tried again later
    const run = started;
    // when the budget ends: a wait that would pass it (a model endpoint's Retry-After) fails at once instead
    const deadlineAt = Date.now() + run.budget.seconds * 1000;
    const deadline = setTimeout(
      () =>
        controller.abort({
          status: 'timed_out',
          error: { code: 'budget-exceeded', message: `the budget of ${run.budget.seconds} s ran out` },
        } satisfies StopReason),
      run.budget.seconds * 1000,
    );
    const a = startAttempt({ ...deps, transitions, ...actions }, run, run.workspace, controller.signal, deadlineAt);
    let outcome: Outcome;
    try {
      if (cancelRequested) controller.abort({ status: 'canceled', error: { code: 'canceled', message: 'canceled' } } satisfies StopReason);
      const agent = model ? agentProgram(model, (id) => store.runs.get(run.tenant_id, id)) : undefined;
      const base = run.plan ? stepsProgram(agent?.loop) : agent!.program;
      const program =
        run.kind === 'vibe'
          ? vibeProgram(
              base,
              async (workspace, signal) =>
                makeScratch(deps.sandbox, {
                  root: await fs.realpath(tenantRootPath(settings, run.tenant_id)),
                  workspace,
                  area: await scratchRoot(settings, run.tenant_id),
                  runId: run.id,
                  signal,
                }),
              (kind) => transitions.emit(run, { type: 'workspace.ready', data: { kind } }),
              actions.copyGates,
            )
          : base;
      // a run that acts on a provider it has no connection to fails before its first step, saying which
      const missing: ErrorInfo | null = a.connections ? await a.connections.check(providersOf(run)) : null;
      const work: WorkOutcome = missing ? { summary: missing.message, error: missing } : await program(a);
      const stop = a.stopReason();
      if (stop?.status === 'interrupted') {
        return await interrupted(run, stop.error.message, a);
      }
      if (!stop && work.error && (await cutByShutdown(a.steps))) {
        log.warn({ run_id: runId }, 'a step was killed as the worker shut down; the run goes back to the queue');
        return await interrupted(run, 'the worker shut down (its machine was stopped)', a);
      }
      const status = stop?.status ?? (work.error ? 'failed' : 'succeeded');
      const error = stop?.error ?? work.error ?? null;
      outcome = {
        status,
        error,
        summary: status === 'succeeded' ? work.summary : `${status.replace('_', ' ')}: ${error?.message ?? ''}`.trim(),
        result: work.result ?? null,
        usage: a.usage,
      };
    } catch (err) {
      // an interruption's write the store refused: execute settles it in the background, as it is
      if (err instanceof Unsettled) throw err;
      const stop = a.stopReason();
      if (stop?.status === 'interrupted') {
        return await interrupted(run, stop.error.message, a);
      }
      if (stop) {
        // stopped in the middle of work that is not a step (a vibe run's copy or diff): the stop says how it
        // ended; what was thrown is logged, in case it was a fault of its own rather than the stop
        log.warn({ err, run_id: runId, stop: stop.status }, 'a stopped run threw');
        outcome = { status: stop.status, error: stop.error, summary: `${stop.status.replace('_', ' ')}: ${stop.error.message}`, usage: a.usage };
      } else {
        log.error({ err, run_id: runId }, 'run failed unexpectedly');
        outcome = { status: 'failed', error: { code: 'internal', message: 'the run failed unexpectedly' }, summary: 'failed: internal error', usage: a.usage };
      }
    } finally {
      clearTimeout(deadline);
      if (inFlight.get(key)?.controller === controller) inFlight.delete(key);
    }
    // a cancel asked for while the attempt ran but never delivered (its message lost while the listener
    // reconnected, or published as the attempt settled) ends the run canceled: a canceled run is never retried
    if ((outcome.status === 'failed' || outcome.status === 'timed_out') && (await cancelAsked(run)))
      outcome = { ...outcome, status: 'canceled', error: { code: 'canceled', message: 'canceled while running' }, summary: 'canceled' };
    const steps = a.close();
    await a.cleanup();
    // the run's end is appended after its steps' events: waiting for those costs nothing more
    return (await settle(() => transitions.finish(run, outcome, steps)).finally(a.drained)) as Settled;
  }

  /** Aborts a run this process is executing; false when it is not here. */
  function abort(runId: string): boolean {
    const found = attemptsOf(runId);
    for (const { controller: c } of found) c.abort({ status: 'canceled', error: { code: 'canceled', message: 'canceled while running' } } satisfies StopReason);
    return found.length > 0;
  }

  return {
    execute,
    /** true while this process executes the run */
    isExecuting: (runId: string) => claimed.has(runId),
    /** the runs this process is executing now, until their end is written */
    executing: (): string[] => [...claimed.keys()],
    /**
     * Aborts the runs this process executes whose cancel was asked for: the cancel's message reaches the
     * listener only while it is connected, its key stays (read at each start, and here, now and then).
     */
    async abortCanceled(): Promise<number> {
      const going = [...inFlight.values()].filter((r) => !r.controller.signal.aborted);
      const asked = await Promise.all(going.map((r) => runs.isCancelRequested(r.runId).catch(() => false)));
      let aborted = going.filter((r, i) => asked[i] && abort(r.runId)).length;
      // the store keeps each ask too (cancel_requested_at): a key Redis lost with its data, or went back on (an
      // older save), whose message the listener missed, left the run going to its budget's end. A read of each
      // run this process executes (its concurrency's worth) at each call
      const rest = going.filter((_, i) => !asked[i]);
      const stored = await Promise.all(rest.map((r) => store.runs.get(r.tenantId, r.runId).catch(() => null)));
      for (const [i, r] of rest.entries()) {
        const now = stored[i];
        if (!now || r.controller.signal.aborted) continue;
        if (now.cancel_requested_at) {
          if (abort(r.runId)) aborted++;
          continue;
        }
        // the same read fences this process off an attempt the run went on without: taken for lost while this process
        // was stalled or cut off from Redis past its claims' lapse (the run ended, or its next attempt is queued or
        // runs elsewhere), it stops within one call of its coming back, and its end, which would not apply, is not
        // written. One that settled while the store was read (its end is the store's status now) is not stopped
        if (inFlight.get(inFlightKey(r.runId, r.attempt)) !== r) continue;
        if (now.attempt === r.attempt && !isTerminal(now.status)) continue;
        log.warn({ run_id: r.runId, attempt: r.attempt, now: { attempt: now.attempt, status: now.status } }, 'an attempt the run went on without is stopped');
        r.controller.abort(SUPERSEDED);
        aborted++;
      }
      return aborted;
    },
    abort,
    /**
     * Waits, until `deadline` (epoch ms), for the ends this process is storing in the background (settleLater):
     * a shutdown keeps their runs claimed meanwhile, rather than leave them to be taken for lost and run again.
     */
    async settled(deadline: number): Promise<void> {
      if (!settling.size) return;
      log.warn({ runs: settling.size }, 'shutting down: waiting for run ends the store refused to be stored');
      let timer: NodeJS.Timeout | undefined;
      // a second before the end: the rest of the shutdown (claims given back, the store closed) runs within it
      await Promise.race([Promise.allSettled([...settling]), new Promise((r) => (timer = setTimeout(r, Math.max(0, deadline - Date.now() - 1000))))]);
      clearTimeout(timer);
    },
    /** This process is shutting down: a step killed by the platform's signal from now on is not the run's failure. */
    drain(): void {
      draining = true;
    },
    /** Stops every attempt this process is executing so that another worker runs it again (shutdown). */
    interruptAll(reason: string): number {
      for (const { controller: c } of inFlight.values())
        c.abort({ status: 'interrupted', error: { code: 'interrupted', message: reason } } satisfies StopReason);
      return inFlight.size;
    },
  };
}

export type Executor = ReturnType<typeof executorOf>;
