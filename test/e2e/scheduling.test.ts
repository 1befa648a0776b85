// Per-tenant concurrency, queued cancels, the reconciler, and runs whose worker dies.
import { spawn } from 'node:child_process';
import { expect } from 'chai';
import { newId } from '../../engine/platform/ids.js';
import { runFixture } from '../integration/store-contract.js';
import { builtEntry } from '../support/built.js';
import { eventually, KEYS, processesMatching, releasable, startHarness, type Harness } from '../support/harness.js';

type RunBody = Record<string, any>;
const TERMINAL = ['succeeded', 'failed', 'canceled', 'timed_out'];

/** The environment of a worker process that shares the harness's Redis prefix, store and workspace. */
function workerEnv(h: Harness, extra: Record<string, string>): NodeJS.ProcessEnv {
  return {
    ...process.env,
    REDIS_URL: h.config.redisUrl,
    SERVICE_QUEUE_PREFIX: h.config.queuePrefix,
    SERVICE_DATA_DIR: h.config.dataDir,
    SERVICE_WORKSPACE_ROOT: h.workspace,
    LOG_LEVEL: 'warn',
    ...extra,
  };
}

function killGroups(...procs: ({ pid?: number } | undefined)[]): void {
  for (const p of procs) {
    try {
      if (p?.pid) process.kill(-p.pid, 'SIGKILL');
    } catch {
      // gone
    }
  }
}

async function runStatus(h: Harness, id: string, key = KEYS.a): Promise<RunBody> {
  return (await h.call<RunBody>('GET', `/api/v1/runs/${id}`, { key })).body;
}

