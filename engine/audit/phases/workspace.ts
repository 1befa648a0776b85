// What a phase sees of the workspace: its files (those git knows, tracked and untracked but not
// ignored; every file under the root outside a repository), read without following a link out of
// the root, and its git state. This runs inside the audit's sandbox, as the phase's own process, and
// writes nothing of the workspace: git reads the repository through a private git folder in the phase's
// /tmp (see privateGitDir), so no config of the workspace's names a program git runs.
import { execFile } from 'node:child_process';
import { constants } from 'node:fs';
import fs from 'node:fs/promises';
import path from 'node:path';
import { tempPrefix, type AuditFinding, type Severity } from '../../platform/index.js';

const GIT = ['--no-optional-locks', '-c', 'safe.directory=*', '-c', 'core.fsmonitor=false', '-c', 'core.hooksPath=/dev/null'];
/** no system or global config either: git runs with what the command line says and the private folder's config */
const GIT_ENV = { PATH: '/usr/local/bin:/usr/bin:/bin', GIT_CONFIG_NOSYSTEM: '1', GIT_CONFIG_GLOBAL: '/dev/null', GIT_OPTIONAL_LOCKS: '0' };
/**
 * The repository's settings the private config keeps: how the work tree's bytes and modes compare with the
 * index (a workspace on a mount without modes says core.filemode=false, or every file reads as changed). Each
 * takes a word, never a path or a command; any other setting of the repository's config is left out.
 */
const KEPT_CORE = new Set(['repositoryformatversion', 'filemode', 'symlinks', 'ignorecase', 'precomposeunicode', 'autocrlf', 'eol', 'checkstat', 'trustctime']);
/** a lazy fetch of missing objects would start `git fetch` from a remote the config no longer names */
const DROPPED_EXTENSIONS = new Set(['partialclone']);
/** folders the crawl outside a repository does not enter: installed packages, and git's data */
const SKIPPED_DIRS = new Set(['node_modules', '.git']);
/** the findings a phase lists; more are counted, not listed (a report stays a few MB at most) */
export const FINDINGS_CAP = 1000;
/** a tree larger than this is audited on its first files (the metric says so) */
export const MAX_FILES = 100_000;

export type GitInfo = {
  commit: string | null;
  /** the branch HEAD names; null when HEAD is detached */
  branch: string | null;
  detached: boolean;
  /** paths with uncommitted changes (staged, unstaged or untracked); null when git could not say (never read as none) */
  changed: string[] | null;
};

export type Workspace = {
  root: string;
  files: string[];
  /** files git tracks; null outside a repository */
  tracked: Set<string> | null;
  git: GitInfo | null;
  /**
   * Why git's state could not be read (its data outside the folder mounted, a command that failed), else null.
   * `git` is then null or partial and `tracked` may be null: the workspace is a repository whose state is unknown,
   * neither a clean one nor "not a repository".
   */
  gitUnknown: string | null;
  truncated: boolean;
  /**
   * What could not be read to be listed or looked at (a folder, ending in `/`, or a file, with why): kept out of
   * `files` (a phase's parsers would fail on them) and never passed over in silence (the security phase says each)
   */
  unreadable: { path: string; why: string }[];
  /**
   * Untracked files under a `node_modules` folder that git does not ignore, left out of `files` and counted (the
   * metrics say how many): installed packages, not the workspace's own (a repository without a .gitignore for them
   * would otherwise fill the file cap before its sources). A tracked file under one (vendored, as a JavaScript
   * GitHub Action commits its dependencies) is the repository's, and is in `files`.
   */
  untrackedNodeModules: number;
};

/** What could not be read, each once, in order: a file in a folder that could not be read is said by its folder. */
function onceEach(unreadable: Workspace['unreadable']): Workspace['unreadable'] {
  const folders = unreadable.filter((u) => u.path.endsWith('/')).map((u) => u.path);
  return unreadable.filter((u) => !folders.some((f) => u.path !== f && u.path.startsWith(f))).sort((a, b) => (a.path < b.path ? -1 : a.path > b.path ? 1 : 0));
}

/** An error that says a path is not there (gone since it was listed): anything else is a path that could not be read. */
const gone = (err: unknown) => ['ENOENT', 'ENOTDIR'].includes((err as { code?: string }).code ?? '');
const why = (err: unknown) => (err as { code?: string }).code ?? (err as Error).message;

