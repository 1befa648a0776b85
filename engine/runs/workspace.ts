// Workspaces: where a run's tools act. A requested workspace is resolved inside the configured root.
// A vibe run works on a scratch copy: a git worktree at HEAD when the workspace is a repository,
// else a copy made into a fresh repository, so the diff of what the run changed comes from git.
import { execFile } from 'node:child_process';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { ValidationError } from '../platform/index.js';
import { resolveInside } from '../tools/index.js';

const exec = promisify(execFile);
const GIT_ID = ['-c', 'user.name=automation-service', '-c', 'user.email=automation-service@localhost', '-c', 'commit.gpgsign=false'];
const DIFF_MAX_BYTES = 1024 * 1024;

export async function resolveWorkspace(root: string, requested: string | undefined): Promise<string> {
  try {
    const dir = await resolveInside(root, requested ?? '.');
    if (!(await fs.stat(dir)).isDirectory()) throw new Error('not a folder');
    return dir;
  } catch (err) {
    throw new ValidationError(`workspace ${requested ?? '.'} is not a folder inside the workspace root`, [
      { path: '/body/workspace', message: `must name a folder inside SERVICE_WORKSPACE_ROOT (${(err as Error).message})` },
    ]);
  }
}

async function git(cwd: string, args: string[]): Promise<string> {
  const { stdout } = await exec('git', [...GIT_ID, ...args], { cwd, maxBuffer: 64 * 1024 * 1024 });
  return stdout;
}

async function repositoryOf(dir: string): Promise<string | null> {
  try {
    return (await git(dir, ['rev-parse', '--show-toplevel'])).trim();
  } catch {
    return null;
  }
}

export type Scratch = {
  dir: string;
  kind: 'worktree' | 'copy';
  /** unified diff of everything changed since the scratch was made, and the changed paths */
  diff(): Promise<{ diff: string; changed_files: string[]; truncated: boolean }>;
  remove(): Promise<void>;
};

export async function makeScratch(workspace: string): Promise<Scratch> {
  const base = await fs.mkdtemp(path.join(os.tmpdir(), 'vibe-'));
  const repo = await repositoryOf(workspace);
  let dir: string;
  let kind: Scratch['kind'];
  if (repo) {
    dir = path.join(base, 'worktree');
    await git(repo, ['worktree', 'add', '--detach', dir, 'HEAD']);
    dir = path.join(dir, path.relative(repo, workspace));
    kind = 'worktree';
  } else {
    dir = path.join(base, 'copy');
    await fs.cp(workspace, dir, { recursive: true, filter: (src) => !/(^|\/)(node_modules|\.git)(\/|$)/.test(path.relative(workspace, src)) });
    await git(dir, ['init', '-q']);
    await git(dir, ['add', '-A']);
    await git(dir, ['commit', '-q', '--allow-empty', '-m', 'scratch copy']);
    kind = 'copy';
  }
  return {
    dir,
    kind,
    async diff() {
      await git(dir, ['add', '-A', '.']);
      const full = await git(dir, ['diff', '--cached', '--no-color', '--relative', 'HEAD']);
      const names = (await git(dir, ['diff', '--cached', '--name-only', '--relative', 'HEAD'])).split('\n').filter(Boolean);
      const truncated = Buffer.byteLength(full) > DIFF_MAX_BYTES;
      return { diff: truncated ? Buffer.from(full).subarray(0, DIFF_MAX_BYTES).toString('utf8') : full, changed_files: names, truncated };
    },
    async remove() {
      if (repo) await git(repo, ['worktree', 'remove', '--force', path.join(base, 'worktree')]).catch(() => {});
      await fs.rm(base, { recursive: true, force: true });
    },
  };
}
