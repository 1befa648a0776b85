// Workspaces: where a run's tools act. Each tenant has its own root (SERVICE_WORKSPACE_ROOT/<tenant>,
// made on first use; the root itself for the single local tenant of SERVICE_AUTH=none), and a run's
// workspace is resolved inside its tenant's root. A vibe run works on a scratch copy in its tenant's
// scratch area: a git worktree at HEAD when the workspace is a repository, else a copy made into a
// fresh repository, so the diff of what the run changed comes from git.
import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import fs from 'node:fs/promises';
import path from 'node:path';
import { promisify } from 'node:util';
import { ValidationError } from '../platform/index.js';
import { resolveInside } from '../tools/index.js';

const exec = promisify(execFile);
const GIT_ID = ['-c', 'user.name=automation-service', '-c', 'user.email=automation-service@localhost', '-c', 'commit.gpgsign=false'];
const DIFF_MAX_BYTES = 1024 * 1024;

/** Where scratch copies go, per tenant: beside the tenants' folders, never in a shared temp folder. */
export const SCRATCH_DIR = '.scratch';

type Roots = { workspaceRoot: string; singleTenant: boolean };

/** The folder a tenant's runs act under (not made). */
export function tenantRootPath(roots: Roots, tenantId: string): string {
  return roots.singleTenant ? roots.workspaceRoot : path.join(roots.workspaceRoot, tenantId);
}

/**
 * Roots this process has made already, with their real paths: run creation need not ask the file
 * system again (the root's existence is checked with one call; its real path is taken again when it
 * was made again).
 */
const made = new Map<string, string>();

/** A tenant's root, made on first use (and again if it was removed since). */
export async function tenantRoot(roots: Roots, tenantId: string): Promise<string> {
  const dir = tenantRootPath(roots, tenantId);
  if (!made.has(dir) || !existsSync(dir)) {
    await fs.mkdir(dir, { recursive: true });
    made.set(dir, await fs.realpath(dir));
  }
  return dir;
}

/** A tenant's scratch area (vibe runs' copies), made on first use. */
export async function scratchRoot(roots: Roots, tenantId: string): Promise<string> {
  const dir = path.join(roots.workspaceRoot, SCRATCH_DIR, tenantId);
  await fs.mkdir(dir, { recursive: true });
  return dir;
}

/** The folder a request names inside a root, resolved (links followed) and checked to be inside it. */
export async function resolveWorkspace(root: string, requested: string | undefined): Promise<string> {
  // the root itself (most requests name no workspace): its real path was taken when tenantRoot made it
  const real = requested === undefined || requested === '.' ? made.get(root) : undefined;
  if (real) return real;
  try {
    const dir = await resolveInside(root, requested ?? '.');
    if (!(await fs.stat(dir)).isDirectory()) throw new Error('not a folder');
    return dir;
  } catch (err) {
    throw new ValidationError(`workspace ${requested ?? '.'} is not a folder inside the workspace root`, [
      { path: '/body/workspace', message: `must name a folder inside your workspace root (${(err as Error).message})` },
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
  /** folders outside `dir` that git needs inside a sandbox: the repository's git directory for a worktree */
  binds: string[];
  /** unified diff of everything changed since the scratch was made, and the changed paths */
  diff(): Promise<{ diff: string; changed_files: string[]; truncated: boolean }>;
  remove(): Promise<void>;
};

export async function makeScratch(workspace: string, area: string): Promise<Scratch> {
  const base = await fs.mkdtemp(path.join(area, 'vibe-'));
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
  const binds = repo ? [path.resolve(repo, (await git(repo, ['rev-parse', '--git-common-dir'])).trim())] : [];
  return {
    dir,
    kind,
    binds,
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
