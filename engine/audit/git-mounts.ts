// What a phase's sandbox needs besides the audited folder to read its repository: the sandbox mounts only
// that folder, so a repository whose git data is elsewhere (a worktree's git folder and its common one, the
// object folders a `clone --shared` borrows) read as no repository, or as a clean one. Those that lie inside
// the tenant's root are mounted read-only at their own paths; nothing outside it is. A folder inside a
// repository above it (a package of a monorepo) is said to be one, its git state unknown to the phase.
import fs from 'node:fs/promises';
import path from 'node:path';

export type GitMounts = {
  /** folders (real paths inside the tenant's root) the phase's git reads, to mount read-only at their paths */
  readOnlyBinds: string[];
  /** the audited folder's path in a repository above it, when it has no .git of its own; else null */
  repositoryAbove: string | null;
};

const within = (root: string, p: string) => p === root || p.startsWith(root + path.sep);

/** A small file's text, or null (not a file, unreadable, over 64 KB). */
async function small(file: string): Promise<string | null> {
  const st = await fs.lstat(file).catch(() => null);
  if (!st?.isFile() || st.size > 64 * 1024) return null;
  return fs.readFile(file, 'utf8').catch(() => null);
}

/** `dir` and `tenantRoot` are real paths. */
export async function gitMountsOf(dir: string, tenantRoot: string | null): Promise<GitMounts> {
  const none: GitMounts = { readOnlyBinds: [], repositoryAbove: null };
  if (!tenantRoot || !within(tenantRoot, dir)) return none;
  const dotGit = path.join(dir, '.git');
  const st = await fs.lstat(dotGit).catch(() => null);
  if (!st) {
    // as engine/runs' repositoryOf finds a workspace's repository: a .git folder above it, up to the tenant's root
    for (let up = dir; up !== tenantRoot;) {
      up = path.dirname(up);
      if ((await fs.lstat(path.join(up, '.git')).catch(() => null))?.isDirectory()) return { ...none, repositoryAbove: path.relative(up, dir) };
    }
    return none;
  }
  const wanted: string[] = [];
  const real = async (p: string) => {
    const r = await fs.realpath(p).catch(() => null);
    return r && within(tenantRoot, r) ? r : null;
  };
  let gitDir: string | null = st.isDirectory() ? dotGit : null;
  if (st.isFile()) {
    const m = /^gitdir: *(.+)$/m.exec((await small(dotGit)) ?? '');
    gitDir = m ? await real(path.resolve(dir, m[1]!.trim())) : null;
    if (gitDir) wanted.push(gitDir);
  }
  if (!gitDir) return none;
  const common = await small(path.join(gitDir, 'commondir'));
  const commonDir = common === null ? gitDir : await real(path.resolve(gitDir, common.trim()));
  if (!commonDir) return none;
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
  // only what the audited folder does not hold, and each once (a folder inside another bound is bound with it)
  const outside = [...new Set(wanted)].filter((p) => !within(dir, p)).sort((a, b) => a.length - b.length);
  const binds = outside.filter((p, i) => !outside.slice(0, i).some((q) => within(q, p)));
  return { readOnlyBinds: binds, repositoryAbove: null };
}
