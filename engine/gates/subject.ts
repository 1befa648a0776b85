// What a gate result is about: the workspace's git commit and tree (dirty or not), and a digest of
// the gate's inputs (its globs, or the files git knows: tracked and untracked but not ignored; every
// file outside a repository). git runs in the sandbox, as for any command of the workspace: a
// repository's own config can name programs to run. Files are hashed by the service without
// following links (a link is hashed as its target's name), a chunk at a time and a few files at once
// (never held whole), and a file's hash is kept while its size, mtime, change time and inode stay the
// same, so a digest after a few changes reads only what changed.
import { createHash } from 'node:crypto';
import fs from 'node:fs/promises';
import path from 'node:path';
import { glob } from 'tinyglobby';
import { limited } from '../platform/index.js';
import { runProcess, type Sandbox } from '../tools/index.js';
import { entryOf, hashInside, staysInside, type FolderPaths } from './paths.js';

export type GitState = {
  commit: string | null;
  tree: string | null;
  dirty: boolean | null;
  files: string[] | null;
  /** the files of HEAD's tree (what the commit tracks), read from the commit, not the index; null with no HEAD */
  committed: string[] | null;
};

const GIT = ['git', '--no-optional-locks', '-c', 'safe.directory=*', '-c', 'core.fsmonitor=false', '-c', 'core.hooksPath=/dev/null'];
const ALWAYS_IGNORED = ['.git/**', '**/node_modules/**'];
/** A file larger than this is hashed by its size (its change of size still makes a result stale). */
const HASH_MAX_BYTES = 64 * 1024 * 1024;
/** Files a digest reads at once (each through a chunk of its own, never whole). */
const HASH_CONCURRENCY = 8;

/**
 * The repository at the workspace's root, seen from the sandbox; all null outside a repository. With
 * `tracked`, only changes to tracked files make it dirty, and its files are not listed (after a gate: what it
 * wrote of its own, a report or a build, is not a change of what it tested).
 */
export async function gitState(sandbox: Sandbox, workspace: string, readOnlyBinds: string[] = [], opts: { tracked?: boolean } = {}): Promise<GitState> {
  const none = { commit: null, tree: null, dirty: null, files: null, committed: null };
  if (!(await fs.lstat(path.join(workspace, '.git')).catch(() => null))) return none;
  const q = (args: string[]) => args.map((a) => `'${a}'`).join(' ');
  const script = [
    `${q(GIT)} rev-parse --verify -q HEAD || echo`,
    `${q(GIT)} rev-parse --verify -q 'HEAD^{tree}' || echo`,
    // the parts end with a NUL, which neither part holds (status quotes an odd name): a file's name may hold
    // any other byte (`a@@` and a newline split the listing when a line was the mark, dropping the files after it)
    "printf '\\0'",
    // a status that fails says the tree has changes: its silence read as a clean tree. A file the index marks
    // assume-unchanged (a lower-case tag) or skip-worktree (S) is one status does not look at: a gate that edited
    // a tracked file (the gate file, a script later gates run) and marked it so left the tree reading clean
    `{ ${q(GIT)} status --porcelain=v1 --untracked-files=${opts.tracked ? 'no' : 'normal'} || echo '?? (git status failed)'; ` +
      `${q(GIT)} ls-files -v | grep -q '^[a-zS] ' && echo '?? (files marked assume-unchanged or skip-worktree)'; } | head -c 4096`,
    "printf '\\0'",
    // each name ends with a NUL and one more closes the list: no name is empty, so two NULs are its end
    `${q(GIT)} ls-tree -r -z --name-only --full-tree HEAD 2>/dev/null`,
    "printf '\\0'",
    opts.tracked ? 'true' : `${q(GIT)} ls-files -z --cached --others --exclude-standard`,
  ].join('; ');
  const r = await runProcess(sandbox, ['/bin/sh', '-c', script], {
    workspace,
    env: { PATH: '/usr/bin:/bin', HOME: '/tmp' },
    network: false,
    readOnlyBinds,
    maxBytes: 32 * 1024 * 1024,
    timeoutMs: 30_000,
  });
  const out = r.stdout;
  const headEnd = out.indexOf('\0');
  const statusEnd = headEnd < 0 ? -1 : out.indexOf('\0', headEnd + 1);
  // the commit's list is empty (a lone NUL) or its names, each with its NUL, and the closing one
  const committedEnd = statusEnd < 0 ? -1 : out[statusEnd + 1] === '\0' ? statusEnd + 1 : out.indexOf('\0\0', statusEnd + 1) + 1;
  if (r.exit_code !== 0 || r.truncated || committedEnd <= 0) return none;
  const [head, status] = [out.slice(0, headEnd), out.slice(headEnd + 1, statusEnd)];
  const names = (from: number, to?: number) => out.slice(from, to).split('\0').filter(Boolean);
  const [commit, tree] = head.trim().split('\n');
  return {
    commit: commit || null,
    tree: tree || null,
    dirty: status.trim().length > 0,
    files: opts.tracked ? null : names(committedEnd + 1),
    committed: commit ? names(statusEnd + 1, committedEnd) : null,
  };
}