/** Every git command of the phases: the private git folder `gitDir`, the workspace its work tree. */
function git(gitDir: string, root: string, args: string[]): Promise<string | null> {
  return gitSaid(gitDir, root, args).then((r) => r.out);
}

/**
 * As git, with what git said when it failed (its stderr's first line), for a report that must not read a failure as none.
 * `cwd`: where git runs, when the folder audited is a part of the work tree `root` (a package of a monorepo).
 */
function gitSaid(gitDir: string, root: string, args: string[], cwd = root): Promise<{ out: string | null; error: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(
      'git',
      [`--git-dir=${gitDir}`, `--work-tree=${root}`, ...GIT, ...args],
      // HOME and XDG_CONFIG_HOME: no ignore file of a user's (core.excludesFile's default) is read either
      { cwd, maxBuffer: 256 * 1024 * 1024, env: { ...GIT_ENV, HOME: gitDir, XDG_CONFIG_HOME: path.join(gitDir, 'xdg') } },
      (err, stdout, stderr) =>
        resolve(
          err
            ? {
                out: null,
                error: `git ${args[0]}: ${String(stderr).trim().split('\n')[0]?.slice(0, 300) || err.message.split('\n')[0]}`,
                stderr: String(stderr),
              }
            : { out: stdout, error: '', stderr: String(stderr) },
        ),
    );
  });
}

/**
 * A git folder of the phase's own (in its /tmp) for git to read the workspace's repository through: its
 * HEAD, ignore and attribute files copied, its index, objects and refs linked, and a config written here
 * holding only the repository's format, extensions and the KEPT_CORE settings. The repository's own config
 * (filter drivers' clean and process commands, core.fsmonitor, an include, core.attributesFile, ...) is
 * read as data by `git config --file`, which runs nothing, and git never reads it. The index is linked,
 * not copied: git writes an index by renaming a new file over it, which would replace the link here, and
 * no command below writes one (no optional locks). Null when the folder holds no `.git`; `unreadable` (why)
 * when it holds one git cannot be read through here (a worktree's or submodule's git folder outside the folder
 * mounted): a repository whose state is unknown, not "not a repository".
 */
async function privateGitDir(root: string): Promise<{ dir: string; close: () => Promise<void> } | { unreadable: string } | null> {
  // .git: the repository's folder, or a file naming it (a worktree, a submodule), as git reads it
  const dotGit = path.join(root, '.git');
  const st = await fs.stat(dotGit).catch(() => null);
  let named = dotGit;
  if (st?.isFile()) {
    const m = /^gitdir: *(.+)$/m.exec((await readSmall(root, '.git')) ?? '');
    if (!m) return { unreadable: 'its .git file names no git folder' };
    named = path.resolve(root, m[1]!.trim());
  } else if (!st?.isDirectory())
    return (await fs.lstat(dotGit).catch(() => null)) ? { unreadable: 'its .git is neither a folder nor a file naming one' } : null;
  const gitDir = await fs.realpath(named).catch(() => null);
  if (!gitDir) return { unreadable: 'its .git file names a git folder outside what the audit can read (a worktree or a submodule)' };
  // a worktree's folder holds its HEAD and index; objects, refs and the config are in the common folder
  const common = await readSmall(gitDir, 'commondir');
  const commonDir = common === null ? gitDir : await fs.realpath(path.resolve(gitDir, common.trim())).catch(() => null);
  const head = await readSmall(gitDir, 'HEAD');
  if (!commonDir) return { unreadable: "its worktree's common git folder is outside what the audit can read" };
  if (head === null) return { unreadable: 'its git folder holds no HEAD git can read' };

  const dir = await fs.mkdtemp(tempPrefix('audit-git'));
  const close = () => fs.rm(dir, { recursive: true, force: true });
  try {
    const config = await readRegular(commonDir, 'config', 4 * 1024 * 1024);
    const kept = { core: [] as string[], extensions: [] as string[] };
    if (Buffer.isBuffer(config)) {
      // the folder holds no HEAD yet: git takes it for no repository, and reads only the file named
      await fs.writeFile(path.join(dir, 'repository-config'), config);
      const out = await git(dir, root, [
        'config',
        '--file',
        path.join(dir, 'repository-config'),
        '--no-includes',
        '-z',
        '--get-regexp',
        '^(core|extensions)\\.',
      ]);
      await fs.rm(path.join(dir, 'repository-config'));
      for (const entry of (out ?? '').split('\0').filter(Boolean)) {
        const nl = entry.indexOf('\n');
        const [key, value] = nl < 0 ? [entry, 'true'] : [entry.slice(0, nl), entry.slice(nl + 1)];
        const m = /^(core|extensions)\.([a-z0-9-]+)$/.exec(key);
        if (!m || !/^[A-Za-z0-9_.-]{1,64}$/.test(value)) continue;
        const [section, name] = [m[1] as keyof typeof kept, m[2]!];
        if (section === 'core' ? KEPT_CORE.has(name) : !DROPPED_EXTENSIONS.has(name)) kept[section].push(`\t${name} = ${value}\n`);
      }
    }
    await fs.writeFile(path.join(dir, 'config'), `[core]\n${kept.core.join('')}[extensions]\n${kept.extensions.join('')}`);
    await fs.writeFile(path.join(dir, 'HEAD'), head);
    await fs.mkdir(path.join(dir, 'info'));
    for (const file of ['info/exclude', 'info/attributes']) {
      const bytes = await readRegular(commonDir, file, 16 * 1024 * 1024);
      if (Buffer.isBuffer(bytes)) await fs.writeFile(path.join(dir, file), bytes);
    }
    // linked: what may be large; each only when it is what git expects (a FIFO would hold git in open(2))
    const links: [string, string, 'file' | 'dir'][] = [
      [gitDir, 'index', 'file'],
      ...(await fs.readdir(gitDir).catch(() => [] as string[]))
        .filter((n) => n.startsWith('sharedindex.'))
        .map((n): [string, string, 'file'] => [gitDir, n, 'file']),
      [commonDir, 'objects', 'dir'],
      [commonDir, 'refs', 'dir'],
      [commonDir, 'reftable', 'dir'],
      [commonDir, 'packed-refs', 'file'],
      [commonDir, 'shallow', 'file'],
    ];
    for (const [from, name, kind] of links) {
      const target = path.join(from, name);
      const t = await fs.stat(target).catch(() => null);
      if (t && (kind === 'file' ? t.isFile() : t.isDirectory())) await fs.symlink(target, path.join(dir, name));
    }
    return { dir, close };
  } catch (err) {
    await close();
    return { unreadable: `its git folder could not be read (${(err as Error).message.split('\n')[0]})` };
  }
}

