// Workspace audits: one BullMQ flow per audit, a child job per phase (each in the sandbox, each with
// `ignoreDependencyOnFailure`, so a phase whose job fails never strands the report) under a parent
// that assembles the report, writes its summary into the evidence ledger and ends the stream. The
// report lives in Redis (reports.ts) from the start, so a fetch from any web process sees it as it
// grows; each phase appends a `phase_done` event to the audit's log as it ends. Whether a report was
// assembled is the ledger's to say, not Redis's: a report that Redis brings back running (an older save, a
// lagging replica) is finished again from its entry, and its phases do not run again. A cancel marks the
// report in Redis: phases in every worker process read the mark, as gates read their gate run's status.
import fs from 'node:fs/promises';
import path from 'node:path';
import { FlowProducer } from 'bullmq';
import type { Platform } from '../deps.js';
import { canonicalJson, sha256Hex, type Ledger } from '../evidence/index.js';
import {
  AUDIT_PHASES,
  interruptEvery,
  jobTree,
  newId,
  NotFoundError,
  REDIS_DEADLINE_MS,
  redisOrUnavailable,
  scopes,
  ServiceUnavailableError,
  placeAmong,
  renewedClaim,
  SEVERITIES,
  SHUTDOWN_REASON,
  type AuditLayer,
  type AuditPhase,
  type AuditPhaseResult,
  type AuditReport,
  type AuditReportHead,
  type LedgerEntry,
  type SeverityCounts,
  ValidationError,
} from '../platform/index.js';
import { resolveWorkspace, tenantRoot } from '../runs/index.js';
import type { Sandbox } from '../tools/index.js';
import { parseLayers } from './phases/layers.js';
import { checkOutdated } from './registry.js';
import { reportStoreOf } from './reports.js';
import { resolveAuditRoot } from './roots.js';
import { PhaseError, runPhase } from './run-phase.js';
import { FINDINGS_CAP } from './phases/workspace.js';

export type AuditSettings = {
  workspaceRoot: string;
  /** the service's data folder: never audited */
  dataDir: string;
  singleTenant: boolean;
  isProduction: boolean;
  allowSensitivePaths: boolean;
  allowedRoots: string[];
  reportTtlSeconds: number;
  reportsMax: number;
  /** audits one tenant may have running at once; more are refused (429) until one ends */
  tenantMaxRunning: number;
  phaseTimeoutSeconds: number;
  /** phases of one tenant running at once over every worker process: the others wait, holding no worker */
  tenantConcurrency: number;
  /** where outdated dependencies are looked up; null: not checked */
  registryUrl: string | null;
};

/** What the service knows of a workspace's gates, for the health phase: null when it has no gate set. */
export type GateHealth = (tenantId: string, workspace: string) => Promise<{ gate_id: string; required: boolean; state: string; reason: string }[] | null>;

export type AuditsDeps = Pick<Platform, 'clock' | 'log' | 'queues' | 'redis' | 'events' | 'store'> & {
  sandbox: Sandbox;
  ledger: Ledger;
  gateHealth: GateHealth;
  settings: AuditSettings;
  fetch?: typeof fetch;
};

export type AuditJob = { tenant_id: string; report_id: string; phase?: AuditPhase };

export type AuditRequest = {
  /** X-Service-Workspace-Root: a folder (absolute, or relative to the tenant's root) */
  root?: string;
  /** a workspace of the tenant by name (used when no root is given) */
  workspace?: string;
  /** where the request named the workspace, for its error (a query parameter on the stream's GET) */
  workspaceAt?: string;
  /** where the request named its layers, for errors (`/body/layers` unless said) */
  layersAt?: string;
  phases?: AuditPhase[];
  /** layering rules as asked for (checked and completed by parseLayers) */
  layers?: { name: string; path: string; may_import?: string[] }[] | null;
  trigger: AuditReport['trigger'];
  /**
   * A run's step: its writes wait for Redis as the rest of its worker does. A request's are refused (503)
   * after REDIS_DEADLINE_MS instead, so that no client is held for as long as Redis is away.
   */
  waitForRedis?: boolean;
};

