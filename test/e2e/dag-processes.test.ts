// A random 100-task DAG run by two worker processes (the Procfile's `worker`), one of them SIGKILLed in
// the middle: every task succeeds, starts only after all its dependencies finished, and runs once;
// only a task cut off by the kill runs again, as its attempt 2.
import { spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs/promises';
import path from 'node:path';
import { expect } from 'chai';
import { builtEntry } from '../support/built.js';
import { eventually, startHarness, type Harness } from '../support/harness.js';

type Body = Record<string, any>;

describe('task DAG across worker processes', function () {
  this.timeout(120_000);
  let h: Harness;
  const workers: ChildProcess[] = [];
  before(async () => {
    h = await startHarness({
      workers: false,
      env: { SERVICE_TENANT_MAX_RUNNING: '40', SERVICE_STALLED_INTERVAL_SECONDS: '1', SERVICE_RECONCILE_INTERVAL_SECONDS: '2' },
    });
  });
  after(async () => {
    for (const w of workers) {
      try {
        process.kill(-w.pid!, 'SIGKILL');
      } catch {
        // gone
      }
    }
    await h.close();
  });

  const startWorker = () => {
    const child = spawn(process.execPath, [builtEntry('workers/main.ts')], {
      env: {
        ...process.env,
        REDIS_URL: h.config.redisUrl,
        SERVICE_QUEUE_PREFIX: h.config.queuePrefix,
        SERVICE_DATA_DIR: h.config.dataDir,
        SERVICE_WORKSPACE_ROOT: h.workspace,
        SERVICE_TENANT_MAX_RUNNING: '40',
        SERVICE_STALLED_INTERVAL_SECONDS: '1',
        SERVICE_RECONCILE_INTERVAL_SECONDS: '2',
        SERVICE_WORKER_CONCURRENCY: '8',
        LOG_LEVEL: 'warn',
      },
      detached: true,
      stdio: 'ignore',
    });
    workers.push(child);
    return child;
  };

  it('runs every task once, after its dependencies, though a worker is killed mid-session', async () => {
    const [first] = [startWorker(), startWorker()];
    const id = (await h.call<Body>('POST', '/api/v1/sessions', { body: { title: 'random DAG' } })).body.id;
    const tasks = [];
    for (let i = 0; i < 100; i++) {
      const deps = new Set<string>();
      for (let k = 0; k < 3 && i > 0; k++) if (Math.random() < 0.6) deps.add(`t${Math.floor(Math.random() * i)}`);
      const work = `echo "S t${i} $(date +%s%N)" >> effects.log; sleep 0.0${i % 3}; echo "E t${i} $(date +%s%N)" >> effects.log`;
      tasks.push({ id: `t${i}`, depends_on: [...deps], steps: [{ tool: 'shell', args: { command: work } }] });
    }
    const added = await h.call<Body>('POST', `/api/v1/sessions/${id}/tasks`, { body: { tasks } });
    expect(added.status, added.text).to.equal(201);
    const log = path.join(h.tenantDir(), 'effects.log');
    const ends = async () => (await fs.readFile(log, 'utf8').catch(() => '')).split('\n').filter((l) => l.startsWith('E ')).length;
    await eventually(async () => (await ends()) >= 30, 'a third of the tasks to finish', 60_000);
    process.kill(-first.pid!, 'SIGKILL');
    let last: Body = {};
    const session = await eventually(
      async () => {
        last = (await h.call<Body>('GET', `/api/v1/sessions/${id}`)).body;
        return last.outcome ? last : null;
      },
      'the session to end',
      90_000,
    ).catch(async (err) => {
      const stuck = (last.tasks ?? []).filter((t: Body) => !['succeeded', 'failed', 'upstream_failed', 'canceled'].includes(t.status));
      for (const t of stuck.slice(0, 5)) {
        const run = t.run_ids.length ? (await h.call<Body>('GET', `/api/v1/runs/${t.run_ids.at(-1)}`)).body : null;
        console.log(
          'STUCK',
          t.id,
          t.status,
          t.attempts,
          JSON.stringify(t.depends_on),
          run && JSON.stringify({ status: run.status, attempt: run.attempt, attempts: run.attempts, error: run.error }),
        );
      }
      console.log('SESSION', last.status, last.outcome, JSON.stringify(last.task_counts));
      throw err;
    });
    expect(session.outcome).to.equal('succeeded');
    expect(session.status).to.equal('idle');
    expect(session.task_counts.succeeded).to.equal(100);
    const byId = new Map<string, Body>(session.tasks.map((t: Body) => [t.id, t]));
    const lines = (await fs.readFile(log, 'utf8'))
      .trim()
      .split('\n')
      .map((l) => l.split(' '));
    const starts = new Map<string, bigint[]>();
    const finishes = new Map<string, bigint[]>();
    for (const [kind, task, ns] of lines)
      (kind === 'S' ? starts : finishes).set(task!, [...((kind === 'S' ? starts : finishes).get(task!) ?? []), BigInt(ns!)]);
    for (const t of tasks) {
      const ran = starts.get(t.id) ?? [];
      const record = byId.get(t.id)!;
      // once, or twice only when the kill cut the first attempt off (the task's attempt 2)
      expect(ran.length, `${t.id} ran ${ran.length} times`).to.be.within(1, record.attempts);
      expect(finishes.get(t.id)?.length ?? 0, t.id).to.be.at.least(1);
      for (const dep of t.depends_on) {
        const depDone = finishes.get(dep)!.reduce((a, b) => (a > b ? a : b));
        expect(ran[0]! > depDone, `${t.id} started before ${dep} finished`).to.equal(true);
      }
    }
    const retried = session.tasks.filter((t: Body) => t.attempts > 1).length;
    console.log(`      (${retried} task(s) ran again as attempt 2 after the kill)`);
  });
});
