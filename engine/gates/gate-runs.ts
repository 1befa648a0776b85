// Gate runs: a workspace's gate set run as a BullMQ flow, one child job per gate under a parent that
// seals the results into the evidence ledger. Every child has `ignoreDependencyOnFailure`, so a gate
// whose job fails never strands the seal; a gate the seal finds without a result counts as cancelled.
// The record is written before the flow exists; results are kept as each gate ends.
import { createHash } from 'node:crypto';
import path from 'node:path';
import { FlowProducer } from 'bullmq';
import type { Platform } from '../deps.js';
import { LedgerKeyRefused, type Ledger } from '../evidence/index.js';
import {
  interruptEvery,
  jobTree,
  newId,
  NotFoundError,
  scopes,
  LET_GO_LUA,
  placeAmong,
  renewedClaim,
  RENEW_LUA,
  SHUTDOWN_REASON,
  ValidationError,
  type GateResult,
  type GateRunRecord,
  type GateSubject,
  type EventBody,
  type LedgerEntry,
} from '../platform/index.js';
import { resolveWorkspace, tenantRoot } from '../runs/index.js';
import type { Sandbox } from '../tools/index.js';
import { loadGateSet, SEAL_JOB } from './definition.js';
import { gateEnv, runGate, subjectOf } from './runner.js';
import { committedDigest, FileHasher, gitState, type GitState } from './subject.js';

export type GatesDeps = Pick<Platform, 'store' | 'clock' | 'log' | 'queues' | 'redis' | 'events'> & {
  sandbox: Sandbox;
  ledger: Ledger;
  settings: { workspaceRoot: string; singleTenant: boolean; childEnv: Record<string, string>; gatesTenantConcurrency: number };
  /** the lifetime of the claim on a gate run's end, renewed while a seal writes (SEAL_CLAIM_MS unless set: tests) */
  sealClaimMs?: number;
};

export type GateJob = { tenant_id: string; gate_run_id: string; gate_id?: string };

const WAIT_POLL_MS = 200;
/** How often a gate that runs looks whether its gate run was canceled in another process. */
const CANCEL_POLL_MS = 500;
/**
 * A seal's claim, renewed every third of it while the seal writes: a process that dies holding it frees it this
 * soon (it lived 120 s, unrenewed, and a cancel, which waits for a seal under way, waited that long behind a
 * sealer that had died). A cancel holds it too, for the moment of its update: a gate run ends once, sealed or
 * canceled, never both.
 */
const SEAL_CLAIM_MS = 10_000;
/** A reconciler's claim on adding a lost flow again. */
const REFILL_CLAIM_SECONDS = 120;
/** How often a cancel that meets a seal under way looks whether it ended (or let go of its claim). */
const SEAL_WAIT_POLL_MS = 50;
const HASHERS_KEPT = 64;
/**
 * A workspace's gates run for one gate run at a time: they share its folder, and one run's report files and
 * build outputs would be taken for another's (a gate that failed read as passing from the other's report).
 * Held in Redis by the gate run for this long, renewed while a gate of it runs, let go at its seal or cancel.
 */
const WORKSPACE_HOLD_MS = 30_000;
const HOLD = `local v = redis.call('GET', KEYS[1])
if v == false or v == ARGV[1] then redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 1 end
return 0`;
/** Running gate runs the reconciler reads in one pass. */
const STALE_GATE_RUNS_PAGE = 200;

