// A vibe run's scratch copy (engine/runs/workspace.ts) stops with its run: the copy, the clone and the
// diff are killed when the run's signal aborts (its budget, a cancel, a shutdown), and the diff of a run
// that was stopped still has a few seconds to be taken (engine/runs/programs.ts).
import { spawnSync } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { expect } from 'chai';
import { makeScratch, sweepLeftovers } from '../../engine/runs/workspace.js';
import { DIFF_GRACE_MS, diffGraceMs, withGrace } from '../../engine/runs/programs.js';
import { noSandbox, type Sandbox } from '../../engine/tools/sandbox.js';
import { sweepTemp, tempPrefix, TEMP_KINDS, type RunStatus } from '../../engine/platform/index.js';

/** The host's processes, made slow on demand: then every command sleeps 30 s before it does its work. */
function slowSandbox(slow = true): Sandbox & { slow: boolean } {
  const base = noSandbox();
  const sandbox = {
    ...base,
    slow,
    spawn: (argv: string[], o: Parameters<Sandbox['spawn']>[1]) =>
      base.spawn(sandbox.slow ? ['/bin/sh', '-c', 'sleep 30; exec "$@"', 'slow', ...argv] : argv, o),
  };
  return sandbox;
}

describe('a vibe run’s scratch copy', () => {
  let dir: string;
  beforeEach(async () => {
    dir = await fs.mkdtemp(path.join(os.tmpdir(), 'scratch-test-'));
    await fs.mkdir(path.join(dir, 'root', 'ws'), { recursive: true });
    await fs.mkdir(path.join(dir, 'area'));
    await fs.writeFile(path.join(dir, 'root', 'ws', 'a.txt'), 'one\n');
  });
  afterEach(() => fs.rm(dir, { recursive: true, force: true }));

  const opts = (signal?: AbortSignal) => ({
    root: path.join(dir, 'root'),
    workspace: path.join(dir, 'root', 'ws'),
    area: path.join(dir, 'area'),
    runId: 'run_0123456789abcdefghjkmnpqrs',
    signal,
  });

  it('is made and diffed on the host’s processes', async () => {
    const scratch = await makeScratch(noSandbox(), opts());
    await fs.appendFile(path.join(scratch.dir, 'a.txt'), 'two\n');
    const { changed_files, diff } = await scratch.diff();
    expect(changed_files).to.deep.equal(['a.txt']);
    expect(diff).to.contain('+two');
    await scratch.remove();
    expect(await fs.readdir(path.join(dir, 'area'))).to.deep.equal([]);
  });

  it('is removed in the sandbox, its area bound: a step that swapped a folder of it for a link mid-removal led the service’s own removal outside', async () => {
    const spawned: { argv: string[]; workspace: string }[] = [];
    const base = noSandbox();
    const recording: Sandbox = { ...base, spawn: (argv, o) => (spawned.push({ argv, workspace: o.workspace }), base.spawn(argv, o)) };
    const scratch = await makeScratch(recording, opts());
    // a link in the copy to a folder outside: removed as a link, what it points to kept
    const outside = path.join(dir, 'outside');
    await fs.mkdir(outside);
    await fs.writeFile(path.join(outside, 'keep.txt'), 'x');
    await fs.symlink(outside, path.join(scratch.dir, 'link'));
    spawned.length = 0;
    await scratch.remove();
    expect(await fs.readdir(path.join(dir, 'area'))).to.deep.equal([]);
    expect(await fs.readdir(outside)).to.deep.equal(['keep.txt']);
    expect(spawned, 'one process in the sandbox, the area bound as its workspace').to.have.length(1);
    expect(spawned[0]!.workspace).to.equal(path.join(dir, 'area'));
    expect(spawned[0]!.argv.join(' ')).to.contain('rm -rf');
  });

  const git = (cwd: string, ...args: string[]) => {
    const r = spawnSync('git', ['-c', 'user.email=t@t', '-c', 'user.name=t', '-c', 'commit.gpgsign=false', ...args], { cwd, encoding: 'utf8' });
    expect(r.status, r.stderr).to.equal(0);
    return r.stdout;
  };

  it('diffs against the commit it was made at, whatever the run commits or resets in it since', async () => {
    const root = path.join(dir, 'root');
    git(root, 'init', '-q');
    git(root, 'add', '-A');
    git(root, 'commit', '-qm', 'base');
    const scratch = await makeScratch(noSandbox(), opts());
    expect(scratch.kind).to.equal('worktree');
    await fs.appendFile(path.join(scratch.dir, 'a.txt'), 'two\n');
    git(scratch.dir, 'add', '-A');
    git(scratch.dir, 'commit', '-qm', 'the run’s own commit');
    const { changed_files, diff } = await scratch.diff();
    expect(changed_files).to.deep.equal(['a.txt']);
    expect(diff).to.contain('+two');
    await scratch.remove();
  });

  it('copies a workspace that its repository’s HEAD does not hold (untracked, no commit yet, a submodule), as a folder in no repository is', async () => {
    const root = path.join(dir, 'root');
    const cases: [string, () => Promise<void>][] = [
      [
        'untracked in a repository with commits',
        async () => {
          await fs.writeFile(path.join(root, 'top.txt'), 'x\n');
          git(root, 'init', '-q');
          git(root, 'add', 'top.txt');
          git(root, 'commit', '-qm', 'base');
        },
      ],
      ['in a repository with no commit yet', async () => void git(root, 'init', '-q')],
      [
        'a submodule’s folder (its .git a file)',
        async () => {
          git(root, 'init', '-q');
          await fs.writeFile(path.join(root, 'ws', '.git'), 'gitdir: ../.git/modules/ws\n');
        },
      ],
    ];
    for (const [what, make] of cases) {
      await fs.rm(path.join(root, '.git'), { recursive: true, force: true });
      await fs.rm(path.join(root, 'ws', '.git'), { force: true });
      await make();
      const scratch = await makeScratch(noSandbox(), opts());
      expect(scratch.kind, what).to.equal('copy');
      expect(await fs.readFile(path.join(scratch.dir, 'a.txt'), 'utf8'), what).to.equal('one\n');
      await fs.appendFile(path.join(scratch.dir, 'a.txt'), 'two\n');
      expect((await scratch.diff()).changed_files, what).to.deep.equal(['a.txt']);
      await scratch.remove();
    }
  });

  it('copies ignored files a folder in no repository holds, so that their changes are in the diff, but not a new file .gitignore names', async () => {
    const ws = path.join(dir, 'root', 'ws');
    await fs.writeFile(path.join(ws, '.gitignore'), 'build/\n*.env\n');
    await fs.writeFile(path.join(ws, 'app.env'), 'A=1\n');
    const scratch = await makeScratch(noSandbox(), opts());
    await fs.appendFile(path.join(scratch.dir, 'app.env'), 'B=2\n');
    await fs.mkdir(path.join(scratch.dir, 'build'));
    await fs.writeFile(path.join(scratch.dir, 'build', 'out.js'), 'built\n');
    expect((await scratch.diff()).changed_files).to.deep.equal(['app.env']);
    await scratch.remove();
  });

  it('cuts a diff over its limit without a replaced byte: a file not UTF-8 too big to carry whole ends it, a character cut in two is left out', async () => {
    const MB = 1024 * 1024;
    // a Latin-1 text over the limit: its binary patch could not be carried whole, so the diff ends before it
    const latin = await makeScratch(noSandbox(), opts());
    await fs.appendFile(path.join(latin.dir, 'a.txt'), 'two\n');
    await fs.writeFile(path.join(latin.dir, 'big.txt'), Buffer.alloc(MB + 100, Buffer.from('caf\xe9\n', 'latin1')));
    const cut = await latin.diff();
    expect(cut.changed_files).to.deep.equal(['a.txt', 'big.txt']);
    expect(cut.truncated).to.equal(true);
    expect(cut.diff).to.match(/^diff --git a\/a\.txt b\/a\.txt\n[^]*\+two\n$/);
    await latin.remove();
    // UTF-8 text over the limit, cut at a whole character whichever byte the limit falls on
    for (const pad of ['', 'x']) {
      const utf = await makeScratch(noSandbox(), opts());
      await fs.writeFile(path.join(utf.dir, 'big.txt'), pad + 'é'.repeat(MB));
      const { diff, truncated } = await utf.diff();
      expect(truncated).to.equal(true);
      expect(diff).not.to.contain('\ufffd');
      expect(Buffer.byteLength(diff)).to.be.within(MB - 3, MB);
      await utf.remove();
    }
  });

  it('carries many files that are not UTF-8 whole: their blobs are read a few hundred a script (one script of all of them was E2BIG)', async function () {
    // 800 files through git: 16 s alone on a slower machine, past 30 s beside the suite's other files
    this.timeout(120_000);
    const many = await makeScratch(noSandbox(), opts());
    for (let i = 0; i < 800; i++)
      await fs.writeFile(path.join(many.dir, `legacy-${String(i).padStart(3, '0')}.properties`), Buffer.from(`cl\xe9=${i}\n`, 'latin1'));
    const { diff, truncated, changed_files } = await many.diff();
    expect(truncated).to.equal(false);
    expect(changed_files).to.have.length(800);
    expect(diff.match(/^GIT binary patch$/gm)).to.have.length(800);
    expect(diff).to.not.contain('\ufffd');
    await many.remove();
  });

  it('leaves other runs’ scratch copies and checkouts out of a copy of the root they are in (the local tenant’s)', async () => {
    const root = path.join(dir, 'root');
    for (const other of ['.scratch/local/vibe-run_x/copy', '.checkouts/run_y'])
      await fs.mkdir(path.join(root, other), { recursive: true }).then(() => fs.writeFile(path.join(root, other, 'draft.txt'), 'theirs\n'));
    const scratch = await makeScratch(noSandbox(), { ...opts(), workspace: root });
    expect((await fs.readdir(scratch.dir)).sort()).to.deep.equal(['.git', 'ws']);
    await scratch.remove();
  });

  it('stops copying when the run stops, and leaves nothing behind', async () => {
    const c = new AbortController();
    const sandbox = slowSandbox();
    // the copy is slow; what removes it once it stops is not (the removal runs in the sandbox too)
    setTimeout(() => ((sandbox.slow = false), c.abort()), 200);
    const started = Date.now();
    const err = await makeScratch(sandbox, opts(c.signal)).catch((e: Error) => e);
    expect(err).to.be.instanceOf(Error);
    expect((err as Error).message).to.contain('stopped');
    expect(Date.now() - started).to.be.below(5000);
    expect(await fs.readdir(path.join(dir, 'area'))).to.deep.equal([]);
  });

  it('stops a diff when its signal aborts', async () => {
    const sandbox = slowSandbox(false);
    const scratch = await makeScratch(sandbox, opts());
    sandbox.slow = true;
    const started = Date.now();
    const err = await scratch.diff(AbortSignal.timeout(200)).catch((e: Error) => e);
    expect((err as Error).message).to.contain('stopped');
    expect(Date.now() - started).to.be.below(5000);
    sandbox.slow = false;
    await scratch.remove();
  });

  it('gives the diff of a stopped run its grace: a signal that aborts that long after the run’s', async () => {
    const run = new AbortController();
    const grace = withGrace(run.signal, 150);
    expect(grace.aborted).to.equal(false);
    run.abort('budget');
    await new Promise((r) => setTimeout(r, 50));
    expect(grace.aborted).to.equal(false);
    await new Promise((r) => setTimeout(r, 200));
    expect(grace.aborted).to.equal(true);
    expect(grace.reason).to.equal('budget');
    // already stopped: the grace starts now
    const late = withGrace(run.signal, 100);
    expect(late.aborted).to.equal(false);
    await new Promise((r) => setTimeout(r, 200));
    expect(late.aborted).to.equal(true);
  });

  it('gives no grace at a shutdown: the interrupted attempt goes back in line and the process is about to exit', async () => {
    const stop = (status: string) => ({ status, error: { code: status, message: status } });
    expect(diffGraceMs(stop('timed_out'))).to.equal(DIFF_GRACE_MS);
    expect(diffGraceMs(stop('canceled'))).to.equal(DIFF_GRACE_MS);
    expect(diffGraceMs(stop('interrupted'))).to.equal(0);
    const run = new AbortController();
    const grace = withGrace(run.signal, diffGraceMs);
    run.abort(stop('interrupted'));
    await new Promise((r) => setTimeout(r, 20));
    expect(grace.aborted).to.equal(true);
  });
});

