// What a tenant's workspace cannot make an audit phase do: run a program its repository's git config names
// (a filter driver's clean or process command, one an included file names, one a nested repository's config
// names), write its index, or have a finding or a metric quote a credential of its package.json or lockfile.
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { expect } from 'chai';
import { openWorkspace } from '../../engine/audit/phases/workspace.js';
import { runPhase } from '../../engine/audit/run-phase.js';
import { type Sandbox } from '../../engine/tools/index.js';
import { openAuditSandbox } from '../support/audit-sandbox.js';
import { PLANTED_TOKEN } from '../support/projects.js';

async function write(root: string, files: Record<string, string>): Promise<void> {
  for (const [rel, text] of Object.entries(files)) {
    await fs.mkdir(path.dirname(path.join(root, rel)), { recursive: true });
    await fs.writeFile(path.join(root, rel), text);
  }
}

/** git as a tenant's shell step runs it: its own config, none of the host's */
function git(cwd: string, ...args: string[]): string {
  return execFileSync('git', ['-c', 'user.name=t', '-c', 'user.email=t@t', ...args], {
    cwd,
    encoding: 'utf8',
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { PATH: process.env.PATH, HOME: cwd, GIT_CONFIG_NOSYSTEM: '1', GIT_CONFIG_GLOBAL: '/dev/null' },
  });
}

const exists = (p: string) =>
  fs.access(p).then(
    () => true,
    () => false,
  );
const digest = async (p: string) =>
  createHash('sha256')
    .update(await fs.readFile(p))
    .digest('hex');

describe('audit hardening: the workspace’s git config runs nothing, and what is quoted is masked', function () {
  this.timeout(90_000);
  let base: string;
  let sandbox: Sandbox;
  before(async () => {
    base = await fs.realpath(await fs.mkdtemp(path.join(os.tmpdir(), 'audit-hardening-')));
    sandbox = openAuditSandbox('audit-hardening');
  });
  after(async () => {
    sandbox.close();
    await fs.rm(base, { recursive: true, force: true });
  });

  /**
   * A repository whose files are committed plainly, then whose config names filter drivers for them (a clean
   * command, a process command, one in an included file) and whose nested repository names one too; a.js
   * changed, b.js, c.txt, d.md and the nested s.js only touched (their stat no longer matches the index, so
   * git compares their content, through the filter when its config names one), new.js untracked.
   */
  async function filtered(name: string, command: (marker: string) => string) {
    const root = path.join(base, name);
    const markers = path.join(base, `${name}-markers`);
    await fs.mkdir(markers);
    await write(root, {
      '.gitattributes': '*.js filter=x\n*.txt filter=y\n*.md filter=z\n',
      'a.js': 'export const a = 1;\n',
      'b.js': 'export const b = 1;\n',
      'c.txt': 'c\n',
      'd.md': '# d\n',
      'nested/.gitattributes': '* filter=x\n',
      'nested/s.js': 'export const s = 1;\n',
    });
    git(path.join(root, 'nested'), 'init', '-q');
    git(path.join(root, 'nested'), 'add', '-A');
    git(path.join(root, 'nested'), 'commit', '-qm', 'nested');
    git(root, 'init', '-q');
    git(root, 'add', '-A');
    git(root, 'commit', '-qm', 'plain');
    // what any shell step of the tenant can write
    git(root, 'config', 'filter.x.clean', command(path.join(markers, 'clean')));
    git(root, 'config', 'filter.y.process', command(path.join(markers, 'process')));
    await fs.writeFile(path.join(root, '.git', 'extra.config'), `[filter "z"]\n\tclean = ${command(path.join(markers, 'included'))}\n`);
    git(root, 'config', 'include.path', 'extra.config');
    git(path.join(root, 'nested'), 'config', 'filter.x.clean', command(path.join(markers, 'nested')));
    await fs.writeFile(path.join(root, 'a.js'), 'export const a = 2;\n');
    await fs.writeFile(path.join(root, 'new.js'), 'export const n = 1;\n');
    const later = new Date(Date.now() + 3600_000);
    for (const rel of ['b.js', 'c.txt', 'd.md', 'nested/s.js']) await fs.utimes(path.join(root, rel), later, later);
    return { root, markers };
  }

  it('runs no filter the repository’s config names (clean, process, included, a nested repository’s), writes no index, and still sees what changed', async () => {
    const { root, markers } = await filtered('filters', (marker) => `sh -c 'touch ${marker}; cat'`);
    const index = await digest(path.join(root, '.git', 'index'));
    const ws = await openWorkspace(root);
    expect(await fs.readdir(markers), 'a program the workspace named ran').to.deep.equal([]);
    expect(await digest(path.join(root, '.git', 'index'))).to.equal(index);
    expect(ws.files).to.deep.equal(['.gitattributes', 'a.js', 'b.js', 'c.txt', 'd.md', 'new.js']);
    expect(ws.git).to.deep.include({ branch: 'master', detached: false });
    expect(ws.git!.changed!.sort()).to.deep.equal(['a.js', 'new.js']);
    // what plain git says of the same tree once its config names no filter
    git(root, 'config', '--unset-all', 'filter.x.clean');
    git(root, 'config', '--unset-all', 'filter.y.process');
    git(root, 'config', '--remove-section', 'include');
    git(path.join(root, 'nested'), 'config', '--unset-all', 'filter.x.clean');
    const plain = git(root, 'status', '--porcelain=v1', '-z', '--untracked-files=normal')
      .split('\0')
      .filter(Boolean)
      .map((l) => l.slice(3));
    expect(ws.git!.changed!.sort()).to.deep.equal(plain.sort());
    expect(await exists(path.join(markers, 'clean'))).to.equal(false);
  });

  it('ends every phase in the sandbox at its pace when the repository’s config names a filter that sleeps', async () => {
    const { root } = await filtered('sleeps', () => `sh -c 'sleep 300; cat'`);
    const t0 = performance.now();
    const outs = await Promise.all(
      (['security', 'architecture', 'sanity', 'health'] as const).map((phase) => runPhase(sandbox, root, phase, { layers: null, timeoutMs: 40_000 })),
    );
    // a phase held by the filter ends only at its timeout (40 s, as timed_out); the four take about 10 s on a busy machine
    expect(performance.now() - t0).to.be.below(30_000);
    expect(outs[2]!.metrics.git).to.deep.include({ branch: 'master', uncommitted: 2 });
  });

  describe('the sanity phase quotes no credential of package.json or its lockfile', () => {
    const range = `git+https://x-access-token:${PLANTED_TOKEN}@github.com/acme/private-lib.git`;
    const manifest = JSON.stringify({ name: 'w', dependencies: { 'private-lib': range } });
    const lockfiles: Record<string, { files: Record<string, string>; message: string }> = {
      npm: {
        files: {
          'package-lock.json': JSON.stringify({
            lockfileVersion: 3,
            packages: {
              '': { name: 'w', dependencies: {} },
              // a license the sanity phase quotes as it is: masked by phase-main, whatever the phase forgets
              'node_modules/gpl-thing': { version: '1.0.0', license: `GPL-3.0 ${PLANTED_TOKEN}` },
            },
          }),
        },
        message: 'package.json declares private-lib@git+***, package-lock.json records nothing for it',
      },
      pnpm: {
        files: { 'pnpm-lock.yaml': "lockfileVersion: '9.0'\nimporters:\n  .:\n    dependencies: {}\n" },
        message: 'package.json declares private-lib@git+***, pnpm-lock.yaml records nothing for it',
      },
      yarn: { files: { 'yarn.lock': '# yarn lockfile v1\n' }, message: 'yarn.lock has no entry for private-lib@git+***' },
    };
    for (const [kind, { files, message }] of Object.entries(lockfiles))
      it(`masks a token in a declared range (${kind})`, async () => {
        const root = path.join(base, `quotes-${kind}`);
        await write(root, { 'package.json': manifest, 'README.md': '# w\n', ...files });
        git(root, 'init', '-q');
        // a branch's name is quoted in the metrics too
        git(root, 'checkout', '-qb', `fix/${PLANTED_TOKEN}`);
        git(root, 'add', '-A');
        git(root, 'commit', '-qm', 'w');
        const out = await runPhase(sandbox, root, 'sanity', { layers: null, timeoutMs: 60_000 });
        expect(JSON.stringify(out)).not.to.contain(PLANTED_TOKEN.slice(4));
        expect(out.findings.filter((f) => f.rule === 'lockfile-mismatch').map((f) => f.message)).to.include(message);
        expect(out.metrics.git).to.deep.include({ branch: 'fix/***' });
        if (kind === 'npm') {
          expect(out.findings.map((f) => f.message)).to.include('gpl-thing@1.0.0 is GPL-3.0 ***, a copyleft license, and not a dev dependency');
          expect(out.metrics.licenses).to.deep.equal({ 'GPL-3.0 ***': 1 });
        }
      });
  });
});