/** A small file's text (HEAD, .git, commondir), read as readRegular reads; null when it is not one. */
async function readSmall(dir: string, rel: string): Promise<string | null> {
  const bytes = await readRegular(dir, rel, 64 * 1024);
  return Buffer.isBuffer(bytes) ? bytes.toString('utf8') : null;
}

/** A path git listed that names a file of the work tree (git lists none in .git; a stray one is not read). */
const insideTree = (rel: string) => rel !== '' && !path.isAbsolute(rel) && !rel.split('/').some((p) => p === '..' || p === '.git');
const inNodeModules = (rel: string) => rel.split('/').includes('node_modules');

/**
 * The files under the root outside a repository, at most `max + 1` (one more than kept says the tree was
 * larger): the cap is checked at every file, not only on entering a folder, so one folder of 150,000 files
 * stops at it too. Each folder's entries in name order, so the files kept are the same from run to run.
 */
async function crawl(root: string, max: number, unreadable: Workspace['unreadable']): Promise<string[]> {
  const out: string[] = [];
  const walk = async (rel: string) => {
    const entries = await fs.readdir(path.join(root, rel), { withFileTypes: true }).catch((err: unknown) => {
      if (!gone(err)) unreadable.push({ path: `${rel}/`, why: why(err) });
      return [];
    });
    entries.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
    for (const e of entries) {
      if (out.length > max) return;
      const child = rel ? `${rel}/${e.name}` : e.name;
      if (e.isDirectory() && !SKIPPED_DIRS.has(e.name)) await walk(child);
      else if (e.isFile()) out.push(child);
    }
  };
  await walk('');
  return out;
}

/**
 * The paths that are regular files now: git lists a tracked path whatever it has become (deleted, a FIFO,
 * a device), and the parsers a phase hands its files to (dependency-cruiser, TypeScript) read them with
 * blocking calls, so a FIFO in place of a tracked source held the phase until its timeout.
 */