describe('what attempts of a process that died left on disk', () => {
  it('removes scratch copies of runs not running and checkouts of runs ended or gone, only folders a run names, never through a link', async () => {
    const root = await fs.mkdtemp(path.join(os.tmpdir(), 'leftovers-'));
    try {
      const run = (c: string) => `run_${c.repeat(26)}`;
      const [running, ended, queued, gone] = [run('a'), run('b'), run('c'), run('d')];
      const status: Record<string, RunStatus> = {};
      for (const tenant of ['tenant-a', 'local'])
        Object.assign(status, { [`${tenant}/${running}`]: 'running', [`${tenant}/${ended}`]: 'succeeded', [`${tenant}/${queued}`]: 'queued' });
      const asked: string[] = [];
      const statusOf = async (tenant: string, runId: string) => {
        asked.push(`${tenant}/${runId}`);
        return status[`${tenant}/${runId}`] ?? null;
      };
      const remove = (dir: string, parent: string, name: string) => fs.rm(path.join(dir, parent, name), { recursive: true, force: true });
      const made = async (...parts: string[]) => {
        await fs.mkdir(path.join(root, ...parts), { recursive: true });
        await fs.writeFile(path.join(root, ...parts, 'f'), 'x');
      };
      for (const id of [running, ended, queued, gone]) await made('.scratch', 'tenant-a', `vibe-${id}-x1`);
      await made('.scratch', 'tenant-a', 'vibe-x1y2z3');
      for (const id of [running, ended, queued, gone]) await made('tenant-a', '.checkouts', id);
      await made('tenant-a', '.checkouts', 'mine');
      // a tenant's .checkouts that is a link to a folder holding an ended run's name: not followed
      await made('elsewhere', ended);
      await fs.mkdir(path.join(root, 'tenant-b'));
      await fs.symlink(path.join(root, 'elsewhere'), path.join(root, 'tenant-b', '.checkouts'));

      expect(await sweepLeftovers({ workspaceRoot: root, singleTenant: false }, statusOf, remove)).to.equal(5);
      expect((await fs.readdir(path.join(root, '.scratch', 'tenant-a'))).sort()).to.deep.equal([`vibe-${running}-x1`, 'vibe-x1y2z3']);
      // a queued run's checkout is the folder its next attempt makes again: kept until the run has ended
      expect((await fs.readdir(path.join(root, 'tenant-a', '.checkouts'))).sort()).to.deep.equal(['mine', running, queued].sort());
      expect(await fs.readdir(path.join(root, 'elsewhere'))).to.deep.equal([ended]);
      expect(asked).to.include(`tenant-a/${gone}`).and.not.include(`tenant-b/${ended}`);
      // the single local tenant's checkouts are in the root itself, its runs under its id: a running one stays
      await made('.checkouts', ended);
      await made('.checkouts', running);
      expect(await sweepLeftovers({ workspaceRoot: root, singleTenant: true }, statusOf, remove)).to.equal(1);
      expect(await fs.readdir(path.join(root, '.checkouts'))).to.deep.equal([running]);
      expect(asked).to.include(`local/${running}`);
    } finally {
      await fs.rm(root, { recursive: true, force: true });
    }
  });

  it('removes the temp folders and files a killed process left (a checkout’s, with the code host’s token; an upload’s; an audit’s) once older than any lasts, only its own', async () => {
    const tmp = await fs.mkdtemp(path.join(os.tmpdir(), 'git-temp-'));
    try {
      const day = 86_400_000;
      const folder = async (name: string, ago: number) => {
        await fs.mkdir(path.join(tmp, name));
        await fs.writeFile(path.join(tmp, name, 'config'), 'extraHeader = "Authorization: Basic dG9rZW4="');
        const at = new Date(Date.now() - ago);
        await fs.utimes(path.join(tmp, name), at, at);
      };
      // every kind, as the service names them
      const ours = await Promise.all(TEMP_KINDS.map((kind) => fs.mkdtemp(tempPrefix(kind, tmp))));
      for (const dir of ours) {
        await fs.writeFile(path.join(dir, 'config'), 'extraHeader = "Authorization: Basic dG9rZW4="');
        const at = new Date(Date.now() - 2 * day);
        await fs.utimes(dir, at, at);
      }
      const spill = `${tempPrefix('upload', tmp)}${randomUUID()}`;
      await fs.writeFile(spill, 'RIFF');
      await fs.utimes(spill, new Date(Date.now() - 2 * day), new Date(Date.now() - 2 * day));
      // one of a live process (a run's budget and an audit are at most a day), another program's, names not ours
      await folder('svc-git-Ij56Kl', 3_600_000);
      await folder('other-Mn78Op', 2 * day);
      await folder('svc-git-long-name', 2 * day);
      await folder('upload-Ab12Cd', 2 * day);
      await fs.symlink(path.join(tmp, 'other-Mn78Op'), path.join(tmp, 'svc-git-Qr90St'));
      // another user's is not ours to remove (a shared temp folder)
      expect(await sweepTemp(Date.now(), tmp, 12345)).to.equal(0);
      expect(await sweepTemp(Date.now(), tmp)).to.equal(TEMP_KINDS.length + 1);
      expect((await fs.readdir(tmp)).sort()).to.deep.equal(['other-Mn78Op', 'svc-git-Ij56Kl', 'svc-git-Qr90St', 'svc-git-long-name', 'upload-Ab12Cd']);
    } finally {
      await fs.rm(tmp, { recursive: true, force: true });
    }
  });
});