export function gateRunsOf(deps: GatesDeps) {
  /** where the reconciler's last pass stopped reading running gate runs */
  let staleAfter: { created_at: string; id: string } | undefined;
  const { store, clock, log, queues, events, ledger, sandbox, settings } = deps;
  let flows: FlowProducer | undefined;
  /** gates this process is running, by gate run: a cancel stops them */
  const running = new Map<string, Set<AbortController>>();
  /** the gate runs whose gate jobs this process runs, from their start until their results are kept */
  const claimed = new Map<string, number>();
  /** a file hasher per workspace folder: a digest after a change reads only what changed */
  const hashers = new Map<string, FileHasher>();

  function hasherOf(dir: string): FileHasher {
    let h = hashers.get(dir);
    // the least recently used goes first (each use moves a hasher to the end)
    if (h) hashers.delete(dir);
    else {
      if (hashers.size >= HASHERS_KEPT) hashers.delete(hashers.keys().next().value!);
      h = new FileHasher();
    }
    hashers.set(dir, h);
    return h;
  }

  const workspaceKey = (r: Pick<GateRunRecord, 'tenant_id' | 'workspace'>) =>
    `${queues.prefix}:gates:workspace:${r.tenant_id}:${createHash('sha256').update(r.workspace).digest('hex')}`;
  /** Takes (or renews) the gate run's hold of its workspace: false while another gate run holds it. */
  const hold = async (r: GateRunRecord) => (await deps.redis.eval(HOLD, 1, workspaceKey(r), r.id, WORKSPACE_HOLD_MS)) === 1;
  /** Lets go of the gate run's hold, if it has it. */
  const letGo = (r: GateRunRecord) => deps.redis.eval(LET_GO_LUA, 1, workspaceKey(r), r.id).catch(() => undefined);

  /** The claim on a gate run's end (see SEAL_CLAIM_MS), renewed while a seal writes. */
  const endClaim = (gateRunId: string) => renewedClaim(deps.redis, `${queues.prefix}:gates:seal:${gateRunId}`, deps.sealClaimMs ?? SEAL_CLAIM_MS);
  const claimEnd = (gateRunId: string) => endClaim(gateRunId).take();
  const holdingEnd = <T>(gateRunId: string, token: string, work: () => Promise<T>) => endClaim(gateRunId).holding(token, work);
  const releaseEnd = (gateRunId: string, token: string) => endClaim(gateRunId).release(token);

  /** A workspace of the tenant: its folder, and its name relative to the tenant's root. */
  async function workspaceOf(tenantId: string, requested: string | undefined, at?: string): Promise<{ dir: string; name: string }> {
    const root = await tenantRoot(settings, tenantId);
    const dir = await resolveWorkspace(root, requested, at);
    return { dir, name: path.relative(root, dir) || '.' };
  }

  /** One gate of a gate run, claimed (see runGateJob): its result kept at once, and told. */
  async function runGateClaimed(record: GateRunRecord, tenantId: string, gateRunId: string, gateId: string): Promise<GateResult | 'interrupted'> {
    const ws = await workspaceOf(tenantId, record.workspace);
    const gate = (await loadGateSet(ws.dir)).gates.find((g) => g.id === gateId);
    const git = await gitState(sandbox, ws.dir);
    const ctx = { workspaceName: ws.name, git };
    // a gate run is of one commit: a gate that would run, or ran, after its workspace's HEAD moved is not run,
    // or not kept (its result would be another commit's, which the run's seal and its pack do not name)
    const movedFrom = (now: GitState) =>
      record.subject?.commit && now.commit !== record.subject.commit
        ? `the workspace's HEAD moved from ${record.subject.commit} to ${now.commit ?? 'none'} during the gate run: no result of its commit`
        : null;
    // and of the gate set it started with: the gate file is read again here, and a gate before this one (which runs
    // the commit's code) could have rewritten this gate's command, or made it not required, and hidden the edit
    const pinned = record.definitions?.[gateId];
    const redefined =
      gate && pinned && gate.digest !== pinned
        ? `the gate's definition changed during the gate run (${pinned} when it started, ${gate.digest} now): not run`
        : null;
    let result: GateResult;
    const moved = movedFrom(git) ?? redefined;
    if (!gate || moved) {
      const at = clock.now().toISOString();
      result = gate
        ? { ...skipped(gateId, record.subject ?? subjectOf(ctx), moved!, at), name: gate.name, required: gate.required, conclusion: 'cancelled' }
        : skipped(gateId, subjectOf(ctx), 'the gate is no longer in the gate set', at);
    } else {
      const controller = new AbortController();
      const mine = running.get(gateRunId) ?? new Set();
      running.set(gateRunId, mine.add(controller));
      // a cancel asked of another process (the one serving the request, or running the step that waits) reaches
      // this one through the store: its gate was left to run to its timeout, and its result kept as the latest
      const watch = setInterval(() => {
        void store.gateRuns.get(tenantId, gateRunId).then(
          (r) => r?.status !== 'running' && controller.abort(),
          () => undefined,
        );
      }, CANCEL_POLL_MS);
      try {
        const ran = await runGate(gate, {
          sandbox,
          workspace: ws.dir,
          workspaceName: ws.name,
          git,
          hasher: hasherOf(ws.dir),
          // a gate before this one may have edited the commit's files and hidden it from git: compared with the start
          committedDigest: record.committed_digest,
          baseEnv: settings.childEnv,
          // a gate set is the tenant's: it gets none of the service's environment beyond the base
          envValue: gateEnv((name) => settings.childEnv[name]),
          network: false,
          signal: controller.signal,
        });
        // stopped because this process stops (interruptAll): no result of it; its job goes back to the queue
        if (controller.signal.reason === SHUTDOWN_REASON) return 'interrupted';
        result = ran.result;
        // the repository as the gate left it (runGate looked, to know whether its tree changed meanwhile)
        const movedMeanwhile = record.subject?.commit ? movedFrom(ran.after ?? (await gitState(sandbox, ws.dir, [], { tracked: true }))) : null;
        if (movedMeanwhile) result = { ...result, subject: record.subject!, conclusion: 'cancelled', summary: movedMeanwhile, artifacts: [] };
        else if (ran.artifacts.length) await store.evidence.append(tenantId, () => [], ran.artifacts);
      } finally {
        clearInterval(watch);
        mine.delete(controller);
        if (!mine.size) running.delete(gateRunId);
      }
    }
    // required as the set said when the gate run started, whatever the gate file says now
    result = { ...result, required: requiredIn(record, gateId, result.required) };
    // a gate run ended meanwhile (canceled, or sealed without this gate) keeps no result of it: smart gates
    // would read it as the gate's latest, which no ledger entry seals
    if ((await store.gateRuns.get(tenantId, gateRunId))?.status !== 'running') {
      log.info({ tenant_id: tenantId, gate_run_id: gateRunId, gate_id: gateId }, 'gate result not kept: its gate run ended while it ran');
      return result;
    }
    await store.gateRuns.putResult(tenantId, gateRunId, result);
    await emit(record, {
      type: 'gate.finished',
      data: {
        gate_run_id: gateRunId,
        gate_id: gateId,
        conclusion: result.conclusion,
        required: result.required,
        summary: result.summary,
        duration_ms: result.duration_ms,
      },
    });
    return result;
  }

  async function mustGet(tenantId: string, id: string): Promise<GateRunRecord> {
    const r = await store.gateRuns.get(tenantId, id);
    if (!r) throw new NotFoundError(`no gate run ${id}`);
    return r;
  }

  /** The gate run's flow: a job for each of `gates` under its seal job (job ids from the gate run's). */
  async function addFlow(record: GateRunRecord, gates: string[]): Promise<void> {
    const data = (gate_id?: string): GateJob => ({ tenant_id: record.tenant_id, gate_run_id: record.id, ...(gate_id ? { gate_id } : {}) });
    flows ??= new FlowProducer({ connection: deps.redis, prefix: queues.prefix });
    await flows.add(
      jobTree(
        'gates',
        record.id,
        { name: SEAL_JOB, data: data() },
        gates.map((id) => ({ key: id, name: 'gate', data: data(id) })),
      ),
    );
  }

  /**
   * A gate run still waited for: started by a run's step whose attempt is still being executed, here or by
   * another live process (`executing`). One the CLI started, or whose run's process died, is not.
   */
  async function waitedFor(r: GateRunRecord, executing: (runId: string) => boolean): Promise<boolean> {
    if (r.trigger.type !== 'run' || !executing(r.trigger.run_id)) return false;
    const run = await store.runs.get(r.tenant_id, r.trigger.run_id);
    return run?.status === 'running' && !!run.started_at && run.started_at <= r.created_at;
  }

  /**
   * A gate run that no one waits for any more: its run's step was of an attempt that ended (a worker that died
   * mid-step left it; the run's next attempt starts gate runs of its own). Its gates do not run (again, for a job
   * redelivered after the death) and it is not sealed: it is canceled.
   */
  async function abandoned(r: GateRunRecord): Promise<boolean> {
    if (r.trigger.type !== 'run' || r.trigger.attempt === undefined) return false;
    const run = await store.runs.get(r.tenant_id, r.trigger.run_id);
    return run?.status !== 'running' || run.attempt !== r.trigger.attempt;
  }

  /**
   * Adds a lost flow again for the gates of `r` that have not reported, once however many reconcilers find
   * it lost at once: under a claim, with the seal job and the results read again. False when another
   * reconciler has it, or it is no longer lost.
   */
  async function addLostFlow(r: GateRunRecord): Promise<boolean> {
    const claim = `${queues.prefix}:gates:refill:${r.id}`;
    if ((await deps.redis.set(claim, '1', 'EX', REFILL_CLAIM_SECONDS, 'NX')) !== 'OK') return false;
    try {
      if (await queues.get('gates').getJob(`${r.id}__${SEAL_JOB}`)) return false;
      const reported = new Set((await store.gateRuns.results(r.tenant_id, r.id)).map((x) => x.gate_id));
      const unreported = r.gates.filter((g) => !reported.has(g));
      // what is left of the old jobs goes first (a job a live process holds refuses: the next pass tries again)
      for (const gate of unreported) await (await queues.get('gates').getJob(`${r.id}__${gate}`))?.remove();
      await addFlow(r, unreported);
      log.warn({ tenant_id: r.tenant_id, gate_run_id: r.id, gates: unreported }, 'a gate run’s lost flow was added again');
      return true;
    } catch (err) {
      await deps.redis.del(claim).catch(() => undefined);
      throw err;
    }
  }

  /** Events of a gate run started by a run's step go to that run's session stream. */
  async function emit(r: GateRunRecord, body: EventBody): Promise<void> {
    if (r.trigger.type !== 'run') return;
    await events.append(scopes.runSession(r.trigger.session_id).stream, {
      tenant_id: r.tenant_id,
      session_id: r.trigger.session_id,
      run_id: r.trigger.run_id,
      ...body,
    });
  }

  /** A gate run that ended (sealed or canceled) lets go of its workspace and tells its end, once. */
  async function ended(r: GateRunRecord): Promise<void> {
    await letGo(r);
    const failedRequired =
      r.status === 'canceled' ? [] : r.results.filter((x) => requiredIn(r, x.gate_id, x.required) && x.conclusion !== 'success').map((x) => x.gate_id);
    await emit(r, {
      type: 'gate.run_finished',
      data: {
        gate_run_id: r.id,
        status: r.status,
        failed_required: failedRequired,
        ledger_head: r.ledger?.head_hash ?? null,
        ...(r.error ? { error: r.error } : {}),
      },
    });
    if (r.status !== 'canceled') log.info({ tenant_id: r.tenant_id, gate_run_id: r.id, status: r.status, failed_required: failedRequired }, 'gate run sealed');
  }

  /**
   * Cancels a gate run, under the claim on its end, and answers its end. A seal under way ends it instead: the
   * cancel waits for it (with `waitForSeal`; else it answers null at once). A seal cut off after its ledger
   * entries is finished from them, not canceled: the record says what the ledger seals.
   */
  async function cancelUnderClaim(tenantId: string, gateRunId: string, waitForSeal: boolean): Promise<GateRunRecord | null> {
    let claim: string | null;
    while (!(claim = await claimEnd(gateRunId))) {
      const r = await mustGet(tenantId, gateRunId);
      if (r.status !== 'running') return stopped(r);
      if (!waitForSeal) return null;
      await new Promise((resolve) => setTimeout(resolve, SEAL_WAIT_POLL_MS));
    }
    let end: GateRunRecord | null;
    try {
      const current = await mustGet(tenantId, gateRunId);
      if (current.status !== 'running') return stopped(current);
      const sealed = await sealedInLedger(store, current);
      end = await store.gateRuns.update(tenantId, gateRunId, sealed ?? { status: 'canceled', finished_at: clock.now().toISOString() }, ['running']);
      // ended by a writer that takes no claim (the CLI's seal): its end is told by it
      if (!end) return stopped(await mustGet(tenantId, gateRunId));
      if (sealed)
        log.warn({ tenant_id: tenantId, gate_run_id: gateRunId, status: end.status }, 'gate run to cancel was sealed in the ledger: finished from it');
    } finally {
      await releaseEnd(gateRunId, claim);
    }
    await ended(end);
    return stopped(end);
  }

  /** The gates of a gate run that ended which run here stop (those not started do not start: they read its record). */
  function stopped(r: GateRunRecord): GateRunRecord {
    for (const c of running.get(r.id) ?? []) c.abort();
    return r;
  }

  const api = {
    workspaceOf,
    hasherOf,

    /**
     * Stops every gate this process runs, as it shuts down: none keeps a result, and each one's job goes back to
     * the queue for another worker (waited for, a gate outlived the grace period and its job spent its one stall).
     * How many.
     */
    interruptAll: (): number => interruptEvery(running),

    /** Starts the workspace's gates (or `only` those): the record first, then the flow. */
    async start(tenantId: string, req: { workspace?: string; only?: string[]; trigger: GateRunRecord['trigger'] }): Promise<GateRunRecord> {
      const ws = await workspaceOf(tenantId, req.workspace);
      const set = await loadGateSet(ws.dir);
      const unknown = (req.only ?? []).filter((id) => !set.gates.some((g) => g.id === id));
      if (unknown.length)
        throw new ValidationError(`no gate ${unknown.join(', ')} in ${set.source} (${set.gates.map((g) => g.id).join(', ')})`, [
          { path: '/only', message: `unknown gates: ${unknown.join(', ')}` },
        ]);
      const gates = set.gates.filter((g) => !req.only?.length || req.only.includes(g.id)).map((g) => g.id);
      const git = await gitState(sandbox, ws.dir);
      const found = git.dirty === false ? await committedDigest(hasherOf(ws.dir), ws.dir, git) : null;
      const record: GateRunRecord = {
        id: newId('grn'),
        tenant_id: tenantId,
        workspace: ws.name,
        status: 'running',
        source: set.source,
        gates,
        required_gates: set.gates.filter((g) => g.required).map((g) => g.id),
        definitions: Object.fromEntries(set.gates.filter((g) => gates.includes(g.id)).map((g) => [g.id, g.digest])),
        committed_digest: found,
        trigger: req.trigger,
        subject: subjectOf({ workspaceName: ws.name, git }),
        results: [],
        ledger: null,
        created_at: clock.now().toISOString(),
        finished_at: null,
      };
      await store.gateRuns.insert(record);
      try {
        await addFlow(record, gates);
      } catch (err) {
        // the step that asked fails: its gate run must not run later without it (the reconciler adds lost flows)
        await store.gateRuns.update(tenantId, record.id, { status: 'canceled', finished_at: clock.now().toISOString() }, ['running']).catch(() => undefined);
        throw err;
      }
      log.info({ tenant_id: tenantId, gate_run_id: record.id, workspace: ws.name, gates }, 'gate run started');
      return record;
    },

    /**
     * A child job: one gate, in the sandbox; its result is kept at once. Null when the gate run is over; `busy`
     * while another gate run holds the workspace (the job waits, holding no worker, and is tried again).
     */
    async runGateJob(tenantId: string, gateRunId: string, gateId: string): Promise<GateResult | null | 'busy' | 'interrupted'> {
      const record = await store.gateRuns.get(tenantId, gateRunId);
      if (!record || record.status !== 'running') return null;
      if (await abandoned(record)) {
        await cancelUnderClaim(tenantId, gateRunId, false);
        return null;
      }
      const place = placeAmong(
        deps.redis,
        `${queues.prefix}:gate-places:${tenantId}`,
        `${gateRunId}:${gateId}`,
        settings.gatesTenantConcurrency,
        WORKSPACE_HOLD_MS,
      );
      // a place among the tenant's gates running at once (SERVICE_GATES_TENANT_CONCURRENCY), renewed while its gate
      // runs: the gates queue is one line for every tenant, and one tenant's hundred gates held every worker place
      // while another tenant's run waited on its one gate until its budget ran out. When the tenant's other gates
      // hold every place of its own, this one waits, as for a held workspace
      if (!(await place.take())) return 'busy';
      if (!(await hold(record))) {
        await place.give();
        return 'busy';
      }
      // ended (sealed, canceled) between its read and the hold: the hold goes back at once, not 30 s later
      if ((await store.gateRuns.get(tenantId, gateRunId))?.status !== 'running') {
        await Promise.all([letGo(record), place.give()]);
        return null;
      }
      const renew = setInterval(() => {
        void deps.redis.eval(RENEW_LUA, 1, workspaceKey(record), record.id, WORKSPACE_HOLD_MS).catch(() => undefined);
        place.renew();
      }, WORKSPACE_HOLD_MS / 3);
      // claimed until its result is kept, not only while its gate runs: a reconciler never seals between the two
      claimed.set(gateRunId, (claimed.get(gateRunId) ?? 0) + 1);
      try {
        return await runGateClaimed(record, tenantId, gateRunId, gateId);
      } finally {
        clearInterval(renew);
        await place.give();
        const n = (claimed.get(gateRunId) ?? 1) - 1;
        if (n > 0) claimed.set(gateRunId, n);
        else claimed.delete(gateRunId);
      }
    },

    /** The parent job: every gate's result (cancelled when it has none) sealed into the ledger, once. */
    async seal(tenantId: string, gateRunId: string): Promise<GateRunRecord | null> {
      const record = await store.gateRuns.get(tenantId, gateRunId);
      if (!record || record.status !== 'running') return record;
      if (await abandoned(record)) return (await cancelUnderClaim(tenantId, gateRunId, false)) ?? record;
      // one seal at a time (a redelivered seal job, two reconcilers), and no cancel meanwhile: the ledger gets
      // its entries once, and the record ends as they say
      const claim = await claimEnd(gateRunId);
      if (!claim) return record;
      let sealed: GateRunRecord | null;
      try {
        // read again under the claim: a cancel that held it first ended the gate run, which is not sealed
        const current = await store.gateRuns.get(tenantId, gateRunId);
        if (current?.status !== 'running') {
          await releaseEnd(gateRunId, claim);
          return current;
        }
        sealed = await holdingEnd(gateRunId, claim, async () => {
          try {
            return await sealGateRun({ store, clock, ledger }, current);
          } catch (err) {
            if (!(err instanceof LedgerKeyRefused)) throw err;
            // no retry seals it while the key is wrong (the seal job's, the reconciler's every pass): the gate run
            // ends now, unsealed, with what its gates found and why, and the step that waits for it is told
            log.error({ tenant_id: tenantId, gate_run_id: gateRunId, err: err.message }, 'gate run not sealed: the evidence ledger refused the service’s key');
            const { results } = await endOf(store, current, clock.now().toISOString());
            return store.gateRuns.update(
              tenantId,
              gateRunId,
              { status: 'canceled', results, finished_at: clock.now().toISOString(), error: `not sealed: ${err.message}` },
              ['running'],
            );
          }
        });
      } catch (err) {
        // a retry (the reconciler's) may seal at once, not a claim's lifetime later
        await releaseEnd(gateRunId, claim);
        throw err;
      }
      if (sealed) await ended(sealed);
      return sealed ?? (await store.gateRuns.get(tenantId, gateRunId));
    },

    /**
     * Stops a gate run: its gates running here are stopped, those not started do not start, nothing is sealed.
     * A seal under way (or cut off after its ledger entries) ends it instead, and the answer is that end.
     */
    async cancel(tenantId: string, gateRunId: string): Promise<GateRunRecord> {
      return (await cancelUnderClaim(tenantId, gateRunId, true))!;
    },

    /** Waits for a gate run to end; an abort cancels it. */
    async wait(tenantId: string, gateRunId: string, signal?: AbortSignal): Promise<GateRunRecord> {
      for (;;) {
        const r = await mustGet(tenantId, gateRunId);
        if (r.status !== 'running') return r;
        if (signal?.aborted) return api.cancel(tenantId, gateRunId);
        await new Promise((resolve) => setTimeout(resolve, WAIT_POLL_MS));
      }
    },

    /**
     * Repairs gate runs whose flow was lost (the process died between the record and the flow, or Redis
     * lost the jobs, or a redelivered seal job ended on a dead process's claim). One whose seal job is gone
     * and that a live step still waits for (`waitedFor`) gets its flow again, for the gates that have not reported;
     * otherwise one whose seal job is gone, failed or completed without sealing it is sealed with what it
     * has, or canceled when no gate reported anything. A gate run never stays `running` for good.
     */
    async reconcile(
      // made this long ago: its flow, added in the same request as its record, is there unless it was lost (the seal
      // job's state and the workers' claims tell the rest); at 60 s a gate run whose jobs Redis lost ended a minute late
      olderThanMs = 20_000,
      opts: { elsewhere?: () => Promise<Set<string> | null>; isExecuting?: (runId: string) => boolean } = {},
    ): Promise<number> {
      const before = new Date(clock.now().getTime() - olderThanMs).toISOString();
      // gate runs another live process is executing (the workers' claims): their gates still report, whatever
      // became of the jobs (Redis lost them); a registry too young to tell (just made again) judges nothing
      const elsewhere = opts.elsewhere ? await opts.elsewhere() : new Set<string>();
      if (!elsewhere) return 0;
      /** the runs being executed now, here or by another live process */
      const executing = (runId: string) => opts.isExecuting?.(runId) === true || elsewhere.has(runId);
      let repaired = 0;
      // a page at a time from where the last pass stopped (from the oldest again at the end): runs still going
      // hold no place before a lost one
      const page = await store.gateRuns.listRunning(before, STALE_GATE_RUNS_PAGE, staleAfter);
      const last = page.at(-1);
      staleAfter = page.length < STALE_GATE_RUNS_PAGE || !last ? undefined : { created_at: last.created_at, id: last.id };
      for (const r of page) {
        if (claimed.has(r.id) || elsewhere.has(r.id)) continue;
        const seal = await queues.get('gates').getJob(`${r.id}__${SEAL_JOB}`);
        const state = seal ? await seal.getState() : 'missing';
        // a seal job that completed with its run still running ended without sealing it: it found the claim of a
        // process that died sealing (the job was redelivered), and no job is left to seal the run
        if (state !== 'missing' && state !== 'failed' && state !== 'unknown' && state !== 'completed') continue;
        // read after the job's state: a seal that ended since the list was read is not taken for lost
        if ((await store.gateRuns.get(r.tenant_id, r.id))?.status !== 'running') continue;
        const reported = await store.gateRuns.results(r.tenant_id, r.id);
        if (state === 'missing' && reported.length < r.gates.length && (await waitedFor(r, executing))) {
          // Redis lost the flow (or the process died before it was added) and a live step still waits for the
          // gate run: the gates that did not report run, under a new seal job
          try {
            if (!(await addLostFlow(r))) continue;
          } catch (err) {
            // a leftover job still locked by a process that died, or Redis refused: the next pass tries again
            log.warn({ gate_run_id: r.id, err: (err as Error).message }, 'a gate run’s lost flow could not be added again yet');
            continue;
          }
        } else if (reported.length) await api.seal(r.tenant_id, r.id);
        // a seal under way (or whose process died holding its claim) is not waited for: the next pass looks again
        else if (!(await cancelUnderClaim(r.tenant_id, r.id, false))) continue;
        repaired++;
      }
      if (repaired) log.warn({ repaired }, 'reconciler repaired gate runs whose flow was lost');
      return repaired;
    },

    get: mustGet,
    list: (tenantId: string, q: { workspace?: string; limit: number; cursor?: string }) => store.gateRuns.list(tenantId, q),
    /** the gate runs whose gates this process is running now (the workers claim them, as they claim runs) */
    executing: (): string[] => [...claimed.keys()],

    async close(): Promise<void> {
      await flows?.close();
    },
  };
  return api;
}

