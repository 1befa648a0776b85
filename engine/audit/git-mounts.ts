// What a phase's sandbox needs besides the audited folder to read its repository: the sandbox mounts only
// that folder, so a repository whose git data is elsewhere (a worktree's git folder and its common one, the
// object folders a `clone --shared` borrows) read as no repository, or as a clean one. Those that lie inside
// the tenant's root are mounted read-only at their own paths; nothing outside it is. A folder inside a
// repository above it (a package of a monorepo) has that repository's git data mounted, with the folder itself
// at its own path, so that git reads the package as part of its work tree.
import { constants } from 'node:fs';
import fs from 'node:fs/promises';
import path from 'node:path';

export type GitMounts = {
  /** folders (real paths inside the tenant's root) the phase's git reads, to mount read-only at their paths */
  readOnlyBinds: string[];
  /** the audited folder's path in a repository above it, when it has no .git of its own; else null */
  repositoryAbove: string | null;
  /**
   * That repository, when its git data is mounted too (inside the tenant's root): its root and the audited
   * folder, real paths, both readable at them in the sandbox (the folder is mounted there as well as at the
   * sandbox's workspace), with the ignore and attribute files of the folders between; else null
   */
  repository: { root: string; dir: string } | null;
};

const within = (root: string, p: string) => p === root || p.startsWith(root + path.sep);

/** The most of a small file read: a `.git` file, a `commondir`, an `alternates`. */
const SMALL_MAX_BYTES = 64 * 1024;

/**
 * A small file's text, or null (not a plain file, unreadable, over 64 KB). Opened without following a link and
 * without blocking, and judged on the open file: a check by name, then a read by name, let the tenant swap a FIFO
 * in between, and the read waited for a writer for good, on one of the process's four threads for file work
 * (four such, and no file, lookup or hash of any tenant went on in that worker).
 */
async function small(file: string): Promise<string | null> {
  const handle = await fs.open(file, constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK).catch(() => null);
  if (!handle) return null;
  try {
    const st = await handle.stat();
    if (!st.isFile() || st.size > SMALL_MAX_BYTES) return null;
    const buf = Buffer.alloc(st.size);
    const { bytesRead } = await handle.read(buf, 0, buf.length, 0);
    return buf.subarray(0, bytesRead).toString('utf8');
  } catch {
    return null;
  } finally {
    await handle.close();
  }
}

/**
 * What git reads of the repository whose work tree is `repoRoot` (a real path): its git folder (or the one
 * its .git file names, and the common one), and the object folders it borrows, real paths inside the
 * tenant's root; null when it has none to read there.
 */
async function gitDataOf(repoRoot: string, tenantRoot: string): Promise<string[] | null> {
  const dotGit = path.join(repoRoot, '.git');
  const st = await fs.lstat(dotGit).catch(() => null);
  if (!st) return null;
  const wanted: string[] = [];
  const real = async (p: string) => {
    const r = await fs.realpath(p).catch(() => null);
    return r && within(tenantRoot, r) ? r : null;
  };
  let gitDir: string | null = st.isDirectory() ? dotGit : null;
  if (st.isFile()) {
    const m = /^gitdir: *(.+)$/m.exec((await small(dotGit)) ?? '');
    gitDir = m ? await real(path.resolve(repoRoot, m[1]!.trim())) : null;
    if (gitDir) wanted.push(gitDir);
  }
  if (!gitDir) return null;
  const common = await small(path.join(gitDir, 'commondir'));
  const commonDir = common === null ? gitDir : await real(path.resolve(gitDir, common.trim()));
  if (!commonDir) return null;
  wanted.push(commonDir);
  // the object folders it borrows, and theirs (git follows alternates five deep)
  const seen = new Set<string>();
  const objects = [path.join(commonDir, 'objects')];
  for (let depth = 0; depth < 5 && objects.length; depth++) {
    const from = objects.splice(0);
    for (const o of from) {
      for (const line of ((await small(path.join(o, 'info', 'alternates'))) ?? '').split('\n')) {
        const alt = line.trim();
        if (!alt || alt.startsWith('#')) continue;
        const r = await real(path.resolve(o, alt));
        if (!r || seen.has(r)) continue;
        seen.add(r);
        wanted.push(r);
        objects.push(r);
      }
    }
  }
  return wanted;
}

/** Each path once, a path inside another left out (it is bound with it), the shortest first. */
function outermost(paths: string[]): string[] {
  const sorted = [...new Set(paths)].sort((a, b) => a.length - b.length);
  return sorted.filter((p, i) => !sorted.slice(0, i).some((q) => within(q, p)));
}

/** `dir` and `tenantRoot` are real paths. */
export async function gitMountsOf(dir: string, tenantRoot: string | null): Promise<GitMounts> {
  const none: GitMounts = { readOnlyBinds: [], repositoryAbove: null, repository: null };
  if (!tenantRoot || !within(tenantRoot, dir)) return none;
  if (await fs.lstat(path.join(dir, '.git')).catch(() => null)) {
    const wanted = await gitDataOf(dir, tenantRoot);
    // only what the audited folder does not hold
    return wanted ? { ...none, readOnlyBinds: outermost(wanted.filter((p) => !within(dir, p))) } : none;
  }
  // as engine/runs' repositoryOf finds a workspace's repository: a .git folder above it, up to the tenant's root
  for (let up = dir; up !== tenantRoot;) {
    up = path.dirname(up);
    if (!(await fs.lstat(path.join(up, '.git')).catch(() => null))?.isDirectory()) continue;
    const repositoryAbove = path.relative(up, dir);
    const wanted = await gitDataOf(up, tenantRoot);
    if (!wanted) return { ...none, repositoryAbove };
    // what says which files git ignores or how it compares them, in the folders from the repository's root down
    // to the audited one (whose own are in it): regular files only, never a link
    for (let at = path.dirname(dir); ; at = path.dirname(at)) {
      for (const name of ['.gitignore', '.gitattributes']) {
        const file = path.join(at, name);
        if ((await fs.lstat(file).catch(() => null))?.isFile()) wanted.push(file);
      }
      if (at === up) break;
    }
    return { readOnlyBinds: outermost([...wanted, dir]), repositoryAbove, repository: { root: up, dir } };
  }
  return none;
}
