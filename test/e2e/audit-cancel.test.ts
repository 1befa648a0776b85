// A canceled audit, its phases run by another worker process than the one that waits on it: the report is
// marked canceled in Redis, so the phase running there stops within half a second and the phases still
// queued do not start; the run's cancel assembles it at once (partial, each phase saying it was canceled),
// its tenant's place is free, and the evidence ledger has its one entry.
import { spawnSync } from 'node:child_process';
import fs from 'node:fs/promises';
import path from 'node:path';
import { expect } from 'chai';
import { eventually, finishedRun, sameDeployment, startHarness, type Harness } from '../support/harness.js';
import { makeFlawedProject } from '../support/projects.js';
import { processorsOf, startWorkers, type Workers } from '../../workers/index.js';

type Body = Record<string, any>;

describe('workspace audit canceled', function () {
  this.timeout(120_000);
  /** the web process, and the worker process that runs runs (an `audit` step waits there) */
  let h: Harness;
  /** another worker process of the deployment: it runs the audits' phases, one at a time */
  let other: Harness;
  const workers: Workers[] = [];
  /** the phase processes a test stopped: killed at its end whatever happened */
  const held: number[] = [];

  before(async () => {
    const env = { SERVICE_AUDIT_CONCURRENCY: '1', SERVICE_AUDIT_REGISTRY_URL: 'none' };
    h = await startHarness({ workers: false, env });
    other = await startHarness({ workers: false, env: { ...sameDeployment(h), ...env } });
    workers.push(await startWorkers(h.rt, { runs: processorsOf(h.rt).runs! }));
    workers.push(await startWorkers(other.rt, { audits: processorsOf(other.rt).audits! }));
    await makeFlawedProject(h.tenantDir());
  });
  afterEach(() => {
    for (const pid of held.splice(0)) {
      try {
        process.kill(pid, 'SIGKILL');
      } catch {
        // gone, as it should be
      }
    }
  });
  after(async () => {
    for (const w of workers) await w.close();
    await other?.close();
    await h?.close();
  });

  /**
   * This harness's security phase (its workspace's identity is on the command line): the ids of its node
   * processes (not the sandbox's bwrap, whose command line holds the phase's too).
   */
  async function securityPhase(): Promise<number[]> {
    const st = await fs.stat(h.tenantDir());
    const argv0 = (pid: number) => spawnSync('cat', [`/proc/${pid}/cmdline`], { encoding: 'utf8' }).stdout.split('\0')[0] ?? '';
    return spawnSync('pgrep', ['-f', `phase-main.[jt]s security .*"identity":"${st.dev}:${st.ino}"`], { encoding: 'utf8' })
      .stdout.split('\n')
      .filter((l) => l.trim())
      .map(Number)
      .filter((pid) => path.basename(argv0(pid)).startsWith('node'));
  }
  const state = (pid: number) => /State:\s+(\w)/.exec(spawnSync('cat', [`/proc/${pid}/status`], { encoding: 'utf8' }).stdout)?.[1];

  /** Starts an audit of three phases as a run's step; answers once its security phase runs in the other process, held (stopped) there. */
  async function auditHeldInSecurity(): Promise<{ runId: string; reportId: string }> {
    const res = await h.call<Body>('POST', '/api/v1/autonomy/run', {
      body: { steps: [{ tool: 'audit', args: { phases: ['security', 'sanity', 'health'] } }] },
    });
    expect(res.status, res.text).to.equal(202);
    const pids = await eventually(async () => ((await securityPhase()).length ? securityPhase() : null), 'the security phase to start', 60_000);
    // stopped, it cannot end before the cancel however fast it would be; sanity and health wait in the queue
    for (const pid of pids) {
      held.push(pid);
      process.kill(pid, 'SIGSTOP');
      await eventually(() => state(pid) === 'T', 'the security phase to be stopped, not ended (it takes seconds)', 5000);
    }
    const running = await h.rt.engine.audits.reports.listRunning(Date.now(), 100);
    expect(running, 'the one audit running').to.have.length(1);
    return { runId: res.body.run_id as string, reportId: running[0]!.id };
  }

  const read = async (id: string) => (await h.call<Body>('GET', `/api/v1/autonomy/workspace-audit/${id}`)).body;
  const job = (id: string, name: string) => h.rt.queues.get('audits').getJob(`${id}__${name}`);
  const placesTaken = () => h.rt.redis.zcard(`${h.config.queuePrefix}:audit-running:{tenant-a}`);
  const ledgerEntries = async (id: string) =>
    (await h.rt.store.evidence.list('tenant-a', { limit: 1000 })).filter((e) => e.kind === 'audit.report' && e.subject.report_id === id);
  /** every job of the audit ended (the queued phases taken and dropped, the report job after them) */
  const jobsEnded = (id: string) =>
    eventually(
      async () => {
        for (const name of ['security', 'sanity', 'health', 'report']) if ((await (await job(id, name))?.getState()) !== 'completed') return null;
        return true;
      },
      'every job of the audit to end',
      30_000,
    );

  it("stops its phases in every worker process when the run is canceled, starts none of those queued, and frees the tenant's place at once", async () => {
    const { runId, reportId } = await auditHeldInSecurity();
    expect(await placesTaken()).to.equal(1);

    const canceled = await h.call<Body>('POST', `/api/v1/runs/${runId}/cancel`);
    expect(canceled.status, canceled.text).to.equal(202);
    expect((await finishedRun(h, runId)).status).to.equal('canceled');
    // assembled by the cancel, not when the phases would have ended (the security one never would: it is stopped)
    const report = await eventually(async () => ((await read(reportId)).status !== 'running' ? read(reportId) : null), 'the report', 15_000);
    expect(await placesTaken(), "the tenant's place").to.equal(0);
    expect(report.status).to.equal('partial');
    expect(report.phases.map((p: Body) => [p.phase, p.status, p.score])).to.deep.equal([
      ['security', 'failed', null],
      ['sanity', 'failed', null],
      ['health', 'failed', null],
    ]);
    for (const p of report.phases)
      expect(p.error, p.phase)
        .to.contain('canceled')
        .and.not.match(/SIGTERM|SIGKILL|exited/);
    // the phase running in the other process stops (its report's mark, read there), though stopped itself
    await eventually(async () => (await securityPhase()).length === 0, 'the security phase to be stopped', 10_000);
    // the queued phases are taken and dropped without running; the report job after them adds nothing
    await jobsEnded(reportId);
    for (const name of ['sanity', 'health']) expect((await job(reportId, name))!.returnvalue, `${name} ran`).to.equal(null);
    const entries = await ledgerEntries(reportId);
    expect(entries, 'audit.report entries of the report').to.have.length(1);
    expect(report.ledger).to.deep.equal({ seq: entries[0]!.seq, hash: entries[0]!.hash });
    expect(await read(reportId)).to.deep.equal(report);
  });

  it('runs no phase of an audit whose run moved on from the attempt that started it (its worker died mid-step): the report ends canceled', async () => {
    const posted = await h.call<Body>('POST', '/api/v1/autonomy/run', { body: { steps: [{ tool: 'shell', args: { command: 'true' } }] } });
    const run = await finishedRun(h, posted.body.run_id);
    // started by the run's attempt 1, whose step no one waits on any more: the run ended (or runs a later attempt)
    const started = await h.rt.engine.audits.start('tenant-a', {
      phases: ['sanity', 'health'],
      trigger: { type: 'run', run_id: run.id, session_id: run.session_id, attempt: run.attempt },
      waitForRedis: true,
    });
    const report = await eventually(async () => ((await read(started.report_id)).status !== 'running' ? read(started.report_id) : null), 'the report', 30_000);
    expect(report.status).to.equal('partial');
    expect(report.trigger).to.deep.equal({ type: 'run', run_id: run.id, session_id: run.session_id, attempt: run.attempt });
    for (const p of report.phases) {
      expect(p.status, p.phase).to.equal('failed');
      expect(p.error, p.phase).to.contain('canceled');
    }
    const ended = async (name: string) => (await (await job(started.report_id, name))?.getState()) === 'completed';
    await eventually(async () => ((await ended('sanity')) && (await ended('health')) && (await ended('report'))) || null, 'the audit’s jobs to end', 30_000);
    for (const name of ['sanity', 'health']) expect((await job(started.report_id, name))!.returnvalue, `${name} ran`).to.equal(null);
  });

  it('ends an audit marked canceled though no process assembles it then: the running phase says it was canceled, not the signal it died by', async () => {
    const { reportId } = await auditHeldInSecurity();
    // the mark alone, as a cancel leaves it when its process stops before it assembles: the phases read it
    expect(await h.rt.engine.audits.reports.markCanceled('tenant-a', reportId, new Date().toISOString())).to.equal(true);
    await jobsEnded(reportId);
    const report = await read(reportId);
    expect(report.status).to.equal('partial');
    const [security, sanity, health] = report.phases;
    expect(security).to.deep.include({ phase: 'security', status: 'failed', score: null });
    expect(security.error).to.match(/^the security phase was canceled/);
    for (const p of [sanity, health]) expect(p.error, p.phase).to.match(/canceled .*before the phase reported/);
    expect(await placesTaken()).to.equal(0);
    expect(await ledgerEntries(reportId)).to.have.length(1);
  });

  it('tells each phase’s end once: a phase that ends while its report is being assembled adds nothing, and the report keeps what the stream said', async () => {
    const { reportId } = await auditHeldInSecurity();
    // the assembly held at its ledger entry, after it has read the phases and told those missing as failed
    const evidence = h.rt.store.evidence;
    const append = evidence.append;
    let reached!: () => void;
    const atLedger = new Promise<void>((resolve) => (reached = resolve));
    let go!: () => void;
    const released = new Promise<void>((resolve) => (go = resolve));
    evidence.append = async (...args) => {
      reached();
      await released;
      return append.apply(evidence, args);
    };
    try {
      const assembling = h.rt.engine.audits.assemble('tenant-a', reportId);
      await atLedger;
      // meanwhile the security phase ends, completed, its report still running: it must neither be kept nor told
      for (const pid of held) process.kill(pid, 'SIGCONT');
      await eventually(async () => (await securityPhase()).length === 0, 'the security phase to end', 30_000);
      await eventually(async () => (await (await job(reportId, 'security'))?.getState()) === 'completed', 'its job to end', 30_000);
      go();
      expect((await assembling)!.status).to.equal('partial');
    } finally {
      evidence.append = append;
      go();
    }
    await jobsEnded(reportId);
    const events = await h.rt.events.after(`audit:${reportId}`, '0-0', 100);
    const told = events.filter((e) => e.type === 'audit.phase_done').map((e) => (e.data as Body).phase);
    expect(told.sort(), 'one phase_done a phase').to.deep.equal(['health', 'sanity', 'security']);
    const report = await read(reportId);
    expect(report.phases.find((p: Body) => p.phase === 'security').status).to.equal('failed');
    const doneFor = (phase: string) => events.find((e) => e.type === 'audit.phase_done' && (e.data as Body).phase === phase)!.data as Body;
    expect(doneFor('security').status, 'the stream and the report agree').to.equal('failed');
    expect(await ledgerEntries(reportId)).to.have.length(1);
  });

  it('hands a phase it runs back to the queue as its workers close (a deploy): no result kept, none of the job’s attempts or stalls spent; another worker runs it', async () => {
    const { reportId } = await auditHeldInSecurity();
    const closing = workers[1]!;
    const deadline = Date.now() + 3000;
    // interrupted 2.5 s before the deadline: the phase, held, would otherwise be waited for past it
    await closing.close(deadline);
    expect(Date.now(), 'closed before the grace period’s end').to.be.below(deadline);
    const security = (await job(reportId, 'security'))!;
    expect(await security.getState()).to.be.oneOf(['waiting', 'delayed', 'wait']);
    expect({ attempts: security.attemptsMade, stalls: security.stalledCounter }).to.deep.equal({ attempts: 0, stalls: 0 });
    expect((await read(reportId)).status).to.equal('running');
    await eventually(async () => (await securityPhase()).length === 0, 'the held phase to be stopped', 10_000);
    // another worker runs it from the start, and the audit ends with every phase's result
    workers[1] = await startWorkers(other.rt, { audits: processorsOf(other.rt).audits! });
    const report = await eventually(
      async () => {
        const r = await read(reportId);
        return r.status === 'running' ? null : r;
      },
      'the audit to end',
      60_000,
    );
    expect(report.phases.map((p: Body) => [p.phase, p.status]).sort()).to.deep.equal([
      ['health', 'completed'],
      ['sanity', 'completed'],
      ['security', 'completed'],
    ]);
  });
});