/**
 * The digest of the commit's files as they are in the folder, read by the service (null outside a repository).
 * git's own word that the tree is clean comes from the index, the repository's config and its attributes, all
 * of which a gate can write: an index whose entries carry an edited file's times, or a clean filter that gives
 * git the commit's bytes, kept an edit out of `git status`. A gate run takes this digest when it starts, and a
 * tree whose digest is another when a gate ends is not the commit, whatever git says.
 */
export function committedDigest(hasher: FileHasher, workspace: string, git: GitState): Promise<string> | null {
  return git.committed ? hasher.digest(workspace, git.committed.filter(staysInside)) : null;
}

/** The files of a gate's inputs, relative to the workspace, sorted. */
export async function inputFiles(workspace: string, globs: string[] | null, git: GitState): Promise<string[]> {
  const files = globs
    ? await glob(globs, { cwd: workspace, dot: true, ignore: ALWAYS_IGNORED, onlyFiles: true, followSymbolicLinks: false, expandDirectories: false })
    : (git.files ?? (await glob(['**'], { cwd: workspace, dot: true, ignore: ALWAYS_IGNORED, onlyFiles: true, followSymbolicLinks: false })));
  // only paths that stay inside (a glob of the set cannot name `..`; git and the crawl do not either)
  return [...new Set(files)].filter(staysInside).sort();
}

/** The files a digest takes at once (see FileHasher.digest). */
const DIGEST_SLICE = 1000;

/** Digests after which a file none of them named is forgotten (gates of one workspace name different files). */
const HASHES_KEPT_DIGESTS = 16;

/**
 * Hashes files by content, keeping each hash while the file's size and mtime stay the same. A file gone, or
 * named by none of the last HASHES_KEPT_DIGESTS digests, is forgotten: a build's new names each time (hashed
 * bundles, coverage) would otherwise keep an entry each for the life of the process.
 */
export class FileHasher {
  private readonly known = new Map<string, { size: number; mtimeMs: number; ctimeMs: number; ino: number; hash: string; digest: number }>();
  private digests = 0;

  /**
   * `sha256:<hex>` over every file's path and hash; a missing file counts as missing. Files are taken
   * DIGEST_SLICE at a time: all at once, 100,000 of them were as many promises and stats started in one turn of
   * the event loop (a web process's other requests waited 2.6 s behind a tenant's snapshot, its memory 600 MB up).
   */
  async digest(workspace: string, files: string[]): Promise<string> {
    const reads = limited(HASH_CONCURRENCY);
    const now = ++this.digests;
    const folders: FolderPaths = new Map();
    const sum = createHash('sha256');
    for (let at = 0; at < files.length; at += DIGEST_SLICE) {
      const lines = await Promise.all(files.slice(at, at + DIGEST_SLICE).map(async (f) => `${f}\0${await this.hashOf(workspace, f, reads, now, folders)}\n`));
      sum.update(lines.join(''));
    }
    for (const [key, seen] of this.known) if (seen.digest <= now - HASHES_KEPT_DIGESTS) this.known.delete(key);
    return `sha256:${sum.digest('hex')}`;
  }

  /** How many files' hashes are kept (for tests). */
  get size(): number {
    return this.known.size;
  }

  private async hashOf(workspace: string, rel: string, reads: ReturnType<typeof limited>, now: number, folders: FolderPaths): Promise<string> {
    const key = path.join(workspace, rel);
    const entry = await entryOf(workspace, rel, folders);
    if (!entry || entry.kind !== 'file') this.known.delete(key);
    if (!entry) return 'missing';
    if (entry.kind === 'link') return `link:${entry.target}`;
    if (entry.kind === 'other') return 'other';
    const seen = this.known.get(key);
    // the change time and inode too: mtime can be set back by anyone who writes the file (touch -r), they cannot
    if (seen && seen.size === entry.size && seen.mtimeMs === entry.mtimeMs && seen.ctimeMs === entry.ctimeMs && seen.ino === entry.ino) {
      seen.digest = now;
      return seen.hash;
    }
    // read a chunk at a time and a few files at once: a workspace of large (sparse) files is never held in memory
    const hashed = await reads(() => hashInside(workspace, rel, HASH_MAX_BYTES));
    // a file too large to read whole is known by its size, change time and inode: a rewrite of the same size
    // is a change (it sets the change time, which no one can set back)
    const hash = hashed ?? `large:${entry.size}:${entry.ctimeMs}:${entry.ino}`;
    this.known.set(key, { size: entry.size, mtimeMs: entry.mtimeMs, ctimeMs: entry.ctimeMs, ino: entry.ino, hash, digest: now });
    return hash;
  }
}