/** What the evidence ledger keeps of an assembled report: its `audit.report` entry's payload. */
type ReportSummary = Pick<AuditReport, 'report_id' | 'workspace' | 'status' | 'started_at' | 'finished_at' | 'trigger' | 'totals' | 'scores'> & {
  phases: Pick<AuditPhaseResult, 'phase' | 'status' | 'counts' | 'score' | 'duration_ms' | 'findings_omitted'>[];
  report_digest: string;
};

/** A phase's result without its findings and metrics: what the ledger's summary keeps of it (the stream's head adds its error). */
const phaseSummaryOf = (p: AuditPhaseResult): ReportSummary['phases'][number] => ({
  phase: p.phase,
  status: p.status,
  counts: p.counts,
  score: p.score,
  duration_ms: p.duration_ms,
  findings_omitted: p.findings_omitted,
});

const REPORT_KIND = 'audit.report';
const WAIT_POLL_MS = 100;
/** How often a phase that runs looks whether its audit was canceled (or taken back) in another process. */
const CANCEL_POLL_MS = 500;
/** Why a canceled audit's phases stopped, or did not run. */
const CANCELED = 'the audit was canceled (the run that waited on it was canceled)';
/**
 * An assembly's claim (and that of a report's end appended late): a redelivered parent job or a second reconciler
 * leaves the ledger one entry. Renewed while the work runs: one of a process that died lapses within it (it was
 * 120 s, never renewed, and the report of a worker that died assembling stayed running that long).
 */
const ASSEMBLE_CLAIM_MS = 10_000;
/** A phase's place among its tenant's phases running (renewed a third of the way): one of a dead process lapses. */
const PLACE_HOLD_MS = 30_000;
const WEIGHTS: SeverityCounts = { critical: 40, high: 15, medium: 5, low: 1, info: 0 };

const zero = (): SeverityCounts => ({ critical: 0, high: 0, medium: 0, low: 0, info: 0 });
/** A phase that did not complete: no findings, no score, and why. */
const notCompleted = (phase: AuditPhase, status: 'failed' | 'timed_out', durationMs: number, error: string): AuditPhaseResult => ({
  phase,
  status,
  duration_ms: durationMs,
  findings: [],
  findings_omitted: 0,
  counts: zero(),
  score: null,
  metrics: {},
  error,
});
const scoreOf = (counts: SeverityCounts): number => Math.max(0, 100 - SEVERITIES.reduce((s, k) => s + counts[k] * WEIGHTS[k], 0));

