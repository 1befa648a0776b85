// What a gate result is about: the workspace's git commit and tree (dirty or not), and a digest of
// the gate's inputs (its globs, or the files git knows: tracked and untracked but not ignored; every
// file outside a repository). git runs in the sandbox, as for any command of the workspace: a
// repository's own config can name programs to run. Files are hashed by the service without
// following links (a link is hashed as its target's name), and a file's hash is kept while its size
// and mtime stay the same, so a digest after a few changes reads only what changed.
import { createHash } from 'node:crypto';
import fs from 'node:fs/promises';
import path from 'node:path';
import { glob } from 'tinyglobby';
import { runProcess, type Sandbox } from '../tools/index.js';

export type GitState = { commit: string | null; tree: string | null; dirty: boolean | null; files: string[] | null };

const GIT = ['git', '--no-optional-locks', '-c', 'safe.directory=*', '-c', 'core.fsmonitor=false', '-c', 'core.hooksPath=/dev/null'];
const ALWAYS_IGNORED = ['.git/**', '**/node_modules/**'];

/** The repository at the workspace's root, seen from the sandbox; all null outside a repository. */
export async function gitState(sandbox: Sandbox, workspace: string, binds: string[] = []): Promise<GitState> {
  const none = { commit: null, tree: null, dirty: null, files: null };
  if (!(await fs.lstat(path.join(workspace, '.git')).catch(() => null))) return none;
  const q = (args: string[]) => args.map((a) => `'${a}'`).join(' ');
  const script = [
    `${q(GIT)} rev-parse --verify -q HEAD || echo`,
    `${q(GIT)} rev-parse --verify -q 'HEAD^{tree}' || echo`,
    'echo @@',
    `${q(GIT)} status --porcelain=v1 --untracked-files=normal | head -c 4096`,
    'echo @@',
    `${q(GIT)} ls-files -z --cached --others --exclude-standard`,
  ].join('; ');
  const r = await runProcess(sandbox, ['/bin/sh', '-c', script], {
    workspace,
    env: { PATH: '/usr/bin:/bin', HOME: '/tmp' },
    network: false,
    maxBytes: 16 * 1024 * 1024,
    timeoutMs: 30_000,
  });
  if (r.exit_code !== 0 || r.truncated) return none;
  const [head = '', status = '', files = ''] = r.stdout.split('@@\n');
  const [commit, tree] = head.trim().split('\n');
  return {
    commit: commit || null,
    tree: tree || null,
    dirty: status.trim().length > 0,
    files: files.split('\0').filter(Boolean),
  };
}

/** The files of a gate's inputs, relative to the workspace, sorted. */
export async function inputFiles(workspace: string, globs: string[] | null, git: GitState): Promise<string[]> {
  const files = globs
    ? await glob(globs, { cwd: workspace, dot: true, ignore: ALWAYS_IGNORED, onlyFiles: true, followSymbolicLinks: false, expandDirectories: false })
    : (git.files ?? (await glob(['**'], { cwd: workspace, dot: true, ignore: ALWAYS_IGNORED, onlyFiles: true, followSymbolicLinks: false })));
  return [...new Set(files)].sort();
}

/** Hashes files by content, keeping each hash while the file's size and mtime stay the same. */
export class FileHasher {
  private readonly known = new Map<string, { size: number; mtimeMs: number; hash: string }>();

  /** `sha256:<hex>` over every file's path and hash; a missing file counts as missing. */
  async digest(workspace: string, files: string[]): Promise<string> {
    const lines = await Promise.all(files.map(async (f) => `${f}\0${await this.hashOf(path.join(workspace, f))}\n`));
    return `sha256:${createHash('sha256').update(lines.join('')).digest('hex')}`;
  }

  private async hashOf(file: string): Promise<string> {
    const stat = await fs.lstat(file).catch(() => null);
    if (!stat) return 'missing';
    if (stat.isSymbolicLink()) return `link:${await fs.readlink(file).catch(() => '')}`;
    if (!stat.isFile()) return 'other';
    const seen = this.known.get(file);
    if (seen && seen.size === stat.size && seen.mtimeMs === stat.mtimeMs) return seen.hash;
    const hash = createHash('sha256')
      .update(await fs.readFile(file).catch(() => Buffer.from('unreadable')))
      .digest('hex');
    this.known.set(file, { size: stat.size, mtimeMs: stat.mtimeMs, hash });
    return hash;
  }
}