describe('scheduling', function () {
  this.timeout(40_000);

  it('runs at most SERVICE_TENANT_MAX_RUNNING of a tenant at once, and another tenant does not wait behind it', async () => {
    const h = await startHarness({ env: { SERVICE_TENANT_MAX_RUNNING: '2' } });
    try {
      // every run goes on until the test lets its wave end (a file in its tenant's workspace), so each wave and
      // tenant B's run are seen running while the rest of A's backlog waits, however slowly the machine starts them
      const waves = [0, 1, 2].map((n) => releasable(h, `release-scheduling-${n}`));
      const other = releasable(h, 'release-scheduling-b');
      const a: string[] = [];
      for (const wave of [0, 0, 1, 1, 2])
        a.push((await h.call('POST', '/api/v1/autonomy/run', { body: { steps: [{ tool: 'shell', args: { command: waves[wave]!.command } }] } })).body.run_id);
      const b = (await h.call('POST', '/api/v1/autonomy/run', { body: { steps: [{ tool: 'shell', args: { command: other.command } }] }, key: KEYS.b })).body
        .run_id;
      let maxRunning = 0;
      let bStartedWhileAWaited = false;
      const look = async () => {
        const runs = await Promise.all(a.map((id) => runStatus(h, id)));
        // counted in one read of the store: five reads one after another can see a run that has ended and
        // the one that took its slot both running
        const listed = await h.call<{ data: RunBody[] }>('GET', '/api/v1/runs?status=running&limit=100');
        const running = listed.body.data.filter((r) => a.includes(r.id as string)).length;
        maxRunning = Math.max(maxRunning, running);
        const theirs = await runStatus(h, b, KEYS.b);
        if (theirs.status !== 'queued' && runs.some((r) => r.status === 'queued')) bStartedWhileAWaited = true;
        return { statuses: runs.map((r) => r.status), theirs };
      };
      // first come, first served within the tenant, two at a time: each wave runs only once the one before ended
      const expected = [
        ['running', 'running', 'queued', 'queued', 'queued'],
        ['succeeded', 'succeeded', 'running', 'running', 'queued'],
        ['succeeded', 'succeeded', 'succeeded', 'succeeded', 'running'],
      ];
      for (const [n, statuses] of expected.entries()) {
        if (n > 0) await waves[n - 1]!.release('tenant-a');
        await eventually(
          async () => {
            const now = await look();
            return (now.theirs.status === 'running' && JSON.stringify(now.statuses) === JSON.stringify(statuses)) || null;
          },
          `tenant A's runs to be ${statuses.join(', ')}, and tenant B's running`,
        );
      }
      await waves[2]!.release('tenant-a');
      await other.release('tenant-b');
      await eventually(async () => {
        const { statuses, theirs } = await look();
        return statuses.every((status) => TERMINAL.includes(status as string)) && TERMINAL.includes(theirs.status);
      }, 'every run to finish');
      expect(maxRunning).to.equal(2);
      expect(bStartedWhileAWaited, "tenant B's run started while tenant A's backlog waited").to.equal(true);
      const runs = await Promise.all(a.map((id) => runStatus(h, id)));
      expect(runs.every((r) => r.status === 'succeeded')).to.equal(true);
    } finally {
      await h.close();
    }
  });

  it('cancels a queued run at once and lets the next one in', async () => {
    const h = await startHarness({ env: { SERVICE_TENANT_MAX_RUNNING: '1' } });
    try {
      // the first run holds the one slot until the test lets it end, after the cancel (a run that slept 1 s
      // could end first on a busy machine, and the second start)
      const slot = releasable(h, 'release-queued-cancel');
      const first = (await h.call('POST', '/api/v1/autonomy/run', { body: { steps: [{ tool: 'shell', args: { command: slot.command } }] } })).body.run_id;
      const second = (await h.call('POST', '/api/v1/autonomy/run', { body: { steps: [{ tool: 'shell', args: { command: 'true' } }] } })).body.run_id;
      const third = (await h.call('POST', '/api/v1/autonomy/run', { body: { steps: [{ tool: 'shell', args: { command: 'true' } }] } })).body.run_id;
      const cancel = await h.call('POST', `/api/v1/runs/${second}/cancel`);
      expect(cancel.status).to.equal(200);
      expect(cancel.body.status).to.equal('canceled');
      await slot.release();
      await eventually(async () => (await runStatus(h, third)).status === 'succeeded', 'the third run');
      expect((await runStatus(h, first)).status).to.equal('succeeded');
      expect((await runStatus(h, second)).steps[0].status).to.equal('pending');
    } finally {
      await h.close();
    }
  });

  it('gives a run’s slot back while it waits out a retry’s backoff, and its next attempt waits in line for one', async () => {
    const h = await startHarness({ env: { SERVICE_TENANT_MAX_RUNNING: '1' } });
    try {
      // fails its first attempt, succeeds its second, 6 s later
      const flaky = {
        steps: [{ tool: 'shell', args: { command: 'if [ -e tried ]; then exit 0; fi; touch tried; exit 3' } }],
        retry: { attempts: 2, backoff: { type: 'fixed', delay_ms: 6000 } },
      };
      const a = (await h.call('POST', '/api/v1/autonomy/run', { body: flaky })).body.run_id;
      await eventually(async () => (await runStatus(h, a)).attempt === 2, 'the retry');
      // while it waits, the tenant's one slot is free: another run starts
      const slot = releasable(h, 'release-after-backoff');
      const c = (await h.call('POST', '/api/v1/autonomy/run', { body: { steps: [{ tool: 'shell', args: { command: slot.command } }] } })).body.run_id;
      await eventually(async () => (await runStatus(h, c)).status === 'running', 'the other run to start');
      expect(await runStatus(h, a)).to.deep.include({ status: 'queued', attempt: 2 });
      // its next attempt comes while that run holds the slot: it waits in the tenant's line, not beside it
      const context = async () => (await h.call<RunBody>('GET', '/api/v1/autonomy/reliability-context')).body.tenant;
      await eventually(async () => (await context()).waiting === 1, 'the next attempt in line');
      expect((await runStatus(h, a)).status).to.equal('queued');
      await slot.release();
      await eventually(async () => (await runStatus(h, a)).status === 'succeeded', 'the second attempt');
      expect((await runStatus(h, c)).status).to.equal('succeeded');
      await eventually(async () => (await context()).running === 0, 'the slot back');
    } finally {
      await h.close();
    }
  });

  it('keeps a retried run’s slot when Redis refused its release: its next attempt runs in it, and no other run of the tenant beside it', async () => {
    const h = await startHarness({ env: { SERVICE_TENANT_MAX_RUNNING: '1' } });
    const redis = h.rt.redis;
    const send = redis.sendCommand;
    try {
      // fails its first attempt; its second, at once, runs until the test lets it end
      const go = releasable(h, 'release-kept-slot');
      const flaky = {
        steps: [{ tool: 'shell', args: { command: `if [ -e tried ]; then ${go.command}; exit 0; fi; touch tried; exit 3` } }],
        retry: { attempts: 2, backoff: { type: 'fixed', delay_ms: 0 } },
      };
      let refused = 0;
      let a = '';
      // Redis refuses the release of the run's slot as its first attempt settles (once)
      redis.sendCommand = function (this: typeof redis, command: Parameters<typeof send>[0], ...rest: unknown[]) {
        const args = (command as { args?: unknown[] }).args?.map(String) ?? [];
        if (a && !refused && args.includes('slots.release') && args.includes(a)) {
          refused++;
          (command as unknown as { reject(err: Error): void }).reject(new Error('OOM command not allowed when used memory > maxmemory'));
          return (command as unknown as { promise: Promise<unknown> }).promise;
        }
        return (send as (...a: unknown[]) => unknown).call(this, command, ...rest);
      } as typeof send;
      a = (await h.call('POST', '/api/v1/autonomy/run', { body: flaky })).body.run_id;
      await eventually(async () => {
        const run = await runStatus(h, a);
        return run.attempt === 2 && run.status === 'running';
      }, 'the second attempt to run');
      expect(refused).to.equal(1);
      const b = (await h.call('POST', '/api/v1/autonomy/run', { body: { steps: [{ tool: 'shell', args: { command: 'true' } }] } })).body.run_id;
      // a release tried again later would free the slot the second attempt runs in, and let this one in beside it
      await new Promise((r) => setTimeout(r, 2500));
      expect((await runStatus(h, b)).status).to.equal('queued');
      await go.release();
      await eventually(async () => (await runStatus(h, b)).status === 'succeeded', 'the other run, once the slot is free');
      expect((await runStatus(h, a)).status).to.equal('succeeded');
    } finally {
      redis.sendCommand = send;
      await h.close();
    }
  });

  it('refuses a new run or task with 429 once SERVICE_TENANT_MAX_WAITING of the tenant’s runs wait, storing nothing; replays and other tenants still go', async () => {
    // no workers: nothing drains the line while the test fills it
    const h = await startHarness({ workers: false, env: { SERVICE_TENANT_MAX_RUNNING: '1', SERVICE_TENANT_MAX_WAITING: '2' } });
    try {
      const body = { steps: [{ tool: 'shell', args: { command: 'true' } }] };
      const post = (key = KEYS.a, headers: Record<string, string> = {}) => h.call<RunBody>('POST', '/api/v1/autonomy/run', { body, key, headers });
      const admitted = await post();
      const waiting = [await post(KEYS.a, { 'idempotency-key': 'second' }), await post()];
      expect([admitted, ...waiting].map((r) => r.status)).to.deep.equal([202, 202, 202]);
      const count = async () => (await h.call<RunBody>('GET', '/api/v1/runs?limit=100')).body.data.length;
      expect(await count()).to.equal(3);

      const refused = await post();
      expect(refused.status, refused.text).to.equal(429);
      expect(refused.headers.get('content-type')).to.match(/^application\/problem\+json/);
      expect(refused.body).to.deep.include({ code: 'rate-limited', status: 429 });
      expect(refused.body.detail).to.include('SERVICE_TENANT_MAX_WAITING');
      expect(refused.headers.get('retry-after')).to.equal('30');
      expect(await count(), 'a refused run is not stored').to.equal(3);
      // an automation run now is refused the same way
      const automation = await h.call<RunBody>('POST', '/api/v1/automations', {
        body: { name: 'line-full', triggers: [{ type: 'manual' }], steps: body.steps },
      });
      expect(automation.status, automation.text).to.equal(201);
      expect((await h.call('POST', '/api/v1/automations/run', { body: { automation_id: automation.body.id } })).status).to.equal(429);

      // a retry of a request already taken answers its run, whatever the line
      const replay = await post(KEYS.a, { 'idempotency-key': 'second' });
      expect(replay.status).to.equal(202);
      expect(replay.body.run_id).to.equal(waiting[0]!.body.run_id);
      // another tenant's line is its own
      expect((await post(KEYS.b)).status).to.equal(202);
      // a task is new work when it is added to a session
      const session = (await h.call<RunBody>('POST', '/api/v1/sessions', { body: { title: 'full line' } })).body.id as string;
      expect((await h.call('POST', `/api/v1/sessions/${session}/tasks`, { body: { id: 't', steps: body.steps } })).status).to.equal(429);
      // but a task's own run, which the engine makes as its DAG moves on (its task was taken when there was
      // room), is never refused: its session accepted it
      const request = { steps: [{ tool: 'shell' as const, args: { command: 'true' } }], session_id: session };
      const taskRun = await h.rt.engine.runs.create('tenant-a', { ...request, kind: 'session_task', trigger: { type: 'task', task_id: 't' } });
      expect(taskRun.status).to.equal('queued');
      const refusal = await h.rt.engine.runs.create('tenant-a', { ...request, kind: 'autonomy', trigger: { type: 'api' } }).catch((err: Error) => err);
      expect(refusal).to.be.instanceOf(Error).and.have.property('code', 'rate-limited');
      const context = (await h.call<RunBody>('GET', '/api/v1/autonomy/reliability-context')).body;
      expect(context.tenant).to.deep.include({ max_running: 1, max_waiting: 2, running: 1, waiting: 3 });

      // a place in line freed: a new run is taken again
      expect((await h.call('POST', `/api/v1/runs/${waiting[1]!.body.run_id}/cancel`)).status).to.equal(200);
      expect((await h.call('POST', `/api/v1/runs/${waiting[0]!.body.run_id}/cancel`)).status).to.equal(200);
      const taken = await post();
      expect(taken.status).to.equal(202);
      // one place left: a batch of tasks counts those that may start at once (one batch of 200 took the line far past its limit)
      expect((await h.call('POST', `/api/v1/runs/${taken.body.run_id}/cancel`)).status).to.equal(200);
      const both = await h.call<RunBody>('POST', `/api/v1/sessions/${session}/tasks`, {
        body: {
          tasks: [
            { id: 'a', steps: body.steps },
            { id: 'b', steps: body.steps },
          ],
        },
      });
      expect(both.status, both.text).to.equal(429);
      expect(both.body.detail).to.include('no room for 2 more');
      const chained = await h.call('POST', `/api/v1/sessions/${session}/tasks`, {
        body: {
          tasks: [
            { id: 'a', steps: body.steps },
            { id: 'b', steps: body.steps, depends_on: ['a'] },
          ],
        },
      });
      expect(chained.status, chained.text).to.equal(201);
    } finally {
      await h.close();
    }
  });

  it('re-enqueues a queued run that lost its job (the reconciler), so a 202 is never lost', async () => {
    const h = await startHarness();
    try {
      // the store write happened, the job add did not (a crash between the two)
      const ws = h.tenantDir();
      const orphan = runFixture('tenant-a', {
        id: newId('run'),
        kind: 'autonomy',
        workspace: ws,
        created_at: new Date(Date.now() - 60_000).toISOString(),
        plan: [{ tool: 'shell', args: { command: 'echo recovered' } }],
      });
      await h.rt.store.runs.insert(orphan);
      const repaired = await h.rt.engine.runs.reconcile();
      expect(repaired.requeued).to.equal(1);
      await eventually(async () => (await runStatus(h, orphan.id)).status === 'succeeded', 'the recovered run');
      expect((await runStatus(h, orphan.id)).steps[0].output.stdout).to.equal('recovered\n');
      expect((await h.rt.engine.runs.reconcile()).requeued).to.equal(0);
    } finally {
      await h.close();
    }
  });

  it('runs a run again as its next attempt when its worker is killed with SIGKILL, its lost attempt kept; a canceled one ends canceled', async () => {
    const stalled = 1;
    const h = await startHarness({ workers: false, env: { SERVICE_STALLED_INTERVAL_SECONDS: String(stalled) } });
    const env = workerEnv(h, { SERVICE_STALLED_INTERVAL_SECONDS: String(stalled) });
    const worker = spawn(process.execPath, [builtEntry('workers/main.ts')], { env, detached: true, stdio: 'ignore' });
    let second: ReturnType<typeof spawn> | undefined;
    try {
      // its first attempt sleeps until the kill; the next one finds the mark the first left, and ends at once
      const start = async (mark: string) =>
        (
          await h.call('POST', '/api/v1/autonomy/run', {
            body: {
              steps: [{ tool: 'shell', args: { command: `if [ -e ${mark} ]; then echo again; else touch ${mark}; sleep 60; fi` } }],
              budget_seconds: 120,
            },
          })
        ).body.run_id as string;
      const [id, canceledId] = [await start('lost-once'), await start('canceled-once')];
      // a running step's record is saved within 200 ms of its start (later on a busy machine): seen, not waited for
      for (const r of [id, canceledId]) await eventually(async () => (await runStatus(h, r)).steps[0]?.status === 'running', 'the runs’ steps to start');
      process.kill(-worker.pid!, 'SIGKILL');
      const killedAt = Date.now();
      // a cancel asked for while no worker runs it: the run ends canceled, not lost, and is not retried
      expect((await h.call('POST', `/api/v1/runs/${canceledId}/cancel`)).status).to.equal(202);
      second = spawn(process.execPath, [builtEntry('workers/main.ts')], { env, detached: true, stdio: 'ignore' });
      const ended = async (runId: string) =>
        eventually(
          async () => {
            const r = await runStatus(h, runId);
            return TERMINAL.includes(r.status) ? r : null;
          },
          'the lost run to end',
          2 * stalled * 1000 + 30_000,
        );
      const run = await ended(id);
      expect(run).to.deep.include({ status: 'succeeded', attempt: 2 });
      expect(run.steps.at(-1).output.stdout).to.equal('again\n');
      expect(Date.now() - killedAt).to.be.below(stalled * 2000 + 30_000);
      // the lost attempt is kept: the step the worker was running ended with it, and counted
      const [lost] = run.attempts;
      expect(lost).to.deep.include({ attempt: 1, outcome: 'lost', status: 'failed' });
      expect(lost.error.code).to.equal('worker-lost');
      expect(lost.usage.steps).to.equal(1);
      // its time is counted up to the loss, as a finished attempt's is
      expect(lost.usage.seconds).to.be.greaterThan(0);
      const [cut] = await h.rt.store.runs.steps('tenant-a', id, 1);
      expect(cut).to.deep.include({ status: 'failed' });
      expect(cut!.error!.code).to.equal('worker-lost');
      expect(cut!.finished_at).to.be.a('string');
      const canceled = await ended(canceledId);
      expect(canceled.status).to.equal('canceled');
      expect(canceled.attempt).to.equal(1);
      expect(canceled.steps[0].status).to.equal('failed');
      await eventually(async () => (await h.rt.engine.runs.reliabilityContext('tenant-a')).tenant.running === 0, 'the lost run’s slot to be freed');
    } finally {
      killGroups(worker, second);
      await h.close();
    }
  });

  it('puts a run back in the queue when its worker is stopped by a deploy (SIGTERM): its steps are killed, another worker runs it as attempt 2', async () => {
    const h = await startHarness({ workers: false });
    const env = workerEnv(h, { SERVICE_SHUTDOWN_GRACE_SECONDS: '4' });
    const spawnWorker = () => spawn(process.execPath, [builtEntry('workers/main.ts')], { env, detached: true, stdio: ['ignore', 'ignore', 'pipe'] });
    const first = spawnWorker();
    let second: ReturnType<typeof spawn> | undefined;
    try {
      const marker = `sleep ${6000 + Math.floor(Math.random() * 3000)}`;
      const command = `if [ -f deployed ]; then echo second; else touch deployed; ${marker} & wait; fi`;
      const id = (await h.call('POST', '/api/v1/autonomy/run', { body: { steps: [{ tool: 'shell', args: { command } }], budget_seconds: 120 } })).body.run_id;
      await eventually(async () => (await runStatus(h, id)).steps[0].status === 'running', 'the step to run', 15_000);
      await eventually(() => processesMatching(marker) > 0, 'the sleep to start');
      const exited = new Promise<number | null>((resolve) => first.once('exit', (code) => resolve(code)));
      const stoppedAt = Date.now();
      process.kill(first.pid!, 'SIGTERM');
      expect(await exited).to.equal(0);
      expect(Date.now() - stoppedAt).to.be.below(4000);
      await eventually(() => processesMatching(marker) === 0, 'the step’s sleep to be killed');
      const requeued = await runStatus(h, id);
      expect(requeued).to.deep.include({ status: 'queued', attempt: 2 });
      second = spawnWorker();
      const run = await eventually(
        async () => {
          const r = await runStatus(h, id);
          return TERMINAL.includes(r.status) ? r : null;
        },
        'the interrupted run to end on the other worker',
        20_000,
      );
      expect(run).to.deep.include({ status: 'succeeded', attempt: 2 });
      expect(run.attempts.map((a: RunBody) => a.outcome)).to.deep.equal(['interrupted']);
      // what the interrupted attempt used is kept with it: its step, and its time
      expect(run.attempts[0].usage).to.deep.include({ steps: 1, model_turns: 0 });
      expect(run.attempts[0].usage.seconds).to.be.above(0);
      expect(run.steps[0].output.stdout).to.equal('second\n');
      const events = await h.rt.events.after(`session:${run.session_id}`, '0-0');
      expect(events.map((e) => e.type)).to.include('run.interrupted');
      // the slot is freed a moment after the run's end is stored
      await eventually(async () => (await h.rt.engine.runs.reliabilityContext('tenant-a')).tenant.running === 0, 'the run’s slot to be freed');
    } finally {
      killGroups(first, second);
      await h.close();
    }
  });
});
