// The sandbox, for real (bubblewrap): what a tenant's shell step can and cannot reach, limits, leftovers,
// tenant isolation through every tool, and the operator's policy on tools and network.
import { createHash } from 'node:crypto';
import fs from 'node:fs/promises';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { spawnSync } from 'node:child_process';
import { expect } from 'chai';
import { runProcess } from '../../engine/tools/process.js';
import { bwrapSandbox, which, type SandboxLimits } from '../../engine/tools/sandbox.js';
import { shellTool } from '../../engine/tools/shell.js';
import type { ToolContext } from '../../engine/tools/tool.js';
import { ATTEMPT_STREAMED_MAX_BYTES } from '../../engine/runs/attempt.js';
import { eventually, finishedRun, KEYS, processesMatching, startHarness, type Harness } from '../support/harness.js';

type Body = Record<string, any>;

describe('sandbox', function () {
  this.timeout(60_000);
  let h: Harness;
  before(async function () {
    // limits small enough to be reached in a test: a step's /tmp, its processes
    // 1 GB of memory a step: the 10 GB allocation below fills the default 4 GB first (5.5 s alone, and past the
    // 20 s a run is waited for while the other test files load the 2 cores of a slower machine)
    h = await startHarness({ env: { SERVICE_SANDBOX_FILE_SIZE_MB: '64', SERVICE_SANDBOX_PROCESSES: '64', SERVICE_SANDBOX_MEMORY_MB: '1024' } });
    if (h.rt.sandbox.kind !== 'bwrap') {
      if (process.env.CI) throw new Error('bubblewrap is not installed: .ci/run installs it');
      console.log('      (bubblewrap is not installed here: the sandbox tests are skipped)');
      this.skip();
    }
  });
  after(async () => {
    await h?.close();
  });

  async function shell(command: string, opts: { key?: string; body?: object } = {}) {
    const res = await h.call<Body>('POST', '/api/v1/autonomy/run', {
      key: opts.key ?? KEYS.a,
      body: { steps: [{ tool: 'shell', args: { command } }], ...opts.body },
    });
    expect(res.status, res.text).to.equal(202);
    return finishedRun(h, res.body.run_id, opts.key ?? KEYS.a);
  }

  it('runs a step as an unprivileged user in /workspace, and says which sandbox ran it', async () => {
    const run = await shell('id -u; id -g; pwd; echo $HOME; hostname');
    expect(run.status, JSON.stringify(run.error)).to.equal('succeeded');
    expect(run.steps[0].output.stdout).to.equal('65534\n65534\n/workspace\n/tmp\nsandbox\n');
    expect(run.sandbox).to.equal('bwrap');
    const ready = await h.call('GET', '/readyz');
    expect(ready.body.sandbox).to.deep.include({ kind: 'bwrap' });
  });

  it('cannot read the data dir, the secret key, the SQLite file, another tenant, the service’s home or its environment', async () => {
    await fs.writeFile(path.join(h.tenantDir('tenant-b'), 'b-secret.txt'), 'tenant b only');
    const targets: Record<string, string> = {
      'data dir': `ls ${h.config.dataDir}`,
      'secret key': `cat ${path.join(h.config.dataDir, 'secret.key')}`,
      sqlite: `head -c 16 ${path.join(h.config.dataDir, 'service.sqlite')}`,
      'other tenant (absolute)': `cat ${path.join(h.tenantDir('tenant-b'), 'b-secret.txt')}`,
      'other tenant (relative)': 'cat ../tenant-b/b-secret.txt',
      'workspace root': 'ls ../tenant-b',
      home: `ls ${os.homedir()}`,
      environ: `cat /proc/${process.pid}/environ`,
      'parent environ': 'cat /proc/$PPID/environ | tr "\\0" "\\n" | grep -c SERVICE_',
      shadow: 'cat /etc/shadow',
    };
    const script = Object.entries(targets)
      .map(([name, cmd]) => `if ${cmd} >/dev/null 2>&1; then echo "${name}: READ"; else echo "${name}: refused"; fi`)
      .join('\n');
    const run = await shell(script);
    const lines = (run.steps[0].output.stdout as string).trim().split('\n');
    expect(lines).to.have.length(Object.keys(targets).length);
    for (const line of lines) expect(line, line).to.match(/: refused$/);
    // the step's environment carries none of the service's secrets either
    const env = await shell('env');
    expect(env.steps[0].output.stdout).not.to.contain(KEYS.a);
    expect(env.steps[0].output.stdout).not.to.match(/SERVICE_|REDIS_URL/);
  });

  it('has no network unless allowed: Redis on 127.0.0.1 and a local server are unreachable, and network: true is refused', async () => {
    const server = net.createServer((s) => s.end('hello\n'));
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
    const port = (server.address() as net.AddressInfo).port;
    try {
      const run = await shell(
        `bash -c '</dev/tcp/127.0.0.1/6379' 2>/dev/null && echo redis: REACHED || echo redis: refused; bash -c 'cat </dev/tcp/127.0.0.1/${port}' 2>/dev/null || echo local: refused`,
      );
      expect(run.steps[0].output.stdout).to.equal('redis: refused\nlocal: refused\n');
      const asked = await h.call<Body>('POST', '/api/v1/autonomy/run', { body: { steps: [{ tool: 'shell', args: { command: 'true' } }], network: true } });
      expect(asked.status).to.equal(403);
      expect(asked.body.code).to.equal('network-not-permitted');
      // with the operator's leave, a run that asks shares the host's network
      const open = await startHarness({ env: { SERVICE_SANDBOX_ALLOW_NETWORK: '1' } });
      try {
        const res = await open.call<Body>('POST', '/api/v1/autonomy/run', {
          body: { steps: [{ tool: 'shell', args: { command: `bash -c 'cat </dev/tcp/127.0.0.1/${port}'` } }], network: true },
        });
        const reached = await finishedRun(open, res.body.run_id);
        expect(reached.steps[0].output.stdout).to.equal('hello\n');
        expect(reached.network).to.equal(true);
        const without = await open.call<Body>('POST', '/api/v1/autonomy/run', {
          body: { steps: [{ tool: 'shell', args: { command: `bash -c 'cat </dev/tcp/127.0.0.1/${port}' || echo refused` } }] },
        });
        expect((await finishedRun(open, without.body.run_id)).steps[0].output.stdout).to.equal('refused\n');
      } finally {
        await open.close();
      }
    } finally {
      server.close();
    }
  });

  it('ends a fork bomb and a 10 GB allocation with the step failed and the service healthy', async function () {
    if (h.rt.sandbox.processLimit === 'none') {
      console.log('      (no pids cgroup and the service runs as root: the fork bomb is not tried here)');
      this.skip();
    }
    const bomb = await shell('f() { f | f; }; f', { body: { budget_seconds: 20 } });
    expect(bomb.status).to.equal('failed');
    expect(bomb.steps[0].status).to.equal('failed');
    const memory = await shell(`node -e "const a = []; for (;;) a.push(Buffer.alloc(256 * 1024 * 1024, 1))"`);
    expect(memory.status).to.equal('failed');
    expect(memory.steps[0].output.exit_code).not.to.equal(0);
    expect((await h.call('GET', '/readyz')).status).to.equal(200);
    const after = await shell('echo still here');
    expect(after.steps[0].output.stdout).to.equal('still here\n');
  });

  it('leaves the host alone: its kernel settings read-only, no user namespace of the step’s own, a bounded /tmp, private folders', async () => {
    const run = await shell(
      [
        'echo 61 > /proc/sys/vm/swappiness 2>/dev/null && echo sysctl-written || echo sysctl-refused',
        'unshare -Ur true 2>/dev/null && echo userns-made || echo userns-refused',
        // the harness's SERVICE_SANDBOX_FILE_SIZE_MB bounds /tmp too
        `dd if=/dev/zero of=/tmp/big bs=1M count=${h.config.sandbox.limits.fileSizeMb + 8} 2>/dev/null; echo tmp=$(( $(stat -c %s /tmp/big) / 1048576 ))`,
        // and /dev/shm; the root and /dev take no file at all (memory with no bound, where no cgroup counts it)
        // (in files each under the size a file may have: together over it)
        `for f in a b; do dd if=/dev/zero of=/dev/shm/$f bs=1M count=${h.config.sandbox.limits.fileSizeMb / 2 + 4} 2>/dev/null; done; echo shm=$(( $(cat /dev/shm/a /dev/shm/b | wc -c) / 1048576 ))`,
        'touch /rootfile 2>/dev/null && echo root-written || echo root-refused',
        'touch /dev/devfile 2>/dev/null && echo dev-written || echo dev-refused',
        'echo x > /dev/null && echo null-written',
      ].join('; '),
    );
    const [sysctl, userns, tmp, shm, ...rest] = (run.steps[0].output.stdout as string).trim().split('\n');
    expect([sysctl, userns]).to.deep.equal(['sysctl-refused', 'userns-refused']);
    expect(Number(tmp!.slice(4))).to.be.at.most(h.config.sandbox.limits.fileSizeMb);
    expect(Number(shm!.slice(4))).to.be.at.most(h.config.sandbox.limits.fileSizeMb);
    expect(rest).to.deep.equal(['root-refused', 'dev-refused', 'null-written']);
    // no other user of the machine goes into the store's folder or the tenants' workspaces
    for (const dir of [h.config.dataDir, h.config.workspaceRoot]) expect((await fs.stat(dir)).mode & 0o777, dir).to.equal(0o700);
  });

  it('keeps the process limit when another process of the same prefix stops (a rolling deploy)', async function () {
    if (h.rt.sandbox.processLimit !== 'cgroup') this.skip();
    const other = await startHarness({ workers: false, env: { SERVICE_QUEUE_PREFIX: h.config.queuePrefix, SERVICE_SANDBOX_PROCESSES: '16' } });
    await other.close();
    const forks = await shell('for i in $(seq 100); do sleep 2 & done 2>/dev/null; sleep 0.3; echo procs=$(ls /proc | grep -c "^[0-9]")');
    expect(forks.status, JSON.stringify(forks.steps[0])).to.be.oneOf(['succeeded', 'failed']);
    expect(h.logs.join('')).not.to.contain('could not be made');
    const procs = Number(/procs=(\d+)/.exec(forks.steps[0].output.stdout as string)?.[1] ?? 0);
    expect(procs, 'still limited to SERVICE_SANDBOX_PROCESSES').to.be.at.most(h.config.sandbox.limits.processes);
  });

  /** A bubblewrap sandbox of its own with these limits, and a shell step's context in tenant a's workspace (close the sandbox after). */
  const shellIn = (limits: SandboxLimits, hidden?: string[]) => {
    const sandbox = bwrapSandbox({
      bwrap: which('bwrap', process.env.PATH)!,
      prlimit: which('prlimit', process.env.PATH)!,
      limits,
      prefix: h.config.queuePrefix,
      log: h.rt.log,
      hidden,
    });
    const ctx = {
      workspace: h.tenantDir('tenant-a'),
      signal: new AbortController().signal,
      output() {},
      childEnv: { PATH: '/usr/bin:/bin' },
      sandbox,
      network: false,
      readOnlyBinds: [],
    } as unknown as ToolContext;
    return { sandbox, ctx };
  };

  it('hides the service’s own folders from a step where a folder every step sees holds them (a data dir under /usr)', async () => {
    // as a Dockerfile's WORKDIR /usr/src/app with the default ./data
    const app = await fs.mkdtemp('/usr/local/share/svc-hidden-');
    const data = path.join(app, 'data');
    await fs.mkdir(data);
    await fs.writeFile(path.join(data, 'secret.key'), 'the key\n');
    const see = async (hidden: string[]) => {
      const { sandbox, ctx } = shellIn(h.config.sandbox.limits, hidden);
      try {
        return String((await shellTool.execute({ command: `cat ${data}/secret.key; ls ${app}` }, ctx)).output.stdout);
      } finally {
        sandbox.close();
      }
    };
    try {
      expect(await see([]), 'seen without it').to.contain('the key');
      const hidden = await see([data]);
      expect(hidden).not.to.contain('the key');
      expect(hidden, 'the folder is there, empty').to.contain('data');
    } finally {
      await fs.rm(app, { recursive: true, force: true });
    }
  });

  it('bounds the memory of a step’s processes together, and says so when the kernel ended one for it', async function () {
    if (h.rt.sandbox.memoryLimit !== 'cgroup') {
      console.log('      (no memory cgroup can be made here: the memory of all of a step’s processes is not bounded together)');
      this.skip();
    }
    // 200 MB a step; each of four processes holds 100 MB (tail keeps a line without an end), well under its own
    // address space limit of 200 MB, but 400 MB together
    const { sandbox, ctx } = shellIn({ cpuSeconds: 30, memoryMb: 200, processes: 64, fileSizeMb: 16 });
    const hold = 'head -c 100000000 /dev/zero | tail > /dev/null';
    try {
      const together = await shellTool.execute({ command: `for i in 1 2 3 4; do (${hold}) & done; wait; sleep 0.2; exit 3` }, ctx);
      expect(together.error, JSON.stringify(together.output)).to.deep.include({ code: 'memory-exceeded' });
      expect(together.error!.message).to.contain('200 MB');
      // one process under the limit: nothing said about memory
      const one = await shellTool.execute({ command: `${hold}; echo held` }, ctx);
      expect(one.error, JSON.stringify(one.output)).to.equal(undefined);
      expect((one.output as { stdout: string }).stdout).to.equal('held\n');
      // what a process uses is bounded, not what it reserves: Node reserves over 1 GB, and under an address
      // space limit of 200 MB it could not start
      const node = await shellTool.execute({ command: `node -e "console.log(2)"` }, ctx);
      expect(node.error, JSON.stringify(node.output)).to.equal(undefined);
      expect((node.output as { stdout: string }).stdout).to.equal('2\n');
    } finally {
      sandbox.close();
    }
    const ready = await h.call<Body>('GET', '/readyz');
    expect(ready.body.sandbox).to.deep.include({ memory_limit: 'cgroup' });
  });

  it('ends a process past its CPU seconds with SIGXCPU and says so (cpu-exceeded), leaving no core file in the workspace', async () => {
    const { sandbox, ctx } = shellIn({ cpuSeconds: 1, memoryMb: 256, processes: 64, fileSizeMb: 16 });
    const workspace = ctx.workspace;
    try {
      const before = new Set(await fs.readdir(workspace));
      // the shell's child, and the command bwrap ran itself (the shell gone by exec): both say the limit
      for (const command of ['while :; do :; done; echo never', 'exec sh -c "while :; do :; done"']) {
        const spun = await shellTool.execute({ command }, ctx);
        expect(spun.error, JSON.stringify(spun.output)).to.deep.include({ code: 'cpu-exceeded' });
        expect(spun.error!.message).to.contain('1 s of CPU time');
        expect((spun.output as { stdout: string }).stdout).to.equal('');
      }
      // a process that ends on its own is not blamed for the limit
      const quick = await shellTool.execute({ command: 'exit 7' }, ctx);
      expect(quick.error).to.deep.include({ code: 'nonzero-exit' });
      const left = (await fs.readdir(workspace)).filter((f) => !before.has(f));
      expect(left, 'files the ended processes left').to.deep.equal([]);
    } finally {
      sandbox.close();
    }
  });

  describe('a step’s cgroups', function () {
    const controllers = ['pids', 'memory'] as const;
    /** this process's own group in v1's hierarchy of a controller */
    const ownGroup = (c: string) =>
      /^\d+:([^:]*):(.*)$/m.exec(
        spawnSync('cat', ['/proc/self/cgroup'], { encoding: 'utf8' })
          .stdout.split('\n')
          .filter((l) => l.split(':')[1]?.split(',').includes(c))
          .join('\n'),
      )?.[2] ?? '/';
    /** the deployment's folder of step groups of a controller, wherever the sandbox made it */
    const folderOf = (c: string, prefix: string) =>
      [path.join('/sys/fs/cgroup', c, ownGroup(c), `${prefix}-sandbox`), path.join('/sys/fs/cgroup', c, `${prefix}-sandbox`)].find(
        (d) => spawnSync('test', ['-d', d]).status === 0,
      );
    const openCgroupSandbox = (prefix: string) =>
      bwrapSandbox({
        bwrap: which('bwrap', process.env.PATH)!,
        prlimit: which('prlimit', process.env.PATH)!,
        limits: { cpuSeconds: 10, memoryMb: 256, processes: 64, fileSizeMb: 16 },
        prefix,
        log: h.rt.log,
      });
    const run = (sandbox: ReturnType<typeof bwrapSandbox>, command: string, signal?: AbortSignal) =>
      runProcess(sandbox, ['/bin/sh', '-c', command], { workspace: h.tenantDir(), env: { PATH: '/usr/bin:/bin' }, network: false, maxBytes: 4096, signal });
    const stepGroups = (prefix: string) =>
      controllers.map((c) => {
        const dir = folderOf(c, prefix);
        return dir ? (spawnSync('ls', [dir], { encoding: 'utf8' }).stdout.match(/^step-/gm) ?? []).length : 0;
      });

    /** the deployment's folders a test made, once empty (a deployment's are otherwise never removed) */
    const removeFolders = async (prefix: string) => {
      for (const c of controllers) {
        const dir = folderOf(c, prefix);
        if (dir)
          await eventually(
            () =>
              fs.rmdir(dir).then(
                () => true,
                () => false,
              ),
            `${dir} removed`,
            3000,
          ).catch(() => {});
      }
    };

    before(function () {
      if (h.rt.sandbox.processLimit !== 'cgroup' || h.rt.sandbox.memoryLimit !== 'cgroup') this.skip();
      if (controllers.some((c) => spawnSync('test', ['-d', path.join('/sys/fs/cgroup', c)]).status !== 0)) this.skip(); // v1 only
    });

    it('makes them inside the service’s own group, under the limits the operator set on the service, the step first to go', async () => {
      const prefix = `${h.config.queuePrefix}-own`;
      const sandbox = openCgroupSandbox(prefix);
      const marker = `sleep 1.${Math.floor(Math.random() * 1e6)}`;
      try {
        const running = run(sandbox, marker);
        await eventually(() => processesMatching(`^${marker}$`) > 0, 'the step to run');
        const pid = spawnSync('pgrep', ['-f', `^${marker}$`], { encoding: 'utf8' })
          .stdout.trim()
          .split('\n')[0]!;
        const groups = await fs.readFile(`/proc/${pid}/cgroup`, 'utf8');
        for (const c of controllers) {
          const group = new RegExp(`^\\d+:[^:]*\\b${c}\\b[^:]*:(.*)$`, 'm').exec(groups)?.[1];
          expect(group, c).to.equal(path.join(ownGroup(c), `${prefix}-sandbox`, path.basename(group!)));
        }
        await running;
        // the service's limit reached before the step's: the kernel ends the step's processes first, and the step cannot
        // make itself the last to go (below the service's 0)
        const adj = await run(sandbox, 'cat /proc/self/oom_score_adj; { echo -500 > /proc/self/oom_score_adj; } 2>/dev/null || echo refused');
        expect(adj.stdout).to.equal('1000\nrefused\n');
      } finally {
        sandbox.close();
        await removeFolders(prefix);
      }
    });

    it('removes the groups of a step the kernel would not start (a NUL byte, an argument over 128 KB), and says why without the sandbox’s own arguments', async () => {
      const prefix = `${h.config.queuePrefix}-refused`;
      const sandbox = openCgroupSandbox(prefix);
      try {
        const spawnOf = (argv: string[], env: Record<string, string> = { PATH: '/usr/bin:/bin' }) =>
          Promise.resolve()
            .then(() => runProcess(sandbox, argv, { workspace: h.tenantDir(), env, network: false, maxBytes: 4096 }))
            .then(
              () => null,
              (e: { code?: string; message?: string }) => e,
            );
        const refusals = [
          await spawnOf(['/bin/sh', '-c', 'echo a\u0000b']),
          await spawnOf(['/bin/sh', '-c', 'true'], { PATH: '/usr/bin:/bin', X: 'a\u0000b' }),
          await spawnOf(['/bin/sh', '-c', `echo ${'x'.repeat(200_000)} | wc -c`]),
          // each entry under 128 KB, together past what the kernel takes (E2BIG once its groups were made)
          await spawnOf(['/bin/sh', '-c', 'true'], Object.fromEntries(Array.from({ length: 40 }, (_, i) => [`BIG${i}`, 'y'.repeat(120_000)]))),
        ];
        for (const err of refusals) {
          expect(err?.code, err?.message).to.equal('invalid-args');
          expect(err?.message).not.to.match(/args\[\d+\]/);
        }
        expect(stepGroups(prefix), 'groups left').to.deep.equal([0, 0]);
        // a step that runs leaves none either, as before
        expect((await run(sandbox, 'echo ok')).stdout).to.equal('ok\n');
        await eventually(() => stepGroups(prefix).every((n) => n === 0), 'the groups of the step that ran to be removed', 3000);
      } finally {
        sandbox.close();
        await removeFolders(prefix);
      }
    });

    it('never meets the groups a process of the same pid left behind, and removes the empty leftovers of a dead one', async () => {
      const prefix = `${h.config.queuePrefix}-left`;
      openCgroupSandbox(prefix).close();
      const folders = controllers.map((c) => folderOf(c, prefix)!);
      // a restarted container's process has the pid of the one before, which died mid-step; and an older leftover
      const stale = [1, 2, 3].map((n) => `step-${process.pid}-${n}`);
      const old = 'step-1-0123456789ab-7';
      const recent = 'step-1-0123456789ab-8';
      for (const dir of folders) {
        for (const name of [...stale, old, recent]) await fs.mkdir(path.join(dir, name));
        const hoursAgo = new Date(Date.now() - 2 * 3600_000);
        await fs.utimes(path.join(dir, old), hoursAgo, hoursAgo);
      }
      const sandbox = openCgroupSandbox(prefix);
      try {
        for (let i = 0; i < 4; i++) expect((await run(sandbox, 'echo ran')).stdout, `step ${i + 1}`).to.equal('ran\n');
        for (const dir of folders) {
          const left = await fs.readdir(dir);
          expect(left, dir).not.to.include(old);
          // a minute old at most: it may be a step's that has yet to join it
          expect(left, dir).to.include(recent);
        }
      } finally {
        sandbox.close();
        for (const dir of folders) for (const name of [...stale, recent]) await fs.rmdir(path.join(dir, name)).catch(() => {});
        await removeFolders(prefix);
      }
    });

    it('leaves no group behind after 200 steps, daemons and stops among them', async () => {
      const prefix = `${h.config.queuePrefix}-many`;
      const sandbox = openCgroupSandbox(prefix);
      const commands = ['true', 'setsid sleep 30 >/dev/null 2>&1 </dev/null & echo x', 'for i in 1 2 3; do sleep 5 & done', 'exit 3'];
      try {
        await Promise.all(
          Array.from({ length: 4 }, async (_, w) => {
            for (let i = w; i < 200; i += 4) {
              const stop = new AbortController();
              if (i % 7 === 0) setTimeout(() => stop.abort(), i % 13);
              await run(sandbox, commands[i % commands.length]!, stop.signal);
            }
          }),
        );
        await eventually(() => stepGroups(prefix).every((n) => n === 0), 'every step group removed', 5000);
      } finally {
        sandbox.close();
        await removeFolders(prefix);
      }
    });
  });

  it('keeps a step’s environment off every command line of the host (ps): bubblewrap takes its options through a pipe', async () => {
    const secret = `tok-${Math.random().toString(36).slice(2)}`;
    const marker = `sleep ${3 + Math.random()}`;
    const res = await h.call<Body>('POST', '/api/v1/autonomy/run', {
      // (the step's own command line names no secret: it prints what the secret's digest is)
      body: { steps: [{ tool: 'shell', args: { command: `printf %s "$TOKEN" | sha256sum | cut -c1-16; ${marker}`, env: { TOKEN: secret } } }] },
    });
    expect(res.status, res.text).to.equal(202);
    await eventually(() => processesMatching(marker) > 0, 'the step to run', 15_000);
    expect(processesMatching(secret), 'processes whose command line holds the secret').to.equal(0);
    const run = await finishedRun(h, res.body.run_id);
    expect(run.steps[0].output.stdout, 'the step has its environment').to.equal(`${createHash('sha256').update(secret).digest('hex').slice(0, 16)}\n`);
  });

  it('hands a step nothing the service process was handed open by its parent', async () => {
    // a service started with an open file beyond stdio (a supervisor's pipe, a wrapper's file) at fd 100
    const secret = path.join(await fs.mkdtemp(path.join(os.tmpdir(), 'inherited-')), 'parent-secret.txt');
    await fs.writeFile(secret, 'the parent’s secret');
    const file = await fs.open(secret, 'r');
    const script = `
      import { bwrapSandbox, which } from './engine/tools/sandbox.ts';
      import { runProcess } from './engine/tools/process.ts';
      import { createLogger } from './engine/platform/log.ts';
      import fs from 'node:fs';
      const ws = fs.mkdtempSync('/tmp/inherited-ws-');
      const log = createLogger('warn');
      const sandbox = bwrapSandbox({ bwrap: which('bwrap', process.env.PATH), prlimit: which('prlimit', process.env.PATH),
        limits: { cpuSeconds: 10, memoryMb: 512, processes: 64, fileSizeMb: 16 }, prefix: 'inherited-' + process.pid, log });
      const r = await runProcess(sandbox, ['sh', '-c', 'ls /proc/self/fd | tr "\\n" " "; echo; cat /proc/self/fd/100 2>&1; true'],
        { workspace: ws, env: { PATH: '/usr/bin:/bin' }, network: false, maxBytes: 65536 });
      sandbox.close();
      fs.rmSync(ws, { recursive: true });
      console.log('STEP:' + JSON.stringify(r.stdout));
    `;
    const child = spawnSync(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', script], {
      cwd: process.cwd(),
      // Node marks the low descriptors it was handed close-on-exec itself (3 to 7 here), not the others
      stdio: ['ignore', 'pipe', 'pipe', ...Array.from({ length: 98 }, (_, i) => (i === 97 ? file.fd : 'ignore'))],
      encoding: 'utf8',
      timeout: 30_000,
    });
    await file.close();
    await fs.rm(path.dirname(secret), { recursive: true, force: true });
    const out = /STEP:(.*)/.exec(child.stdout)?.[1];
    expect(out, child.stdout + child.stderr).to.be.a('string');
    const stdout = JSON.parse(out!) as string;
    expect(stdout).not.to.contain('the parent’s secret');
    // the step sees its stdio and the listing's own descriptor, nothing else
    expect(
      stdout
        .split('\n')[0]!
        .trim()
        .split(' ')
        .map(Number)
        .sort((x, y) => x - y),
    ).to.deep.equal([0, 1, 2, 3]);
    expect(child.stdout + child.stderr, 'the operator is told').to.contain('parent-secret.txt');
  });

  it('keeps open the files V8 writes for a profiler flag, so that they never land in the store', async () => {
    // node --perf-basic-prof writes /tmp/perf-<pid>.map and a log through descriptors that are not close-on-exec:
    // closed, their numbers went to the next files opened (the store's), and V8's lines into them
    const script = `
      import { bwrapSandbox, which } from './engine/tools/sandbox.ts';
      import { createLogger } from './engine/platform/log.ts';
      import fs from 'node:fs';
      const sandbox = bwrapSandbox({ bwrap: which('bwrap', process.env.PATH), prlimit: which('prlimit', process.env.PATH),
        limits: { cpuSeconds: 10, memoryMb: 512, processes: 64, fileSizeMb: 16 }, prefix: 'profiled-' + process.pid, log: createLogger('warn') });
      const file = fs.mkdtempSync('/tmp/profiled-') + '/store';
      const fd = fs.openSync(file, 'w');
      fs.writeSync(fd, 'the store');
      // new code, as the service loads and warms up: V8 writes lines of its log for it
      await import('./engine/store/sqlite/index.ts');
      for (let i = 0; i < 300; i++) { const f = new Function('a', 'return a + ' + i); for (let k = 0; k < 2000; k++) f(k); }
      fs.closeSync(fd);
      const targets = fs.readdirSync('/proc/self/fd').map((n) => { try { return fs.readlinkSync('/proc/self/fd/' + n); } catch { return ''; } });
      console.log('RESULT:' + JSON.stringify({ store: fs.readFileSync(file, 'utf8'), mapOpen: targets.includes('/tmp/perf-' + process.pid + '.map') }));
      fs.rmSync(file.slice(0, -6), { recursive: true });
      sandbox.close();
    `;
    const child = spawnSync(process.execPath, ['--perf-basic-prof', '--import', 'tsx', '--input-type=module', '-e', script], {
      cwd: process.cwd(),
      stdio: ['ignore', 'pipe', 'pipe'],
      encoding: 'utf8',
      timeout: 30_000,
    });
    // the map, and the log the flag writes where the process runs
    await fs.rm(`/tmp/perf-${child.pid}.map`, { force: true });
    for (const name of await fs.readdir(process.cwd())) if (name.endsWith(`-${child.pid}-v8.log`)) await fs.rm(name);
    const out = /RESULT:(.*)/.exec(child.stdout)?.[1];
    expect(out, child.stdout + child.stderr).to.be.a('string');
    expect(JSON.parse(out!)).to.deep.equal({ store: 'the store', mapOpen: true });
    expect(child.stdout + child.stderr, 'the operator is told').to.contain(`perf-${child.pid}.map`);
  });

  it('leaves nothing behind: a daemonized process dies with its step', async () => {
    const marker = `sleep ${7000 + Math.floor(Math.random() * 2000)}`;
    const run = await shell(`setsid ${marker} > /dev/null 2>&1 < /dev/null & echo started`);
    expect(run.status).to.equal('succeeded');
    // a leftover would live for over 7,000 s
    await eventually(() => processesMatching(marker) === 0, 'the setsid leftover to be gone', 10_000);
  });

  it('stops a command at once, whenever the stop comes while bubblewrap starts it, and leaves nothing running', async () => {
    // bwrap gives the command a session of its own: a stop that kills bwrap before the command is tied to
    // it used to orphan the command, which kept the step's output open, and the step waiting, until it ended
    // a command that outlives the test's patience if it is orphaned, named uniquely to find what is left
    const seconds = (20 + Math.random()).toFixed(3);
    const tooLong: string[] = [];
    for (let delay = 0; delay <= 20; delay++) {
      const controller = new AbortController();
      const started = performance.now();
      setTimeout(() => controller.abort(), delay);
      const r = await runProcess(h.rt.sandbox, ['sleep', seconds], {
        workspace: h.tenantDir(),
        env: {},
        network: false,
        signal: controller.signal,
        maxBytes: 1024,
      });
      const took = performance.now() - started;
      // an orphaned command holds the step for its whole 20 s
      if (took > 5000 || !r.aborted) tooLong.push(`stopped after ${delay} ms: ended after ${Math.round(took)} ms, aborted ${r.aborted}`);
    }
    expect(tooLong).to.deep.equal([]);
    await eventually(() => processesMatching(`sleep ${seconds}`) === 0, 'no sleep left running', 10_000);
  });

  it('keeps one tenant’s files from another through every tool', async () => {
    await fs.writeFile(path.join(h.tenantDir('tenant-b'), 'mine.txt'), 'b');
    for (const step of [
      { tool: 'read_file', args: { path: '../tenant-b/mine.txt' } },
      { tool: 'list_files', args: { path: '../tenant-b' } },
      { tool: 'write_file', args: { path: '../tenant-b/planted.txt', content: 'a' } },
    ]) {
      const res = await h.call<Body>('POST', '/api/v1/autonomy/run', { body: { steps: [step] } });
      const run = await finishedRun(h, res.body.run_id);
      expect(run.error.code, step.tool).to.equal('path-outside-workspace');
    }
    expect(await fs.stat(path.join(h.tenantDir('tenant-b'), 'planted.txt')).catch(() => null)).to.equal(null);
    // a workspace naming another tenant's folder is refused at the door
    const other = await h.call<Body>('POST', '/api/v1/autonomy/run', {
      body: { steps: [{ tool: 'shell', args: { command: 'ls' } }], workspace: '../tenant-b' },
    });
    expect(other.status).to.equal(400);
    // each tenant's runs act in its own folder
    const a = await shell('echo a > who.txt; ls');
    const b = await shell('ls', { key: KEYS.b });
    expect(a.steps[0].output.stdout).to.contain('who.txt');
    expect(b.steps[0].output.stdout).not.to.contain('who.txt');
    expect(b.steps[0].output.stdout).to.contain('mine.txt');
  });

  it('never reaches another tenant through a workspace folder swapped for a link after the run was checked', async () => {
    await fs.writeFile(path.join(h.tenantDir('tenant-b'), 'secret.txt'), 'TENANT-B-SECRET');
    const sub = path.join(h.tenantDir('tenant-a'), 'swapped');
    await fs.mkdir(sub, { recursive: true });
    const res = await h.call<Body>('POST', '/api/v1/autonomy/run', {
      body: {
        workspace: 'swapped',
        steps: [
          // long enough for the swap below to land while it runs, however loaded the machine
          { tool: 'shell', args: { command: 'sleep 3.5' } },
          { tool: 'shell', args: { command: 'cat /workspace/secret.txt; echo planted > /workspace/from-a.txt' } },
          { tool: 'read_file', args: { path: 'secret.txt' } },
          { tool: 'write_file', args: { path: 'from-a-too.txt', content: 'planted' } },
        ],
      },
    });
    const id = res.body.run_id;
    // the first step's own process runs, inside the sandbox (a workspace removed while bubblewrap binds it
    // fails the step otherwise; bubblewrap's and the shell's command lines name 'sleep 3.5' before that)
    await eventually(() => processesMatching('^sleep 3\\.5$') > 0, 'the first step to run');
    // what another run of tenant A's can do from its root: rm -rf swapped; ln -s ../tenant-b swapped
    await fs.rm(sub, { recursive: true });
    await fs.symlink('../tenant-b', sub);
    const run = await finishedRun(h, id);
    expect(JSON.stringify(run.steps)).not.to.include('TENANT-B-SECRET');
    // the first step that starts after the swap fails, and the run with it
    expect(run.error.code).to.equal('path-outside-workspace');
    expect(run.steps.filter((s: Body) => s.status === 'failed').map((s: Body) => s.error.code)).to.deep.equal(['path-outside-workspace']);
    expect(await fs.readdir(h.tenantDir('tenant-b'))).to.not.include.members(['from-a.txt', 'from-a-too.txt']);
  });

  it('refuses what is not a plain file (a FIFO) at once, and fails a step whose tool throws unexpectedly as that step', async () => {
    await shell('mkfifo fifo1');
    const started = Date.now();
    const res = await h.call<Body>('POST', '/api/v1/autonomy/run', {
      body: {
        budget_seconds: 30,
        steps: [
          { tool: 'read_file', args: { path: 'fifo1' } },
          { tool: 'write_file', args: { path: 'fifo1', content: 'x' } },
        ],
      },
    });
    const run = await finishedRun(h, res.body.run_id);
    expect(Date.now() - started, 'nothing waited on the FIFO').to.be.lessThan(10_000);
    expect(run.steps[0]).to.deep.include({ status: 'failed' });
    expect(run.steps[0].error.code).to.equal('invalid-args');
    // Node refuses the method before a request exists: the step fails with its event, not the run as internal
    const http = await h.call<Body>('POST', '/api/v1/autonomy/run', {
      body: { steps: [{ tool: 'http', args: { url: 'http://example.invalid/', method: 'GE T' } }] },
    });
    const failed = await finishedRun(h, http.body.run_id);
    expect(failed.status).to.equal('failed');
    expect(failed.steps[0].status).to.equal('failed');
    expect(failed.steps[0].finished_at).to.be.a('string');
    expect(failed.error.code).to.equal('tool-failed');
  });

  it('streams at most 8 MB of output an attempt into the shared event log, and 1 MB a step', async () => {
    // ten steps of 1.2 MB each: 12 MB printed, 10 MB within the steps' own limits
    const run = await shell('head -c 1200000 /dev/zero | tr "\\0" a', {
      body: { steps: Array.from({ length: 10 }, () => ({ tool: 'shell', args: { command: 'head -c 1200000 /dev/zero | tr "\\0" a' } })) },
    });
    expect(run.status).to.equal('succeeded');
    const events = await h.rt.events.after(`session:${run.session_id}`, '0-0', 100_000);
    const streamed = events.filter((e) => e.type === 'step.output').map((e) => e.data as { index: number; text: string });
    expect(streamed.reduce((n, e) => n + e.text.length, 0)).to.equal(ATTEMPT_STREAMED_MAX_BYTES);
    expect(streamed.filter((e) => e.index === 0).reduce((n, e) => n + e.text.length, 0)).to.equal(1024 * 1024);
    // each step's record keeps its own tail all the same
    expect(run.steps[9].output.stdout.length).to.be.greaterThan(0);
  });

  it('streams a tenant’s step output up to SERVICE_TENANT_OUTPUT_MB_PER_DAY a day, then says so once a session and streams no more; other tenants go on', async () => {
    const budgeted = await startHarness({ env: { SERVICE_TENANT_OUTPUT_MB_PER_DAY: '1' } });
    try {
      const print = (bytes: number) => ({ tool: 'shell', args: { command: `head -c ${bytes} /dev/zero | tr "\\0" a` } });
      const runOf = async (steps: object[], key = KEYS.a) => {
        const res = await budgeted.call<Body>('POST', '/api/v1/autonomy/run', { body: { steps }, key });
        expect(res.status, res.text).to.equal(202);
        const run = await finishedRun(budgeted, res.body.run_id, key);
        expect(run.status).to.equal('succeeded');
        const events = await budgeted.rt.events.after(`session:${run.session_id}`, '0-0', 100_000);
        return { run, texts: events.filter((e) => e.type === 'step.output').map((e) => (e.data as { text: string }).text) };
      };
      // 1.4 MB printed over two steps, 1 MB of them streamed, then the notice
      const first = await runOf([print(700_000), print(700_000)]);
      const notice = first.texts.at(-1)!;
      expect(notice).to.contain('SERVICE_TENANT_OUTPUT_MB_PER_DAY');
      // whole chunks (up to a pipe read, 64 KB) while they fit
      const streamed = first.texts.slice(0, -1).join('');
      expect(streamed).to.match(/^a+$/);
      expect(streamed.length).to.be.within(1024 * 1024 - 64 * 1024, 1024 * 1024);
      expect(first.texts.filter((t) => t === notice)).to.have.length(1);
      // the records keep each step's tail all the same
      expect(first.run.steps[1].output.stdout.length).to.be.greaterThan(0);
      // the tenant's next run the same day: what is left of the day's budget, then the notice
      const second = await runOf([print(100_000)]);
      expect(second.texts.at(-1)).to.equal(notice);
      expect(second.texts.slice(0, -1).join('').length).to.be.at.most(1024 * 1024 - streamed.length);
      // another tenant's output is its own
      expect((await runOf([print(10)], KEYS.b)).texts.join('')).to.equal('a'.repeat(10));
    } finally {
      await budgeted.close();
    }
  });

  it('refuses tools the operator does not allow, naming them (403), and narrows the default tools of a goal', async () => {
    const narrow = await startHarness({ env: { SERVICE_TOOLS_ALLOWED: 'read_file,list_files,message' } });
    try {
      const run = await narrow.call<Body>('POST', '/api/v1/autonomy/run', { body: { steps: [{ tool: 'shell', args: { command: 'id' } }] } });
      expect(run.status).to.equal(403);
      expect(run.body.code).to.equal('tool-not-permitted');
      expect(run.body.detail).to.contain('shell');
      const asked = await narrow.call<Body>('POST', '/api/v1/autonomy/run', {
        body: { steps: [{ tool: 'message', args: { text: 'x' } }], tools: ['message', 'http'] },
      });
      expect(asked.status).to.equal(403);
      expect(asked.body.detail).to.contain('http');
      const automation = await narrow.call<Body>('POST', '/api/v1/automations', { body: { name: 'x', steps: [{ tool: 'shell', args: { command: 'id' } }] } });
      expect(automation.status).to.equal(403);
      const fine = await narrow.call<Body>('POST', '/api/v1/autonomy/run', { body: { steps: [{ tool: 'list_files', args: {} }] } });
      expect(fine.status).to.equal(202);
    } finally {
      await narrow.close();
    }
  });
});