async function regularFiles(root: string, rels: string[], unreadable: Workspace['unreadable']): Promise<string[]> {
  const keep = new Array<boolean>(rels.length);
  const BATCH = 256;
  for (let i = 0; i < rels.length; i += BATCH)
    await Promise.all(
      rels.slice(i, i + BATCH).map(async (rel, k) => {
        const st = await fs.stat(path.join(root, rel)).catch((err: unknown) => {
          // one that cannot be looked at (in a folder the phase may not enter) is said, not dropped as one that is gone
          if (!gone(err)) unreadable.push({ path: rel, why: why(err) });
          return null;
        });
        keep[i + k] = Boolean(st?.isFile());
      }),
    );
  return rels.filter((_, i) => keep[i]);
}

/**
 * `maxFiles`: the cap of files audited (MAX_FILES; a test makes it small). `repositoryAbove`: the service found the
 * folder inside a repository above it (its path in that repository); `repository`: that repository's root and the
 * folder, where both are mounted at their own paths (git-mounts.ts), else its git state is unknown here.
 */
export async function openWorkspace(
  root: string,
  opts: { maxFiles?: number; repositoryAbove?: string | null; repository?: { root: string; dir: string } | null } = {},
): Promise<Workspace> {
  const max = opts.maxFiles ?? MAX_FILES;
  const unreadable: Workspace['unreadable'] = [];
  const above = opts.repositoryAbove ? (opts.repository ?? null) : null;
  const gitDir = await privateGitDir(above ? above.root : root);
  let gitUnknown: string | null =
    opts.repositoryAbove && !gitDir ? `the folder is ${opts.repositoryAbove} of a git repository whose git data is above it, outside the folder audited` : null;
  if (gitDir && 'unreadable' in gitDir) gitUnknown = `the folder is ${above ? `${opts.repositoryAbove} of ` : ''}a git repository, but ${gitDir.unreadable}`;
  else if (gitDir) {
    // a package of a monorepo: git runs in it, its work tree the repository's, and reads the package alone (ls-files
    // answers paths from where it runs; status from the repository's root, which `prefix` takes off)
    const at = (args: string[]) => (above ? gitSaid(gitDir.dir, above.root, args, above.dir) : gitSaid(gitDir.dir, root, args));
    const ofFolder = (args: string[]) => at(above ? [...args, '--', '.'] : args);
    const prefix = above ? `${path.relative(above.root, above.dir).split(path.sep).join('/')}/` : '';
    const [cached, others, head, branch, status] = await Promise.all([
      ofFolder(['ls-files', '-z', '--cached']),
      ofFolder(['ls-files', '-z', '--others', '--exclude-standard']),
      at(['rev-parse', '--verify', '-q', 'HEAD']),
      at(['symbolic-ref', '-q', '--short', 'HEAD']),
      // a submodule's changed commit is seen; its work tree is not: that is a `git status` started in it, which
      // reads the submodule's own config (its filters)
      ofFolder(['status', '--porcelain=v1', '-z', '--untracked-files=normal', '--ignore-submodules=dirty']),
    ]).finally(() => gitDir.close());
    if (cached.out !== null && others.out !== null) {
      const tracked = new Set(cached.out.split('\0').filter(insideTree));
      // a folder git could not enter to list what is untracked in it: git warns, and lists the rest (exit 0)
      for (const m of others.stderr.matchAll(/^warning: could not open directory '(.+)': (.+)$/gm))
        if (m[1]!.startsWith(prefix)) unreadable.push({ path: m[1]!.slice(prefix.length), why: m[2]! });
      const untracked = others.out.split('\0').filter(insideTree);
      const installed = untracked.filter(inNodeModules).length;
      const files = await regularFiles(root, [...new Set([...tracked, ...untracked.filter((rel) => !inNodeModules(rel))])].sort(), unreadable);
      // a status that failed (objects it needs outside the folder: a clone's alternates) is not "no changes"
      const changed =
        status.out === null
          ? null
          : status.out
              .split('\0')
              .filter((l) => /^[ MADRCUT?!]{2} ./.test(l))
              .map((l) => l.slice(3))
              .filter((p) => p.startsWith(prefix))
              .map((p) => p.slice(prefix.length));
      return {
        root,
        files: files.slice(0, max),
        tracked,
        git: { commit: head.out?.trim() || null, branch: branch.out?.trim() || null, detached: Boolean(head.out?.trim()) && !branch.out?.trim(), changed },
        // (a HEAD git cannot read fails the status too: `rev-parse -q` alone fails without a word, as with no commit)
        gitUnknown: status.out === null ? `git could not read the repository's state: ${status.error}` : null,
        truncated: files.length > max,
        unreadable: onceEach(unreadable),
        untrackedNodeModules: installed,
      };
    }
    gitUnknown = `the folder is a git repository, but git could not list its files: ${(cached.out === null ? cached : others).error}`;
  }
  // as in a repository: the first `max` in order kept, truncated only when there were more
  const files = (await crawl(root, max, unreadable)).sort();
  return {
    root,
    files: files.slice(0, max),
    tracked: null,
    git: null,
    gitUnknown,
    truncated: files.length > max,
    unreadable: onceEach(unreadable),
    untrackedNodeModules: 0,
  };
}

