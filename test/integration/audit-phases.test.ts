// The audit's phase program on its own (through runPhase, in bubblewrap when it is installed): links
// are not followed out of the root, the registry check is neutral when no registry answers, and a
// phase's findings are capped with the rest counted.
import { execFileSync } from 'node:child_process';
import fs from 'node:fs/promises';
import http from 'node:http';
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

  it('security: finds a secret past 1 MB and one in a binary-looking file, and names a file it cannot scan, never skips one in silence', async () => {
    const big = path.join(path.dirname(dir), 'big');
    await fs.mkdir(big);
    const filler = `${'// filler line of a bundle\n'.repeat(45_000)}`; // 1.2 MB
    await fs.writeFile(path.join(big, 'small.js'), `const t = '${PLANTED_TOKEN}';\n`);
    await fs.writeFile(path.join(big, 'bundle.js'), `${filler}const t = '${PLANTED_TOKEN}';\n`);
    await fs.writeFile(path.join(big, 'config.txt'), `\0\ntoken=${PLANTED_TOKEN}\n`);
    await fs.writeFile(path.join(big, '.env'), `${filler.replaceAll('//', '#')}GITHUB_TOKEN=${PLANTED_TOKEN}\n`);
    await fs.writeFile(path.join(big, 'locked.txt'), `token=${PLANTED_TOKEN}\n`);
    await fs.chmod(path.join(big, 'locked.txt'), 0o000);
    const out = await runPhase(sandbox, big, 'security', { layers: null, timeoutMs: 60_000 });
    const secrets = out.findings.filter((f) => f.rule.startsWith('secret:'));
    expect([...new Set(secrets.map((f) => f.file))].sort()).to.deep.equal(['.env', 'bundle.js', 'config.txt', 'small.js']);
    // the line is the file's, across the chunks
    expect(secrets.find((f) => f.file === 'bundle.js')).to.have.property('line', 45_001);
    expect(out.findings.filter((f) => f.rule === 'file-not-scanned').map((f) => [f.file, f.message])).to.deep.equal([
      ['locked.txt', 'locked.txt could not be scanned for secrets (unreadable): it is not known to hold none'],
    ]);
    expect(out.metrics).to.deep.include({ files: 5, files_scanned: 4, files_not_scanned: 1 });
    expect(JSON.stringify(out)).not.to.contain(PLANTED_TOKEN);
  });

  it("reports a repository's real git state when its git data is elsewhere in the tenant's root, and never a clean one it could not read", async function () {
    this.timeout(240_000);
    const tenant = path.join(path.dirname(dir), 'tenant');
    const g = (cwd: string, ...args: string[]) => execFileSync('git', ['-c', 'user.name=t', '-c', 'user.email=t@t', ...args], { cwd, stdio: 'pipe' });
    const repo = async (at: string, files: Record<string, string>) => {
      for (const [rel, text] of Object.entries(files)) {
        await fs.mkdir(path.dirname(path.join(at, rel)), { recursive: true });
        await fs.writeFile(path.join(at, rel), text);
      }
      g(at, 'init', '-q');
      g(at, 'add', '-A');
      g(at, 'commit', '-qm', 'init');
    };
    await repo(path.join(tenant, 'origin'), { 'README.md': '# a\n', '.gitignore': '.env\n' });
    g(tenant, 'clone', '-q', '--shared', 'origin', 'shared');
    g(path.join(tenant, 'origin'), 'worktree', 'add', '-q', '../wt');
    await repo(path.join(tenant, 'mono'), {
      'README.md': '# m\n',
      '.gitignore': '.env\n',
      'packages/app/README.md': '# app\n',
      'packages/lib/README.md': '# lib\n',
    });
    await fs.appendFile(path.join(tenant, 'mono', 'packages', 'lib', 'README.md'), 'changed\n');
    // in each: README.md changed and not committed, and a .env git ignores
    const dirs = ['origin', 'shared', 'wt', 'mono/packages/app'].map((d) => path.join(tenant, d));
    for (const d of dirs) {
      await fs.appendFile(path.join(d, 'README.md'), 'changed\n');
      await fs.writeFile(path.join(d, '.env'), 'X=1\n');
    }
    const audit = async (d: string, tenantRoot: string | null) => {
      const run = (phase: 'security' | 'sanity') => runPhase(sandbox, d, phase, { layers: null, tenantRoot, timeoutMs: 60_000 });
      const [security, sanity] = await Promise.all([run('security'), run('sanity')]);
      const rules = [...security.findings, ...sanity.findings].map((f) => `${f.rule}:${f.severity}`).filter((r) => /git|env|uncommitted|repository/.test(r));
      return { rules, git: sanity.metrics.git as Record<string, unknown> | null };
    };
    const [origin, shared, wt, app] = await Promise.all([audit(dirs[0]!, tenant), audit(dirs[1]!, tenant), audit(dirs[2]!, tenant), audit(dirs[3]!, tenant)]);
    // a package of a monorepo too: its repository's git data and the root's .gitignore (which ignores its .env)
    // are mounted, and git reads the package alone (another package's change is not the audited one's)
    for (const [name, got] of Object.entries({ origin, shared, wt, app })) {
      expect(got.rules, name).to.deep.equal(['uncommitted-changes:low']);
      expect(got.git, name).to.deep.include({ uncommitted: 1, branch: name === 'wt' ? 'wt' : 'master' });
    }
    // with nothing mounted beyond the folder (git data outside the tenant's root): unknown, neither clean nor "not a repository"
    const [sharedAlone, wtAlone] = await Promise.all([audit(dirs[1]!, null), audit(dirs[2]!, null)]);
    expect(sharedAlone.rules).to.deep.equal(['git-state-unknown:medium']);
    expect(sharedAlone.git).to.deep.include({ uncommitted: null });
    expect(String(sharedAlone.git!.unknown)).to.match(/^git could not read the repository's state: git status: /);
    expect(wtAlone.rules).to.deep.equal(['env-file-present:medium', 'git-state-unknown:medium']);
    expect(wtAlone.git).to.deep.include({ uncommitted: null });
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
    expect(unanswered).to.deep.equal({ metrics: { status: 'unknown', checked: 0, outdated: 0, unanswered: 1, invalid_names: 0 }, findings: [] });
    expect(await checkOutdated(deps, null)).to.deep.include({ findings: [] });
    const answered = await checkOutdated(
      deps,
      'http://registry.test',
      (async () => new Response(JSON.stringify({ 'dist-tags': { latest: '7.6.0' } }), { status: 200 })) as unknown as typeof fetch,
    );
    expect(answered.metrics).to.deep.include({ status: 'checked', outdated: 1 });
    expect(answered.findings[0]).to.deep.include({ rule: 'outdated-major', severity: 'low', message: 'semver 6.3.1 is behind 7.6.0 (a major version)' });
  });

  it('looks up only valid npm names, the whole name encoded: a package.json name chooses no path or query on the registry host', async () => {
    const asked: string[] = [];
    const registry = http.createServer((req, res) => {
      asked.push(req.url ?? '');
      res.setHeader('content-type', 'application/json');
      res.end(JSON.stringify({ 'dist-tags': { latest: '1.0.0' } }));
    });
    await new Promise<void>((r) => registry.listen(0, '127.0.0.1', r));
    try {
      const base = `http://127.0.0.1:${(registry.address() as net.AddressInfo).port}/repository/npm`;
      const deps = ['../../../admin/delete?all=1', '@scope/name', 'semver', '@scope/../../x', 'Upper', 'a%2F..', `x${'a'.repeat(214)}`, 'a#b'].map((name) => ({
        name,
        range: '^1.0.0',
        locked: '1.0.0',
      }));
      const out = await checkOutdated(deps, base);
      expect(asked.sort()).to.deep.equal(['/repository/npm/@scope%2Fname', '/repository/npm/semver']);
      expect(out.metrics).to.deep.equal({ status: 'checked', checked: 2, outdated: 0, unanswered: 0, invalid_names: 6 });
      expect(out.findings).to.deep.equal([
        {
          rule: 'dependency-name-invalid',
          severity: 'low',
          file: 'package.json',
          line: null,
          message: '6 declared dependencies are not named as npm names are, so not looked up in the registry',
        },
      ]);
    } finally {
      await new Promise((r) => registry.close(r));
    }
  });
});
