// The audit's phase program on its own (through runPhase, in bubblewrap when it is installed): links
// are not followed out of the root, the registry check is neutral when no registry answers, and a
// phase's findings are capped with the rest counted.
import { execFileSync } from 'node:child_process';
import fs from 'node:fs/promises';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { expect } from 'chai';
import { runPhase } from '../../engine/audit/run-phase.js';
import { checkOutdated } from '../../engine/audit/registry.js';
import { type Sandbox } from '../../engine/tools/index.js';
import { openAuditSandbox } from '../support/audit-sandbox.js';
import { PLANTED_TOKEN } from '../support/projects.js';

describe('audit phases', function () {
  this.timeout(60_000);
  let dir: string;
  let outside: string;
  let sandbox: Sandbox;
  before(async () => {
    sandbox = openAuditSandbox('audit-phases');
    const base = await fs.realpath(await fs.mkdtemp(path.join(os.tmpdir(), 'audit-phases-')));
    dir = path.join(base, 'ws');
    outside = path.join(base, 'outside');
    await fs.mkdir(path.join(dir, 'src'), { recursive: true });
    await fs.mkdir(outside);
    await fs.writeFile(path.join(outside, 'secret.txt'), `token=${PLANTED_TOKEN}\n`);
    // links out of the root: to a file, to a folder, and a folder link inside a repository
    await fs.symlink(path.join(outside, 'secret.txt'), path.join(dir, 'leak.txt'));
    await fs.symlink(outside, path.join(dir, 'linked'));
    await fs.writeFile(path.join(dir, 'src', 'inside.ts'), `export const t = '${PLANTED_TOKEN}';\n`);
    await fs.writeFile(path.join(dir, 'src', 'index.ts'), Array.from({ length: 1500 }, (_, i) => `// TODO: item ${i}`).join('\n'));
  });
  after(async () => {
    sandbox.close();
    await fs.rm(path.dirname(dir), { recursive: true, force: true });
  });

  for (const repo of [false, true])
    it(`follows no link out of the root (${repo ? 'a git repository' : 'a plain folder'})`, async () => {
      if (repo) {
        const git = (...args: string[]) => execFileSync('git', ['-c', 'user.name=t', '-c', 'user.email=t@t', ...args], { cwd: dir });
        git('init', '-q');
        git('add', '-A');
        git('commit', '-qm', 'links');
      }
      // the same token inside the root is found; the one behind the links is not read
      const out = await runPhase(sandbox, dir, 'security', { layers: null, timeoutMs: 60_000 });
      expect(out.findings.filter((f) => f.rule.startsWith('secret:')).map((f) => f.file)).to.deep.equal(['src/inside.ts']);
      expect(JSON.stringify(out)).not.to.contain(PLANTED_TOKEN);
    });

  it('reads no FIFO: one at a name a phase reads (tsconfig.json, yarn.lock) or in place of a tracked file does not hold a phase until its timeout', async () => {
    const fifos = path.join(path.dirname(dir), 'fifos');
    await fs.mkdir(path.join(fifos, 'src'), { recursive: true });
    await fs.writeFile(path.join(fifos, 'src', 'a.ts'), 'export const a = 1;\n');
    // and an import that resolves to a FIFO git does not list
    await fs.writeFile(path.join(fifos, 'src', 'b.ts'), "import { p } from './p';\nexport const b = p;\n");
    await fs.writeFile(path.join(fifos, 'package.json'), '{"name":"f","dependencies":{}}');
    execFileSync('git', ['-c', 'user.name=t', '-c', 'user.email=t@t', 'init', '-q'], { cwd: fifos });
    execFileSync('git', ['-c', 'user.name=t', '-c', 'user.email=t@t', 'add', '-A'], { cwd: fifos });
    execFileSync('git', ['-c', 'user.name=t', '-c', 'user.email=t@t', 'commit', '-qm', 'init'], { cwd: fifos });
    // git lists the tracked file whatever it has become; the other names are read by name
    await fs.rm(path.join(fifos, 'src', 'a.ts'));
    for (const name of ['src/a.ts', 'src/p.ts', 'tsconfig.json', 'yarn.lock', 'pnpm-lock.yaml', 'audit-layers.json'])
      execFileSync('mkfifo', [path.join(fifos, name)]);
    const t0 = performance.now();
    const outs = await Promise.all(
      (['security', 'architecture', 'sanity', 'health'] as const).map((phase) => runPhase(sandbox, fifos, phase, { layers: null, timeoutMs: 45_000 })),
    );
    expect(outs).to.have.length(4);
    // a phase held by a FIFO ends only at its timeout (45 s); the four take about 5 s on a busy machine
    expect(performance.now() - t0).to.be.below(25_000);
  });

  it('lists at most 1,000 findings of a phase, worst first, and counts the rest', async () => {
    const out = await runPhase(sandbox, dir, 'health', { layers: null, timeoutMs: 60_000 });
    expect(out.counts.info).to.equal(1500);
    expect(out.findings).to.have.length(1000);
    expect(out.findings_omitted).to.equal(500);
    expect(out.metrics.markers).to.deep.include({ TODO: 1500 });
  });

  it('refuses to read a folder other than the one checked (a link swapped in before the mount)', async () => {
    const err = await runPhase(sandbox, dir, 'sanity', { layers: null, identity: '1:1', timeoutMs: 60_000 }).catch((e: unknown) => e);
    expect(err).to.have.property('status', 'failed');
    expect((err as Error).message).to.contain('not the folder that was checked');
  });

  it('ends a phase that runs past its timeout as timed_out', async () => {
    const err = await runPhase(sandbox, dir, 'architecture', { layers: null, timeoutMs: 50 }).catch((e: unknown) => e);
    expect(err).to.have.property('status', 'timed_out');
  });

  it('checks outdated dependencies against a registry, and is neutral when none answers', async () => {
    const closed = net.createServer();
    await new Promise<void>((r) => closed.listen(0, '127.0.0.1', r));
    const port = (closed.address() as net.AddressInfo).port;
    await new Promise((r) => closed.close(r));
    const deps = [{ name: 'semver', range: '^6.0.0', locked: '6.3.1' }];
    const unanswered = await checkOutdated(deps, `http://127.0.0.1:${port}`);
    expect(unanswered).to.deep.equal({ metrics: { status: 'unknown', checked: 0, outdated: 0, unanswered: 1 }, findings: [] });
    expect(await checkOutdated(deps, null)).to.deep.include({ findings: [] });
    const answered = await checkOutdated(
      deps,
      'http://registry.test',
      (async () => new Response(JSON.stringify({ 'dist-tags': { latest: '7.6.0' } }), { status: 200 })) as unknown as typeof fetch,
    );
    expect(answered.metrics).to.deep.include({ status: 'checked', outdated: 1 });
    expect(answered.findings[0]).to.deep.include({ rule: 'outdated-major', severity: 'low', message: 'semver 6.3.1 is behind 7.6.0 (a major version)' });
  });
});