const realDirs = new Map<string, Promise<string | null>>();

/**
 * A file's bytes when it is a regular file whose folder resolves inside the root (no link on the way
 * out), at most `maxBytes`; null otherwise. The file itself is opened without following a link, and without
 * waiting (a FIFO or a device is not a regular file: refused once open).
 */
export async function readInside(root: string, rel: string, maxBytes: number): Promise<Buffer | null> {
  const read = await readRegular(root, rel, maxBytes);
  return read === 'too-large' ? null : read;
}

/**
 * As readInside, and says 'too-large' when the file is a regular file inside over `maxBytes` (its size
 * checked on the open file, so a file swapped for a larger one is not read whole either). Null: not a
 * regular file inside now (gone, a FIFO, a device, behind a link out).
 */
export async function readRegular(root: string, rel: string, maxBytes: number): Promise<Buffer | 'too-large' | null> {
  const dir = path.dirname(path.join(root, rel));
  let real = realDirs.get(dir);
  if (!real) realDirs.set(dir, (real = fs.realpath(dir).catch(() => null)));
  const r = await real;
  if (!r || (r !== root && !r.startsWith(root + path.sep))) return null;
  // non-blocking: a FIFO (in place of a tracked file, or at a name a phase reads) opens at once for the stat
  // below to refuse; a blocking open waited for a writer until the phase's timeout
  const handle = await fs.open(path.join(root, rel), constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK).catch(() => null);
  if (!handle) return null;
  try {
    const st = await handle.stat();
    if (!st.isFile()) return null;
    if (st.size > maxBytes) return 'too-large';
    // at most maxBytes even when the file grows while it is read
    const buf = Buffer.alloc(st.size);
    let n = 0;
    while (n < buf.length) {
      const { bytesRead } = await handle.read(buf, n, buf.length - n, n);
      if (!bytesRead) break;
      n += bytesRead;
    }
    return buf.subarray(0, n);
  } catch {
    return null;
  } finally {
    await handle.close();
  }
}

/** A file's text, or null when it is not a text file inside (binary: a NUL in its first 8 KiB). */
export async function readText(root: string, rel: string, maxBytes: number): Promise<string | null> {
  const bytes = await readInside(root, rel, maxBytes);
  if (!bytes || bytes.subarray(0, 8192).includes(0)) return null;
  return bytes.toString('utf8');
}

/** Findings of one phase, at most `cap` listed (the worst kept when there are more); the rest counted. */
export class Findings {
  private readonly list: AuditFinding[] = [];
  private readonly counted = { critical: 0, high: 0, medium: 0, low: 0, info: 0 };
  constructor(private readonly cap: number) {}

  add(rule: string, severity: Severity, file: string | null, line: number | null, message: string): void {
    this.counted[severity]++;
    this.list.push({ rule, severity, file, line, message });
  }

  get counts(): Record<Severity, number> {
    return { ...this.counted };
  }

  /** the findings to report, worst first, and how many were left out */
  result(): { findings: AuditFinding[]; omitted: number } {
    const order = ['critical', 'high', 'medium', 'low', 'info'];
    const sorted = [...this.list].sort(
      (a, b) => order.indexOf(a.severity) - order.indexOf(b.severity) || (a.file ?? '').localeCompare(b.file ?? '') || (a.line ?? 0) - (b.line ?? 0),
    );
    return { findings: sorted.slice(0, this.cap), omitted: Math.max(0, sorted.length - this.cap) };
  }
}

/** What a phase's process prints: its findings, its metrics, and what the service checks outside the sandbox. */
export type PhaseOutput = {
  findings: AuditFinding[];
  findings_omitted: number;
  counts: Record<Severity, number>;
  metrics: Record<string, unknown>;
  /** health: the declared dependencies, for the registry check the service makes (the sandbox has no network) */
  dependencies?: { name: string; range: string; locked: string | null }[];
};