describe('what the worker reads of a repository’s git data before a phase', function () {
  this.timeout(30_000);

  it('never waits on a FIFO swapped in for a file it reads (.git, commondir): each look ends at once, however the swaps fall', async () => {
    const { spawn } = await import('node:child_process');
    const { gitMountsOf } = await import('../../engine/audit/git-mounts.js');
    const tenant = await fs.realpath(await fs.mkdtemp(path.join(os.tmpdir(), 'git-mounts-')));
    const proj = path.join(tenant, 'proj');
    const store = path.join(tenant, 'store', 'g');
    await fs.mkdir(proj, { recursive: true });
    await fs.mkdir(store, { recursive: true });
    await fs.writeFile(path.join(proj, '.git'), `gitdir: ${store}\n`);
    await fs.writeFile(path.join(store, 'plain'), '.\n');
    // the tenant's own step, meanwhile: a plain file and a fresh FIFO renamed over commondir, again and again
    const swapper = spawn('sh', ['-c', 'while :; do cp plain f && mv -f f commondir; mkfifo p && mv -f p commondir; done'], {
      cwd: store,
      stdio: 'ignore',
      detached: true,
    });
    try {
      const until = Date.now() + 3000;
      let looks = 0;
      while (Date.now() < until) {
        const look = gitMountsOf(proj, tenant);
        const hung = await Promise.race([look.then(() => false), new Promise<boolean>((r) => setTimeout(() => r(true), 1000))]);
        expect(hung, `look ${looks + 1} waited past 1 s`).to.equal(false);
        looks++;
      }
      expect(looks).to.be.above(20);
    } finally {
      process.kill(-swapper.pid!, 'SIGKILL');
      await fs.rm(tenant, { recursive: true, force: true });
    }
  });
});