/**
 * Seals a gate run: every gate's kept result (cancelled when it has none), one ledger entry per
 * result and one for the run, and the record's end, once (a run already sealed is left as it is).
 * The service's seal job and the CLI's `gates run --record` both seal here.
 */
export async function sealGateRun(deps: Pick<Platform, 'store' | 'clock'> & { ledger: Ledger }, record: GateRunRecord): Promise<GateRunRecord | null> {
  const { store, clock, ledger } = deps;
  const tenantId = record.tenant_id;
  // the ledger, not a claim, says whether it was sealed: a seal cut off between its entries and the record's
  // update (its process died, its claim lapsed) is finished from its entries, never appended again
  const sealed = await sealedInLedger(store, record);
  if (sealed) return store.gateRuns.update(tenantId, record.id, sealed, ['running']);
  const at = clock.now().toISOString();
  const subject = record.subject ?? { workspace: record.workspace, commit: null, tree: null, dirty: null };
  const { results, status } = await endOf(store, record, at);
  const entries = await ledger.append(tenantId, [
    ...results.map((r) => ({
      kind: 'gate.result',
      subject: { ...r.subject, input_digest: r.input_digest, gate_id: r.gate_id, gate_run_id: record.id },
      payload: r,
    })),
    {
      kind: 'gate.run',
      subject: { ...subject, gate_run_id: record.id, ...(record.trigger.type === 'run' ? { run_id: record.trigger.run_id } : {}) },
      payload: {
        gate_run_id: record.id,
        workspace: record.workspace,
        source: record.source,
        status,
        trigger: record.trigger,
        gates: results.map((r) => ({ gate_id: r.gate_id, conclusion: r.conclusion, required: r.required })),
        // the set's required gates as this run saw it: a pack's `missing` (and so `ready`) is read from here
        required_gates: record.required_gates ?? null,
      },
    },
  ]);
  return store.gateRuns.update(
    tenantId,
    record.id,
    { status, results, finished_at: at, ledger: { from_seq: entries[0]!.seq, to_seq: entries.at(-1)!.seq, head_hash: entries.at(-1)!.hash } },
    ['running'],
  );
}