export function auditsOf(deps: AuditsDeps) {
  const { clock, log, queues, events, ledger, sandbox, settings } = deps;
  const reports = reportStoreOf(deps.redis, {
    prefix: queues.prefix,
    ttlSeconds: settings.reportTtlSeconds,
    maxPerTenant: settings.reportsMax,
    maxRunningPerTenant: settings.tenantMaxRunning,
  });
  let flows: FlowProducer | undefined;
  const running = new Map<string, Set<AbortController>>();

  const notFound = (id: string) =>
    new NotFoundError(
      `no audit report ${id}: reports are kept for ${settings.reportTtlSeconds} s after they finish, the last ${settings.reportsMax} per tenant`,
      { ttl_seconds: settings.reportTtlSeconds, reports_kept: settings.reportsMax },
    );

  /** The folder an audit reads, and its name: relative to the tenant's root when it lies inside it. */
  async function rootOf(tenantId: string, req: Pick<AuditRequest, 'root' | 'workspace' | 'workspaceAt'>): Promise<{ dir: string; name: string }> {
    const tenant = await tenantRoot(settings, tenantId);
    const dir =
      req.root !== undefined && req.root !== ''
        ? await resolveAuditRoot(req.root, {
            tenantRoot: tenant,
            isProduction: settings.isProduction,
            allowSensitive: settings.allowSensitivePaths,
            allowedRoots: settings.allowedRoots,
            privateRoots: { workspaceRoot: settings.workspaceRoot, dataDir: settings.dataDir },
          })
        : await resolveWorkspace(tenant, req.workspace, req.workspaceAt);
    const rel = path.relative(tenant, dir);
    const inTenant = rel !== '..' && !rel.startsWith(`..${path.sep}`) && !path.isAbsolute(rel);
    return { dir, name: inTenant ? rel || '.' : dir };
  }

  async function mustGet(tenantId: string, id: string) {
    const got = await reports.get(tenantId, id);
    if (!got) throw notFound(id);
    return got;
  }

  /** The folder a report's phases read: its workspace name again (kept in the report), checked again. */
  async function dirOf(tenantId: string, report: AuditReport): Promise<string> {
    return (await rootOf(tenantId, path.isAbsolute(report.workspace) ? { root: report.workspace } : { workspace: report.workspace })).dir;
  }

  /** The health phase's part outside the sandbox: the gates' state, and outdated dependencies. */
  async function healthExtras(tenantId: string, report: AuditReport, out: Awaited<ReturnType<typeof runPhase>>): Promise<void> {
    const added: AuditPhaseResult['findings'] = [];
    const add = (f: AuditPhaseResult['findings'][number]) => {
      out.counts[f.severity]++;
      added.push(f);
    };
    const gates = path.isAbsolute(report.workspace) ? null : await deps.gateHealth(tenantId, report.workspace).catch(() => null);
    if (gates) {
      const states: Record<string, number> = {};
      for (const g of gates) {
        states[g.state] = (states[g.state] ?? 0) + 1;
        const why = g.reason || g.state;
        if (g.state === 'stale') add({ rule: 'stale-gate-result', severity: 'low', file: null, line: null, message: `gate ${g.gate_id}: ${why}` });
        else if (g.state === 'failing')
          add({ rule: 'failing-gate', severity: g.required ? 'medium' : 'low', file: null, line: null, message: `gate ${g.gate_id}: ${why}` });
        else if (g.state === 'missing') add({ rule: 'gate-never-run', severity: 'info', file: null, line: null, message: `gate ${g.gate_id} has never run` });
      }
      out.metrics.gates = states;
    } else out.metrics.gates = null;
    const outdated = await checkOutdated(out.dependencies ?? [], settings.registryUrl, deps.fetch);
    for (const f of outdated.findings) add(f);
    out.metrics.outdated = outdated.metrics;
    // the phase's list stays within its cap, worst first; what does not fit is counted
    const all = [...out.findings, ...added].sort((a, b) => SEVERITIES.indexOf(a.severity) - SEVERITIES.indexOf(b.severity));
    out.findings = all.slice(0, FINDINGS_CAP);
    out.findings_omitted += all.length - out.findings.length;
  }

  async function emitPhase(tenantId: string, id: string, r: AuditPhaseResult): Promise<void> {
    await events.append(scopes.audit(id).stream, {
      tenant_id: tenantId,
      type: 'audit.phase_done',
      data: { report_id: id, phase: r.phase, status: r.status, counts: r.counts, score: r.score, duration_ms: r.duration_ms },
    });
  }

  /** The assembled report into Redis (out of the running sets), and the end of its stream. */
  async function finishWith(tenantId: string, report: AuditReport): Promise<void> {
    await reports.finish(tenantId, report);
    // under the same claim as a heartbeat's or a reconnect's that finds it finished first: the end is appended once
    await ensureEnded(tenantId, report);
  }

  async function appendEnd(tenantId: string, report: AuditReport): Promise<void> {
    const stream = scopes.audit(report.report_id).stream;
    // the report's head, not the report: findings and metrics are fetched with the report (GET), once, by who wants them
    const { phases, ...rest } = report;
    const head: AuditReportHead = { ...rest, phases: phases.map((p) => ({ ...phaseSummaryOf(p), error: p.error })) };
    await events.append(stream, { tenant_id: tenantId, type: 'audit.finished', data: head });
    // the stream goes when the report does, not a week later
    await deps.redis.expire(events.key(stream), settings.reportTtlSeconds);
  }

  /**
   * A finished report whose log lacks its end (stored, then Redis refused the event, and no job is left to
   * append it) gets it now, once (a claim): a stream waiting for it ends with it, a reconnect is sent it.
   */
  async function ensureEnded(tenantId: string, report: AuditReport): Promise<void> {
    if (report.status === 'running') return;
    const [last] = await events.newestFirst(scopes.audit(report.report_id).stream, '0-0', '+', 1);
    if (last?.type === 'audit.finished') return;
    const claim = renewedClaim(deps.redis, `${queues.prefix}:audit:end:${report.report_id}`, ASSEMBLE_CLAIM_MS);
    const token = await claim.take();
    if (!token) return;
    try {
      await claim.holding(token, () => appendEnd(tenantId, report));
    } finally {
      await claim.release(token);
    }
  }

  /**
   * Finishes again, from its ledger entry, a report that was assembled but reads running: Redis came back
   * with older data (a restart from an older save, a failover to a lagging replica). The ledger keeps its one
   * entry. A phase whose whole result Redis no longer has is its summary: its findings counted, not listed.
   */
  async function restoreClaimed(tenantId: string, current: AuditReport, entry: LedgerEntry): Promise<AuditReport> {
    const id = current.report_id;
    const [kept] = await ledger.payloads(tenantId, [entry.payload_digest]);
    if (!kept) throw new Error(`the ledger's entry ${entry.seq} of audit report ${id} has no payload`);
    const summary = JSON.parse(kept.body) as ReportSummary;
    const results = new Map(current.phases.map((p) => [p.phase, p]));
    const phases = summary.phases.map((s): AuditPhaseResult => {
      const full = results.get(s.phase);
      if (full && full.status === s.status && full.duration_ms === s.duration_ms && canonicalJson(full.counts) === canonicalJson(s.counts)) return full;
      return {
        ...s,
        findings: [],
        findings_omitted: SEVERITIES.reduce((n, k) => n + s.counts[k], 0),
        metrics: {},
        error: s.status === 'completed' ? null : "the phase's result was lost with Redis's data: the evidence ledger keeps its summary",
      };
    });
    for (const p of phases) if (results.get(p.phase) !== p) await emitPhase(tenantId, id, p);
    const report: AuditReport = {
      ...current,
      workspace: summary.workspace,
      started_at: summary.started_at,
      finished_at: summary.finished_at,
      status: summary.status,
      trigger: summary.trigger,
      phases,
      totals: summary.totals,
      scores: summary.scores,
      ledger: { seq: entry.seq, hash: entry.hash },
    };
    await finishWith(tenantId, report);
    log.warn(
      { tenant_id: tenantId, report_id: id, status: report.status, ledger_seq: entry.seq },
      'audit read running though its ledger entry exists: finished from it',
    );
    return report;
  }

  /** Assembles a report whose claim this process holds: every phase's result, the ledger entry, the end of its stream. */
  async function assembleClaimed(tenantId: string, id: string, current: AuditReport, canceled: boolean): Promise<AuditReport> {
    // the ledger, not Redis, says whether it was assembled: Redis may have come back older than the store
    const recorded = await ledger.firstOfReport(tenantId, REPORT_KIND, id);
    if (recorded) return restoreClaimed(tenantId, current, recorded);
    const at = clock.now().toISOString();
    const kept = new Map(current.phases.map((p) => [p.phase, p]));
    const missing = canceled ? `${CANCELED} before the phase reported` : 'the phase did not report (its job failed or was lost)';
    const phases = current.phases_requested.map((phase): AuditPhaseResult => kept.get(phase) ?? notCompleted(phase, 'failed', 0, missing));
    for (const p of phases) if (!kept.has(p.phase)) await emitPhase(tenantId, id, p);
    const totals = zero();
    for (const p of phases) for (const s of SEVERITIES) totals[s] += p.counts[s];
    const report: AuditReport = {
      ...current,
      finished_at: at,
      status: phases.every((p) => p.status === 'completed') ? 'completed' : 'partial',
      phases,
      totals,
      scores: Object.fromEntries(phases.map((p) => [p.phase, p.score])),
    };
    const [entry] = await ledger.append(tenantId, [
      {
        kind: REPORT_KIND,
        subject: { workspace: report.workspace, report_id: id, ...(report.trigger.type === 'run' ? { run_id: report.trigger.run_id } : {}) },
        payload: {
          report_id: id,
          workspace: report.workspace,
          status: report.status,
          started_at: report.started_at,
          finished_at: report.finished_at,
          trigger: report.trigger,
          totals,
          scores: report.scores,
          phases: phases.map(phaseSummaryOf),
          /** the whole report's digest: a copy kept elsewhere can be checked against the ledger */
          report_digest: sha256Hex(canonicalJson({ ...report, ledger: null })),
        } satisfies ReportSummary,
      },
    ]);
    report.ledger = { seq: entry!.seq, hash: entry!.hash };
    await finishWith(tenantId, report);
    log.info({ tenant_id: tenantId, report_id: id, status: report.status, totals }, 'audit finished');
    return report;
  }

  /**
   * Takes back an audit whose start Redis completed after its request was answered 503: the client never
   * learned its id. The report first (its tenant's place is free at once, and a phase finds nothing to run),
   * then its jobs (all unless a phase runs already: that phase stops, finding no report, and the report job
   * assembles nothing), so no ledger entry follows.
   */
  async function withdraw(tenantId: string, id: string): Promise<void> {
    await reports.remove(tenantId, id);
    await queues.get('audits').remove(`${id}__report`, { removeChildren: true });
    await deps.redis.del(events.key(scopes.audit(id).stream));
    log.warn({ tenant_id: tenantId, report_id: id }, 'audit started after its request was answered 503: taken back');
  }

  const api = {
    reports,
    rootOf,

    /** Starts an audit: the report (running) first, then the flow. */
    async start(tenantId: string, req: AuditRequest): Promise<AuditReport> {
      let layers: AuditLayer[] | null = null;
      try {
        layers = req.layers ? parseLayers(req.layers) : null;
        if (layers?.length === 0) layers = null;
      } catch (err) {
        throw new ValidationError(`layers: ${(err as Error).message}`, [{ path: req.layersAt ?? '/body/layers', message: (err as Error).message }]);
      }
      const ws = await rootOf(tenantId, req);
      const phases = AUDIT_PHASES.filter((p) => !req.phases?.length || req.phases.includes(p));
      const now = clock.now();
      const report: AuditReport = {
        report_id: newId('aud'),
        workspace: ws.name,
        phases_requested: phases,
        started_at: now.toISOString(),
        finished_at: null,
        status: 'running',
        trigger: req.trigger,
        phases: [],
        totals: zero(),
        scores: {},
        ledger: null,
      };
      const data = (phase?: AuditPhase): AuditJob => ({ tenant_id: tenantId, report_id: report.report_id, ...(phase ? { phase } : {}) });
      flows ??= new FlowProducer({ connection: deps.redis, prefix: queues.prefix });
      let created = false;
      const begin = async () => {
        // a request's deadline goes into the report's creation: a Redis stalled past it (the request answered
        // 503) makes nothing when it runs the script later
        const deadline = req.waitForRedis ? 0 : Date.now() + REDIS_DEADLINE_MS;
        let made = await reports.create(tenantId, report, { phases, layers }, now.getTime(), deadline);
        if (!made && Date.now() < deadline) {
          // refused as late by Redis's clock, answered in time by this one's: the clocks disagree, and the
          // answer's own timing is what counts
          log.warn({ tenant_id: tenantId, report_id: report.report_id }, "Redis's clock is ahead of this process's: an audit's deadline is not checked");
          made = await reports.create(tenantId, report, { phases, layers }, now.getTime());
        }
        if (!made) throw new ServiceUnavailableError('Redis ran the start of the audit after its request was answered: nothing was started', 5);
        created = true;
        await flows!.add(
          jobTree(
            'audits',
            report.report_id,
            { name: 'report', data: data() },
            phases.map((phase) => ({ key: phase, name: 'phase', data: data(phase) })),
          ),
        );
      };
      // the report and its jobs live in Redis: without it a request's audit is refused (503), not held until it
      // returns; what Redis makes of it after that answer (the flow added past the deadline) is taken back
      const takeBack = (late: Promise<void>) =>
        void late
          .catch(() => undefined)
          .then(() => (created ? withdraw(tenantId, report.report_id) : undefined))
          .catch((err: Error) =>
            log.error(
              { tenant_id: tenantId, report_id: report.report_id, err: err.message },
              'an audit started after its request was answered 503: not taken back',
            ),
          );
      await (req.waitForRedis ? begin() : redisOrUnavailable(deps.redis, 'starting an audit', begin, takeBack));
      log.info({ tenant_id: tenantId, report_id: report.report_id, workspace: ws.name, phases }, 'audit started');
      return report;
    },

    /** A child job: one phase in the sandbox; its result is kept and streamed at once. Null when the report is over or gone. */
    /**
     * Stops every phase this process runs, as it shuts down: none keeps a result, and each one's job goes back to
     * the queue for another worker (waited for, a phase outlived the grace period and its job spent its one stall;
     * two restarts failed the phase). How many.
     */
    interruptAll: (): number => interruptEvery(running),

    async runPhaseJob(tenantId: string, id: string, phase: AuditPhase): Promise<AuditPhaseResult | null | 'busy' | 'interrupted'> {
      const got = await reports.get(tenantId, id);
      if (!got || got.report.status !== 'running') return null;
      const done = got.report.phases.find((p) => p.phase === phase);
      if (done) return done; // a redelivered job: the phase already reported
      // canceled before it started: it does not run, nor hold a worker (the report, assembled, says so)
      if (got.canceled) return null;
      // started by a run's attempt that ended (its worker died mid-step; the job came back to another): no one
      // waits for it, and the run's next attempt starts an audit of its own
      const t = got.report.trigger;
      if (t.type === 'run' && t.attempt !== undefined) {
        const run = await deps.store.runs.get(tenantId, t.run_id);
        if (run?.status !== 'running' || run.attempt !== t.attempt) {
          await api.cancel(tenantId, id);
          return null;
        }
      }
      // assembled already, though Redis reads it running (it came back with older data): the report is
      // finished from its ledger entry, and the phase does not run again
      if (await ledger.firstOfReport(tenantId, REPORT_KIND, id)) {
        await api.assemble(tenantId, id);
        return null;
      }
      // a place among the tenant's phases running at once (SERVICE_AUDIT_TENANT_CONCURRENCY), renewed while it runs:
      // the audits queue is one line for every tenant, and one tenant's three audits (twelve phases) held every
      // worker place while another tenant's audit waited 147 s for its 7. Without one, the phase waits, holding no worker
      const place = placeAmong(deps.redis, `${queues.prefix}:audit-places:${tenantId}`, `${id}:${phase}`, settings.tenantConcurrency, PLACE_HOLD_MS);
      if (!(await place.take())) return 'busy';
      const renew = setInterval(place.renew, PLACE_HOLD_MS / 3);
      const started = performance.now();
      const controller = new AbortController();
      const mine = running.get(id) ?? new Set();
      running.set(id, mine.add(controller));
      // a cancel asked in another process (the one running the step that waits) reaches this one through the
      // report's mark; a report assembled or taken back meanwhile has no use for the phase either
      const watch = setInterval(() => {
        void reports.isWanted(tenantId, id).then(
          (wanted) => wanted || controller.abort(CANCELED),
          () => undefined,
        );
      }, CANCEL_POLL_MS);
      let result: AuditPhaseResult;
      try {
        const dir = await dirOf(tenantId, got.report);
        // the folder checked is the folder read: its identity goes to the phase, which refuses another one
        // (a link swapped in between the check and the sandbox's mount)
        const st = await fs.stat(dir);
        if ((await fs.realpath(dir)) !== dir) throw new Error('the workspace moved while the phase started');
        const out = await runPhase(sandbox, dir, phase, {
          layers: got.options.layers,
          identity: `${st.dev}:${st.ino}`,
          tenantRoot: await fs.realpath(await tenantRoot(settings, tenantId)).catch(() => null),
          timeoutMs: settings.phaseTimeoutSeconds * 1000,
          signal: controller.signal,
        });
        if (phase === 'health') await healthExtras(tenantId, got.report, out);
        result = {
          phase,
          status: 'completed',
          duration_ms: Math.round(performance.now() - started),
          findings: out.findings,
          findings_omitted: out.findings_omitted,
          counts: out.counts,
          score: scoreOf(out.counts),
          metrics: out.metrics,
          error: null,
        };
      } catch (err) {
        // a phase that cannot run (its folder gone, a crash, its timeout) makes the report partial, not stuck
        result = notCompleted(phase, err instanceof PhaseError ? err.status : 'failed', Math.round(performance.now() - started), (err as Error).message);
        log.warn({ tenant_id: tenantId, report_id: id, phase, err: result.error }, 'audit phase did not complete');
      } finally {
        clearInterval(renew);
        await place.give();
        clearInterval(watch);
        mine.delete(controller);
        if (!mine.size) running.delete(id);
      }
      // stopped because this process stops: no result of it; its job goes back to the queue
      if (controller.signal.reason === SHUTDOWN_REASON) return 'interrupted';
      // stopped by a cancel after its report was assembled (which says the phase was canceled): nothing to add
      if (controller.signal.aborted && (await reports.status(tenantId, id)) !== 'running') return null;
      if (!(await reports.putPhase(tenantId, id, phase, result))) return null;
      await emitPhase(tenantId, id, result);
      return result;
    },

    /** The parent job: the report from every phase's result (failed when a phase has none), into the ledger, once. */
    async assemble(tenantId: string, id: string): Promise<AuditReport | null> {
      const got = await reports.get(tenantId, id);
      if (!got) {
        await reports.dropRunning(tenantId, id);
        return null;
      }
      if (got.report.status !== 'running') {
        await reports.dropRunning(tenantId, id); // done, but still counted running (a process stopped half way)
        await ensureEnded(tenantId, got.report);
        return got.report;
      }
      const claim = renewedClaim(deps.redis, `${queues.prefix}:audit:assemble:${id}`, ASSEMBLE_CLAIM_MS);
      const token = await claim.take();
      if (!token) return got.report;
      try {
        return await claim.holding(token, async () => {
          // the phases read again as the report is closed to them: one that ended since the read above is kept, and
          // one that ends from now on adds nothing (its phase_done would follow the one the assembly tells for it)
          const closed = await reports.closeForAssembly(tenantId, id, clock.now().toISOString());
          if (!closed) {
            await reports.dropRunning(tenantId, id);
            return null;
          }
          if (closed.report.status !== 'running') return closed.report;
          return assembleClaimed(tenantId, id, closed.report, closed.canceled);
        });
      } finally {
        // done (the report ended), or failed: a retry (the job's, or the reconciler's) may try at once
        await claim.release(token);
      }
    },
    /** Whether a stream resumed after `afterId` has anything left to send: false once the report is out and seen. */
    async hasMore(tenantId: string, id: string, afterId: string): Promise<boolean> {
      return redisOrUnavailable(deps.redis, 'reading an audit', async () => {
        const { report } = await mustGet(tenantId, id);
        await ensureEnded(tenantId, report);
        return report.status === 'running' || (await events.after(scopes.audit(id).stream, afterId, 1)).length > 0;
      });
    },

    /**
     * Whether a report's stream may still end (asked at a stream's heartbeats): false once the report is gone
     * (Redis lost it, or it expired); a finished one whose end the log lacks is given it (ensureEnded).
     */
    async stillThere(tenantId: string, id: string): Promise<boolean> {
      const got = await reports.get(tenantId, id);
      if (!got) return false;
      await ensureEnded(tenantId, got.report);
      return true;
    },

    /** The report now; a 404 problem when it is unknown, expired or evicted (reports live in Redis: 503 without it). */
    async get(tenantId: string, id: string): Promise<AuditReport> {
      return (await redisOrUnavailable(deps.redis, 'reading an audit', () => mustGet(tenantId, id))).report;
    },

    /**
     * Waits for a report to be assembled, up to `timeoutMs`; the report as it stands then. An abort ends
     * the wait, and cancels the audit (see cancel) unless `keepRunning` (a client that went away).
     */
    async wait(tenantId: string, id: string, opts: { timeoutMs: number; signal?: AbortSignal; keepRunning?: boolean }): Promise<AuditReport> {
      const until = performance.now() + opts.timeoutMs;
      for (;;) {
        // the head alone while it runs (a few hundred bytes); the whole report once it is over
        const status = await reports.status(tenantId, id);
        if (!status) throw notFound(id);
        if (status !== 'running' || performance.now() >= until) return (await mustGet(tenantId, id)).report;
        if (opts.signal?.aborted) return opts.keepRunning ? (await mustGet(tenantId, id)).report : api.cancel(tenantId, id);
        await new Promise((resolve) => setTimeout(resolve, Math.min(WAIT_POLL_MS, Math.max(1, until - performance.now()))));
      }
    },

    /**
     * Cancels an audit (a run that waited on it was canceled): its report is marked in Redis, so that its phases
     * stop in every worker process within CANCEL_POLL_MS and those not started do not start, and it is assembled
     * now (partial, each phase that did not complete saying it was canceled), its tenant's place freed at once.
     * The report as it ends; one that ended already is left as it was.
     */
    async cancel(tenantId: string, id: string): Promise<AuditReport> {
      await reports.markCanceled(tenantId, id, clock.now().toISOString());
      for (const c of running.get(id) ?? []) c.abort(CANCELED);
      const report = await api.assemble(tenantId, id);
      if (!report) throw notFound(id);
      return report;
    },

    /**
     * Finishes reports whose flow was lost (the process died between the report and the flow, Redis lost
     * the jobs, or a redelivered report job ended on a dead process's claim) or whose phase stayed active far past its timeout: a report never stays `running` for good.
     */
    async reconcile(olderThanMs = 60_000): Promise<number> {
      const phasesWaiting = async (tenantId: string, id: string) => {
        const got = await reports.get(tenantId, id);
        const states = await Promise.all(
          (got?.report.phases_requested ?? []).map(async (phase) => (await queues.get('audits').getJob(`${id}__${phase}`))?.getState()),
        );
        return states.some((st) => st === 'waiting' || st === 'prioritized' || st === 'delayed' || st === 'waiting-children');
      };
      const now = clock.now().getTime();
      const overdue = now - (2 * settings.phaseTimeoutSeconds * 1000 + 300_000);
      let repaired = 0;
      for (const { tenantId, id, startedMs } of await reports.listRunning(now - olderThanMs, 200)) {
        // a report that ended (or went) but still holds its tenant's place: it leaves the running sets
        if ((await reports.status(tenantId, id)) !== 'running') {
          await reports.dropRunning(tenantId, id);
          continue;
        }
        const parent = await queues.get('audits').getJob(`${id}__report`);
        const state = parent ? await parent.getState() : 'missing';
        // a report job that completed with its report still running ended without assembling it: it found the
        // claim of a process that died assembling (the job was redelivered), and no job is left to do it
        const lost = state === 'missing' || state === 'failed' || state === 'unknown' || state === 'completed';
        if (!lost && startedMs > overdue) continue;
        // far past every phase's timeout, but a phase still waits for a worker (a backlog, a nightly burst of
        // audits): the flow is alive, and its phases have all their time once they start
        if (!lost && (await phasesWaiting(tenantId, id))) continue;
        // read after the job's state: a report assembled since the list was read is not taken for lost
        if ((await reports.status(tenantId, id)) !== 'running') continue;
        await api.assemble(tenantId, id);
        repaired++;
      }
      if (repaired) log.warn({ repaired }, 'reconciler finished audits whose flow was lost');
      return repaired;
    },

    async close(): Promise<void> {
      await flows?.close();
    },
  };
  return api;
}

export type Audits = ReturnType<typeof auditsOf>;
