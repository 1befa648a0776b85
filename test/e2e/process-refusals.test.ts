// The entry points' refusals to start: one clear line, and no run taken, when Redis is down or a setting is bad.
import fs from 'node:fs/promises';
import path from 'node:path';
import { expect } from 'chai';
import { KEYS, processesMatching, sameDeployment, startHarness } from '../support/harness.js';
import { serviceProcesses, start, waitFor } from '../support/procs.js';

describe('processes that refuse to start', function () {
  this.timeout(40_000);
  const { procs, dataDir, env } = serviceProcesses();

  it('says in one line that Redis cannot be reached, and how to fix it, instead of hanging', async () => {
    const p = start('main.ts', { ...env(), REDIS_URL: 'redis://127.0.0.1:1' });
    procs.push(p);
    const { code, ms } = await p.exited;
    expect(code).to.equal(1);
    expect(ms).to.be.below(10_000);
    const lines = p.out().trim().split('\n');
    expect(
      lines.some((l) => /Redis is not reachable at redis:\/\/127\.0\.0\.1:1.*REDIS_URL/.test(l)),
      p.out(),
    ).to.equal(true);
  });

  it('stops cleanly when a deploy’s signal comes while it starts: exit 0 once started, its workers taking no run', async () => {
    const h = await startHarness({ workers: false });
    try {
      const marker = `sleep ${30 + Math.floor(Math.random() * 1000)}`;
      const id = (await h.call('POST', '/api/v1/autonomy/run', { body: { steps: [{ tool: 'shell', args: { command: marker } }] } })).body.run_id;
      const shared = { ...sameDeployment(h), REDIS_URL: h.config.redisUrl, SERVICE_API_KEYS: `tenant-a:${KEYS.a}`, SERVICE_SHUTDOWN_GRACE_SECONDS: '5' };
      // a start that takes a while: its file watcher reads a root of 6,000 files before the process is ready
      const made = await h.call('POST', '/api/v1/automations', {
        body: { name: 'watch', triggers: [{ type: 'file_change', paths: ['src/**/*.ts'] }], steps: [{ tool: 'message', args: { text: 'x' } }] },
      });
      expect(made.status, made.text).to.equal(201);
      for (let d = 0; d < 60; d++) {
        const dir = path.join(h.tenantDir(), 'src', `d${d}`);
        await fs.mkdir(dir, { recursive: true });
        await Promise.all(Array.from({ length: 100 }, (_, f) => fs.writeFile(path.join(dir, `f${f}.txt`), '')));
      }
      // the two side by side
      const entries = ['workers/main.ts', 'main.ts'];
      const started = entries.map((entry) => start(entry, { ...shared, ...(entry === 'main.ts' ? { PORT: '0' } : {}) }));
      procs.push(...started);
      await Promise.all(
        started.map(async (p, i) => {
          // the runtime is open, the workers not yet made: Node's own action for SIGTERM killed the process here
          await waitFor(p, /runtime open/);
          p.child.kill('SIGTERM');
          const { code, signal } = await p.exited;
          expect({ code, signal }, p.out()).to.deep.equal({ code: 0, signal: null });
          expect(p.out(), entries[i])
            .to.match(/"starting":true.*shutting down/)
            .and.match(/workers take no job: the process was asked to stop as it started/)
            .and.match(/stopped cleanly/);
        }),
      );
      // never taken: still on its first attempt
      expect((await h.call('GET', `/api/v1/runs/${id}`)).body).to.deep.include({ status: 'queued', attempt: 1 });
      expect(processesMatching(marker)).to.equal(0);
    } finally {
      await h.close();
    }
  });

  it('stops before listening when the environment is bad, naming each bad variable', async () => {
    const p = start('main.ts', { ...env(), PORT: 'eighty', SERVICE_AUTH: 'sometimes' });
    procs.push(p);
    const { code } = await p.exited;
    expect(code).to.equal(1);
    expect(p.out()).to.contain('PORT').and.contain('SERVICE_AUTH');
  });

  it('says in one line which setting it cannot start with (a port in use, a data dir that is a file, a key given to two tenants), and takes no run first', async function () {
    // five processes, three then two side by side (seven one after another took 40 s under a loaded machine)
    this.timeout(90_000);
    const h = await startHarness({ workers: false });
    try {
      const marker = `sleep ${3000 + Math.floor(Math.random() * 1000)}`;
      const ids: string[] = [];
      for (let i = 0; i < 2; i++)
        ids.push((await h.call('POST', '/api/v1/autonomy/run', { body: { steps: [{ tool: 'shell', args: { command: marker } }] } })).body.run_id);
      const port = new URL(h.url).port;
      const shared = { ...sameDeployment(h), REDIS_URL: h.config.redisUrl, SERVICE_API_KEYS: `tenant-a:${KEYS.a}` };
      // the three side by side
      const refused = (
        [
          ['main.ts', 'PORT', { PORT: port }],
          ['api/main.ts', 'PORT', { PORT: port }],
          ['workers/main.ts', 'SERVICE_WORKER_METRICS_PORT', { SERVICE_WORKER_METRICS_PORT: port }],
        ] as const
      ).map(([entry, variable, extra]) => ({ entry, variable, p: start(entry, { ...shared, ...extra }) }));
      procs.push(...refused.map((r) => r.p));
      for (const { entry, variable, p } of refused) {
        const { code } = await p.exited;
        expect(code, p.out()).to.equal(1);
        expect(p.out(), entry).to.contain(`${variable}: port ${port} is in use by another process`);
        expect(p.out(), entry).not.to.contain('start-up failed');
      }
      // their workers never took a run: both are still queued, on their first attempt (taken, each was lost)
      for (const id of ids) expect((await h.call('GET', `/api/v1/runs/${id}`)).body).to.deep.include({ status: 'queued', attempt: 1 });
      expect(processesMatching(marker)).to.equal(0);
    } finally {
      await h.close();
    }
    const file = path.join(dataDir(), 'a-file');
    await fs.writeFile(file, '');
    const bad = (
      [
        [{ SERVICE_DATA_DIR: file }, `SERVICE_DATA_DIR: ${file} cannot be used as a folder`],
        [{ SERVICE_API_KEYS: `acme:${KEYS.a},other:${KEYS.a}` }, 'SERVICE_API_KEYS: entry 2 gives tenant other the key entry 1 gives tenant acme'],
      ] as const
    ).map(([setting, said]) => ({ said, p: start('api/main.ts', { ...env(), ...setting }) }));
    procs.push(...bad.map((b) => b.p));
    for (const { said, p } of bad) {
      expect((await p.exited).code).to.equal(1);
      expect(p.out()).to.contain(said);
      expect(p.out()).not.to.contain('start-up failed');
      expect(p.out()).not.to.contain(KEYS.a);
    }
  });

  it('refuses SERVICE_AUTH=none in production', async () => {
    const p = start('api/main.ts', {
      ...env(),
      NODE_ENV: 'production',
      SERVICE_STORE: 'sqlite',
      SERVICE_AUTH: 'none',
      SERVICE_SECRET_KEY: 'ab'.repeat(32),
      SERVICE_EVIDENCE_KEY: 'cd'.repeat(32),
    });
    procs.push(p);
    expect((await p.exited).code).to.equal(1);
    expect(p.out()).to.contain('SERVICE_AUTH: "none" is refused when NODE_ENV=production');
  });

  it('refuses to start when the data dir is inside the workspace root, where tools could read the secret key', async () => {
    const p = start('main.ts', { ...env(), SERVICE_WORKSPACE_ROOT: path.dirname(dataDir()) });
    procs.push(p);
    expect((await p.exited).code).to.equal(1);
    expect(p.out()).to.match(/SERVICE_DATA_DIR: .* is inside SERVICE_WORKSPACE_ROOT/);
  });

  it('refuses to start in production with no sandbox, shell allowed or not (gates run a workspace’s commands), unless SERVICE_SANDBOX=none is set', async () => {
    const prod = {
      ...env(),
      NODE_ENV: 'production',
      SERVICE_STORE: 'sqlite',
      SERVICE_SECRET_KEY: 'ab'.repeat(32),
      SERVICE_EVIDENCE_KEY: 'cd'.repeat(32),
      SERVICE_WORKSPACE_ROOT: path.join(dataDir(), '..', `${path.basename(dataDir())}-ws`),
    };
    // a PATH with no bwrap on it: the sandbox cannot be found
    const p = start('api/main.ts', { ...prod, PATH: '/nonexistent' });
    procs.push(p);
    expect((await p.exited).code).to.equal(1);
    expect(p.out()).to.contain("SERVICE_SANDBOX: bwrap is not installed, and tenants' commands");
    // without shell: a gates.yaml's `run:` is a command too
    const gatesOnly = start('api/main.ts', { ...prod, PATH: '/nonexistent', SERVICE_TOOLS_ALLOWED: 'read_file,write_file,gates' });
    procs.push(gatesOnly);
    expect((await gatesOnly.exited).code).to.equal(1);
    expect(gatesOnly.out()).to.contain("SERVICE_SANDBOX: bwrap is not installed, and tenants' commands");
    const explicit = start('api/main.ts', { ...prod, PATH: '/nonexistent', SERVICE_SANDBOX: 'none' });
    procs.push(explicit);
    const [, url] = await waitFor(explicit, /"url":"(http:\/\/localhost:\d+)"/);
    const ready = (await (await fetch(`${url}/readyz`)).json()) as { sandbox: { kind: string; warning?: string } };
    expect(ready.sandbox.kind).to.equal('none');
    expect(ready.sandbox.warning).to.be.a('string');
    expect(explicit.out()).to.contain('tool processes run without a sandbox');
  });
});