/** A gate run's end as its gates left it: every gate's kept result (cancelled when it has none), and its status. */
async function endOf(store: Platform['store'], record: GateRunRecord, at: string): Promise<{ results: GateResult[]; status: 'succeeded' | 'failed' }> {
  const kept = new Map((await store.gateRuns.results(record.tenant_id, record.id)).map((r) => [r.gate_id, r]));
  const subject = record.subject ?? { workspace: record.workspace, commit: null, tree: null, dirty: null };
  const results = record.gates.map(
    (id) => kept.get(id) ?? { ...skipped(id, subject, 'the gate did not report a result', at), conclusion: 'cancelled' as const },
  );
  const status = results.some((r) => requiredIn(record, r.gate_id, r.required) && r.conclusion !== 'success') ? 'failed' : 'succeeded';
  return { results, status };
}

/**
 * The end the ledger already seals of a gate run, as its record keeps it: the status of its first gate.run
 * entry, each gate's result sealed before it, and their range. Null when the ledger seals none.
 */
async function sealedInLedger(
  store: Platform['store'],
  record: GateRunRecord,
): Promise<Pick<GateRunRecord, 'status' | 'results' | 'finished_at' | 'ledger'> | null> {
  const entries = await store.evidence.ofGateRun(record.tenant_id, record.id);
  const run = entries.find((e) => e.kind === 'gate.run');
  if (!run) return null;
  const results = entries.filter((e) => e.kind === 'gate.result' && e.seq < run.seq);
  const payloads = await store.evidence.payloads(
    record.tenant_id,
    [run, ...results].map((e) => e.payload_digest),
  );
  const bodies = new Map(payloads.map((p) => [p.digest, p.body]));
  const payloadOf = <T>(e: LedgerEntry): T => {
    const body = bodies.get(e.payload_digest);
    if (body === undefined) throw new Error(`the ledger seals gate run ${record.id}, but keeps no payload of its entry ${e.seq}`);
    return JSON.parse(body) as T;
  };
  const sealed = payloadOf<{ status: 'succeeded' | 'failed'; gates: { gate_id: string }[] }>(run);
  // each gate's latest entry before the run's: a MongoDB append cut off midway left an earlier one, sealed by nothing
  const byGate = sealed.gates.map(({ gate_id }) => {
    const entry = results.findLast((e) => e.subject.gate_id === gate_id);
    if (!entry) throw new Error(`the ledger seals gate run ${record.id} at entry ${run.seq} without a result of gate ${gate_id}`);
    return entry;
  });
  return {
    status: sealed.status,
    results: byGate.map((e) => payloadOf<GateResult>(e)),
    finished_at: run.at,
    ledger: { from_seq: Math.min(run.seq, ...byGate.map((e) => e.seq)), to_seq: run.seq, head_hash: run.hash },
  };
}

/**
 * Whether a gate of a gate run is required: as its set said when the run started (`required_gates`), not as a
 * result says (a result is made after the gate file was read again); `fallback` for a run recorded before it kept them.
 */
export function requiredIn(record: Pick<GateRunRecord, 'required_gates'>, gateId: string, fallback: boolean): boolean {
  return record.required_gates ? record.required_gates.includes(gateId) : fallback;
}

function skipped(gateId: string, subject: GateSubject, summary: string, at: string): GateResult {
  return {
    gate_id: gateId,
    name: gateId,
    required: true,
    conclusion: 'skipped',
    summary,
    exit_code: null,
    duration_ms: 0,
    output_tail: '',
    annotations: [],
    subject,
    input_digest: '',
    definition_digest: '',
    tool_versions: {},
    artifacts: [],
    started_at: at,
    finished_at: at,
  };
}

export type GateRuns = ReturnType<typeof gateRunsOf>;
