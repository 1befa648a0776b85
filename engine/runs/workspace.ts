// Workspaces: where a run's tools act. Each tenant has its own root (SERVICE_WORKSPACE_ROOT/<tenant>,
// made on first use; the root itself for the single local tenant of SERVICE_AUTH=none), and a run's
// workspace is resolved inside its tenant's root. A vibe run works on a scratch copy in its tenant's
// scratch area: a clone at HEAD when the workspace is in a repository, else a copy made into a fresh
// repository, so the diff of what the run changed comes from git (run in the sandbox).
import { isUtf8 } from 'node:buffer';
import { existsSync } from 'node:fs';
import fs from 'node:fs/promises';
import path from 'node:path';
import { binaryPatch, gitBlobName, isTerminal, LOCAL_TENANT, ValidationError, type RunStatus } from '../platform/index.js';
import { resolveInside, runProcess, type Sandbox } from '../tools/index.js';

/** Options that keep git from running anything a repository's config names (beside the sandbox it runs in). */
const GIT_SAFE = "-c core.hooksPath=/dev/null -c core.fsmonitor=false -c safe.directory='*' --no-optional-locks";
const GIT_ID = '-c user.name=automation-service -c user.email=automation-service@localhost -c commit.gpgsign=false';
const GIT_TIMEOUT_MS = 120_000;
const DIFF_MAX_BYTES = 1024 * 1024;
/** The most paths a vibe run's result lists as changed, and the most bytes of them (the diff names them all, up to its limit). */
const CHANGED_FILES_MAX = 1000;
const CHANGED_FILES_MAX_BYTES = 256 * 1024;
/** The blobs one sandboxed script reads (see makeScratch's diff). */
const BLOBS_AT_ONCE = 200;
/**
 * A vibe run's diff as `git apply` takes it: a binary file as git's binary patch (its bytes whole), every `index` line
 * with its blobs' full names (a binary patch is checked against them), paths quoted in ASCII whatever the copy's config
 * says, and never a program of the copy's (an external diff, a textconv)
 */
const GIT_DIFF = '-c core.quotePath=true diff --binary --full-index --no-color --no-ext-diff --no-textconv';

/** Where scratch copies go, per tenant: beside the tenants' folders, never in a shared temp folder. */
export const SCRATCH_DIR = '.scratch';
/** Where a run's checkout goes: a folder of its own in its tenant's root (`.checkouts/<run>`; gates can run there), removed when the attempt ends. */
export const CHECKOUTS_DIR = '.checkouts';

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

/** What a run's own leftovers are named by: a run id (newId's form) and nothing else. */
const RUN_ID = /^run_[0-9a-z]{26}$/;
const SCRATCH_OF_RUN = /^vibe-(run_[0-9a-z]{26})-/;

/** A folder that is one and not a link (lstat): a tenant's link in the service's place leads nowhere. */
const realDirs = async (dir: string): Promise<string[]> => {
  const st = await fs.lstat(dir).catch(() => null);
  if (!st?.isDirectory()) return [];
  return (await fs.readdir(dir, { withFileTypes: true })).filter((e) => e.isDirectory()).map((e) => e.name);
};

/**
 * Removes what attempts whose process died left (their end's cleanup never ran): a scratch copy of a run not
 * running (each attempt's is its own, `vibe-<run>-*`), and the checkout of a run that ended or is gone
 * (`.checkouts/<run>`, which a later attempt of a queued run makes again). `statusOf` is the run's status, or
 * null when there is none. Only folders named by a run id, never through a link, each removed by `remove(dir,
 * parent, name)` (removeInSandbox: a tenant's root, and the local tenant's scratch area, are folders its steps
 * write). How many went.
 */
export async function sweepLeftovers(
  roots: Roots,
  statusOf: (tenantId: string, runId: string) => Promise<RunStatus | null>,
  remove: (dir: string, parent: string, name: string) => Promise<unknown>,
): Promise<number> {
  let removed = 0;
  const scratch = path.join(roots.workspaceRoot, SCRATCH_DIR);
  for (const tenant of await realDirs(scratch))
    for (const name of await realDirs(path.join(scratch, tenant))) {
      const runId = SCRATCH_OF_RUN.exec(name)?.[1];
      if (runId && (await statusOf(tenant, runId)) !== 'running') {
        await remove(path.join(scratch, tenant), '.', name);
        removed++;
      }
    }
  const tenants = roots.singleTenant ? [LOCAL_TENANT] : (await realDirs(roots.workspaceRoot)).filter((t) => !t.startsWith('.'));
  for (const tenant of tenants) {
    const root = tenantRootPath(roots, tenant);
    for (const runId of (await realDirs(path.join(root, CHECKOUTS_DIR))).filter((n) => RUN_ID.test(n))) {
      const status = await statusOf(tenant, runId);
      if (status === null || isTerminal(status)) {
        await remove(root, CHECKOUTS_DIR, runId);
        removed++;
      }
    }
  }
  return removed;
}

/**
 * Removes `name` from the folder `parent` of `dir` (`.`: from `dir` itself) in the sandbox, `dir` bound as its
 * workspace. Removed by path as the service's own user, a folder a step swapped for a link mid-removal led it
 * outside (another tenant's, or /): a checkout in its tenant's root, and a scratch copy in the local tenant's
 * scratch area (inside its root, where another run's step writes; 50 files of a host folder went so). A `parent`
 * that is a link is left alone; what a step made read-only is made writable first. Exit code 0 when done.
 */
export async function removeInSandbox(sandbox: Sandbox, dir: string, parent: string, name: string, pathEnv?: string): Promise<number | null> {
  const inside = sandbox.workspacePath(dir);
  const r = await runProcess(
    sandbox,
    [
      '/bin/sh',
      '-c',
      'if [ -L "$1" ]; then exit 0; fi; if [ -e "$1/$2" ]; then chmod -R u+rwX "$1/$2"; fi; rm -rf "$1/$2"',
      'remove-in-sandbox',
      parent === '.' ? inside : `${inside}/${parent}`,
      name,
    ],
    { workspace: dir, env: { PATH: pathEnv ?? '/usr/bin:/bin' }, network: false, maxBytes: 64 * 1024 },
  );
  return r.exit_code;
}

/** Removes a run's checkout (`.checkouts/<run>` in its tenant's root) in the sandbox (removeInSandbox). */
export const removeCheckout = (sandbox: Sandbox, root: string, runId: string, pathEnv: string | undefined) =>
  removeInSandbox(sandbox, root, CHECKOUTS_DIR, runId, pathEnv);

/** A tenant's scratch area (vibe runs' copies), made on first use. */
export async function scratchRoot(roots: Roots, tenantId: string): Promise<string> {
  const dir = path.join(roots.workspaceRoot, SCRATCH_DIR, tenantId);
  await fs.mkdir(dir, { recursive: true });
  return dir;
}

/**
 * The folder a request names inside a root, resolved (links followed) and checked to be inside it; `at`
 * is where the request named it (a query parameter for the routes that read).
 */
export async function resolveWorkspace(root: string, requested: string | undefined, at = '/body/workspace'): Promise<string> {
  // the root itself (most requests name no workspace): its real path was taken when tenantRoot made it
  const real = requested === undefined || requested === '.' ? made.get(root) : undefined;
  if (real) return real;
  try {
    const dir = await resolveInside(root, requested ?? '.');
    if (!(await fs.stat(dir)).isDirectory()) throw new Error('not a folder');
    return dir;
  } catch {
    // one answer whatever the cause: the file system's own (ENOTDIR, ENOENT, with the real path) would tell
    // a tenant what exists outside its root, and where the root is
    throw new ValidationError(`workspace ${requested ?? '.'} is not a folder inside the workspace root`, [
      { path: at, message: 'must name a folder inside your workspace root' },
    ]);
  }
}

/**
 * git as a step runs it: in the sandbox, with the network off. A repository is the tenant's own, and its
 * config can name programs (hooks, an fsmonitor, filters, diff drivers): run by the service itself they
 * would run outside the sandbox, as the service's user. `cwd` is the folder bound read-write at
 * /workspace; `readOnly` are more folders seen at their own paths (a repository cloned from).
 */
async function sandboxedGit(sandbox: Sandbox, cwd: string, script: string, readOnly: string[] = [], signal?: AbortSignal): Promise<string> {
  const r = await runProcess(sandbox, ['/bin/sh', '-c', `set -e; ${script}`], {
    signal,
    workspace: cwd,
    env: { PATH: '/usr/bin:/bin', HOME: '/tmp', LANG: 'C.UTF-8', GIT_CONFIG_NOSYSTEM: '1', GIT_CONFIG_GLOBAL: '/dev/null' },
    network: false,
    readOnlyBinds: readOnly,
    maxBytes: 64 * 1024 * 1024,
    timeoutMs: GIT_TIMEOUT_MS,
  });
  // a command that finished as the signal came has done its work: stopped is what the signal cut short
  if (r.aborted && r.exit_code !== 0) throw new Error('stopped: the run is over (its budget, a cancel or a shutdown)');
  if (r.exit_code !== 0) throw new Error(`git failed (${r.exit_code ?? r.signal}): ${r.stderr.trim().slice(-500)}`);
  return r.stdout;
}

/**
 * The repository a workspace is in, found without running git: the nearest folder from the workspace up
 * to its tenant's root (never above) with a `.git` folder of its own. A `.git` file or link (a pointer to
 * a git directory elsewhere, perhaps another tenant's) is not followed: such a workspace is copied.
 */
async function repositoryOf(workspace: string, root: string): Promise<string | null> {
  for (let dir = workspace; ; dir = path.dirname(dir)) {
    const st = await fs.lstat(path.join(dir, '.git')).catch(() => null);
    if (st?.isDirectory()) return dir;
    // a submodule or a worktree: its files are not in the repository above (a clone of that has its folder empty)
    if (st) return null;
    if (dir === root || !dir.startsWith(root + path.sep)) return null;
  }
}

export type Scratch = {
  dir: string;
  kind: 'worktree' | 'copy';
  /** folders outside `dir` that git needs inside a sandbox, read-only: the objects of the repository cloned from */
  readOnlyBinds: string[];
  /** unified diff of everything changed since the scratch was made, and the changed paths; stopped by `signal` */
  diff(signal?: AbortSignal): Promise<{ diff: string; changed_files: string[]; files_truncated: boolean; truncated: boolean }>;
  remove(): Promise<void>;
};

const q = (s: string) => `'${s.replace(/'/g, `'\\''`)}'`;

/**
 * A vibe run's scratch copy of a workspace, in the tenant's scratch area: a clone of its repository at
 * HEAD (sharing the repository's objects, read-only) when the workspace is in one, else a copy of the
 * folder made into a fresh repository. Every git command runs in the sandbox, on the scratch copy only.
 * `root` is the real path of the tenant's root; `workspace` a real path inside it. `signal` (the run's
 * budget, a cancel) stops the clone or copy.
 */
export async function makeScratch(
  sandbox: Sandbox,
  opts: { root: string; workspace: string; area: string; runId: string; signal?: AbortSignal },
): Promise<Scratch> {
  const { root, workspace, area, signal } = opts;
  // named by its run: one a dead process left is found and removed (sweepLeftovers)
  const base = await fs.mkdtemp(path.join(area, `vibe-${opts.runId}-`));
  // in the sandbox, the area bound: the local tenant's is in its root, where another run's step may swap a folder
  // of this copy for a link while it is removed; one it cannot remove now is swept later
  const removed = () => removeInSandbox(sandbox, area, '.', path.basename(base)).catch(() => null);
  const repo = await repositoryOf(workspace, root);
  let top = '';
  let dir = '';
  let kind: Scratch['kind'] = 'copy';
  let readOnlyBinds: string[] = [];
  /** the commit the scratch was made at: the diff is against it, whatever the run commits, resets or checks out since */
  let baseCommit = '';
  try {
    if (repo) {
      // a clone's config and hooks are its own (none): nothing of the repository's config runs
      readOnlyBinds = [path.join(repo, '.git')];
      baseCommit = (
        await sandboxedGit(
          sandbox,
          base,
          `git ${GIT_SAFE} clone --quiet --shared --no-hardlinks ${q(repo)} worktree && { git -C worktree rev-parse -q --verify HEAD || true; }`,
          readOnlyBinds,
          signal,
        )
      ).trim();
      readOnlyBinds = [path.join(repo, '.git', 'objects')];
      top = path.join(base, 'worktree');
      dir = path.join(top, path.relative(repo, workspace));
      // a repository with no commit yet, or a workspace folder its HEAD does not hold (untracked, ignored, empty):
      // the clone has none of the workspace's files, which are copied instead
      if (baseCommit && existsSync(dir)) kind = 'worktree';
      else {
        await removeInSandbox(sandbox, base, '.', 'worktree');
        readOnlyBinds = [];
      }
    }
    if (kind === 'copy') {
      top = dir = path.join(base, 'copy');
      await fs.mkdir(dir);
      // other runs' scratch copies and checkouts live in a tenant's root (the workspace root itself, for the local
      // tenant): a copy of the root leaves them out
      const theirs = workspace === root ? `--exclude=./${SCRATCH_DIR} --exclude=./${CHECKOUTS_DIR}` : '';
      // copied in the sandbox too (the workspace bound read-only by its handle, links copied as links): a
      // copy made by the service, as its own user, followed a folder a step swapped for a link meanwhile. Every
      // file copied is committed, ignored ones too, so a change to one is in the diff (which adds what is tracked
      // whatever .gitignore says); a new file that .gitignore names (a build's output) is not
      baseCommit = (
        await sandboxedGit(
          sandbox,
          dir,
          [
            `tar -C ${q(workspace)} --exclude=node_modules --exclude=.git ${theirs} -cf /tmp/scratch.tar .`,
            'tar -xf /tmp/scratch.tar',
            'rm /tmp/scratch.tar',
            `git ${GIT_SAFE} init -q && git ${GIT_SAFE} add -A --force && git ${GIT_SAFE} ${GIT_ID} commit -q --allow-empty -m 'scratch copy'`,
            `git ${GIT_SAFE} rev-parse HEAD`,
          ].join(' && '),
          [workspace],
          signal,
        )
      ).trim();
    }
  } catch (err) {
    await removed();
    throw err;
  }
  const rel = path.relative(top, dir) || '.';
  return {
    dir,
    kind,
    readOnlyBinds,
    async diff(diffSignal) {
      // what the run changed, seen by git in the sandbox: the run may have given the copy's config programs to run.
      // The patch comes back in base64: its bytes are whatever the files hold, and are read as such (readDiff)
      const out = await sandboxedGit(
        sandbox,
        top,
        [
          `cd ${q(rel)}`,
          `git ${GIT_SAFE} add -A .`,
          // a byte past the names kept: 100,000 made files of 200-character names were 21 MB in one run record and event
          `git ${GIT_SAFE} diff --cached --name-only -z --relative ${baseCommit} | head -c ${CHANGED_FILES_MAX_BYTES + 1}`,
          `printf '\\0@@\\0'`,
          `git ${GIT_SAFE} ${GIT_DIFF} --cached --relative ${baseCommit} | head -c ${DIFF_MAX_BYTES + 1} | base64`,
        ].join(' && '),
        readOnlyBinds,
        diffSignal,
      );
      const at = out.indexOf('\0@@\0');
      const listed = out.slice(0, at);
      // a list cut by its bytes ends in part of a name, which is left out
      const cutByBytes = Buffer.byteLength(listed) > CHANGED_FILES_MAX_BYTES;
      const all = listed
        .split('\0')
        .slice(0, cutByBytes ? -1 : undefined)
        .filter(Boolean);
      const names = all.slice(0, CHANGED_FILES_MAX);
      // BLOBS_AT_ONCE a script (one argument of sh, which Linux holds to 128 KB: a few hundred names were E2BIG), and
      // no more once what was read passes the diff's limit (the blobs not read cut the diff at their file)
      const blobs = async (shas: string[]) => {
        const read: Buffer[] = [];
        for (let i = 0, bytes = 0; i < shas.length && bytes <= DIFF_MAX_BYTES; i += BLOBS_AT_ONCE) {
          const text = await sandboxedGit(
            sandbox,
            top,
            // each at most a byte over the diff's limit (one over it cuts the diff there), in base64, ended by a dot
            shas
              .slice(i, i + BLOBS_AT_ONCE)
              .map((sha) => `{ git ${GIT_SAFE} cat-file blob ${sha} | head -c ${DIFF_MAX_BYTES + 1} | base64; printf .; }`)
              .join(' && '),
            readOnlyBinds,
            diffSignal,
          );
          for (const b of text.split('.').slice(0, -1)) {
            read.push(Buffer.from(b, 'base64'));
            bytes += read.at(-1)!.length;
          }
        }
        return read;
      };
      return {
        ...(await readDiff(Buffer.from(out.slice(at + 4), 'base64'), blobs)),
        changed_files: names,
        files_truncated: cutByBytes || all.length > names.length,
      };
    },
    async remove() {
      await removed();
    },
  };
}

/** `bytes` without a character its end cuts in two (at most 3 bytes of it), or null when they are not UTF-8 all the same. */
function wholeUtf8(bytes: Buffer): Buffer | null {
  for (let k = 0; k < 4 && k <= bytes.length; k++) if (isUtf8(bytes.subarray(0, bytes.length - k))) return bytes.subarray(0, bytes.length - k);
  return null;
}

/** An `index` line's blob names (full with --full-index), the old and the new: all zeros for a file made or deleted. */
const INDEX_LINE = /^index ([0-9a-f]{40,64})\.\.([0-9a-f]{40,64})(?: [0-7]+)?\n/m;
const NO_BLOB = /^0+$/;

/**
 * A vibe run's diff as text that holds every byte, from git's bytes (cut a byte past the limit): a file that git diffed
 * as text but that is not UTF-8 (Latin-1, say) becomes git's binary patch of it, as git gives a binary file, rather than
 * text with its bytes replaced (U+FFFD), which no pull request or `git apply` could make the file from again. `blobs`
 * reads blobs by name. Cut at the limit, at a whole character, and then said to be.
 */
async function readDiff(bytes: Buffer, blobs: (names: string[]) => Promise<Buffer[]>): Promise<{ diff: string; truncated: boolean }> {
  let truncated = bytes.length > DIFF_MAX_BYTES;
  // each file's part: from its `diff --git` line to the next file's (a line of a hunk starts with ' ', '+', '-' or '\')
  const starts = [0];
  for (let i = bytes.indexOf('\ndiff --git '); i >= 0; i = bytes.indexOf('\ndiff --git ', i + 1)) starts.push(i + 1);
  const parts = starts.map((start, k) => bytes.subarray(start, starts[k + 1] ?? bytes.length));
  // the last part, when the diff was cut, may end in the middle of a character: that alone does not make it binary
  const last = parts.length - 1;
  const text = parts.map((part, k) => (k === last && truncated ? wholeUtf8(part) : isUtf8(part) ? part : null));
  // the parts that are not UTF-8: their headers are (paths are quoted in ASCII), and name the blobs before and after
  const binary = new Map<number, { header: Buffer; old: string; new: string }>();
  for (const [k, part] of parts.entries()) {
    if (text[k]) continue;
    const m = INDEX_LINE.exec(part.toString('latin1'));
    if (m) binary.set(k, { header: part.subarray(0, m.index + m[0].length), old: m[1]!, new: m[2]! });
  }
  const names = [...new Set([...binary.values()].flatMap((b) => [b.old, b.new]).filter((n) => !NO_BLOB.test(n)))];
  const read = names.length ? await blobs(names) : [];
  // a blob is the one named only if its bytes hash to its name: one cut at the limit, or not read, is not
  const blob = new Map(names.map((n, i) => [n, read[i] && gitBlobName(read[i], n.length) === n ? read[i] : undefined]));
  const out: Buffer[] = [];
  // no part is made once the diff is past its limit: a binary patch of a large file costs the event loop its deflate
  for (let k = 0, size = 0; k < parts.length && size <= DIFF_MAX_BYTES; k++) {
    const b = binary.get(k);
    const before = b && (NO_BLOB.test(b.old) ? Buffer.alloc(0) : blob.get(b.old));
    const after = b && (NO_BLOB.test(b.new) ? Buffer.alloc(0) : blob.get(b.new));
    // a part that cannot be carried whole (a blob over the limit or not read, no index line) ends the diff, which says it was cut
    if (!text[k] && (!before || !after)) {
      truncated = true;
      break;
    }
    out.push(text[k] ?? Buffer.concat([b!.header, Buffer.from(binaryPatch(before!, after!))]));
    size += out.at(-1)!.length;
  }
  const all = Buffer.concat(out);
  if (all.length <= DIFF_MAX_BYTES) return { diff: all.toString('utf8'), truncated };
  return { diff: wholeUtf8(all.subarray(0, DIFF_MAX_BYTES))!.toString('utf8'), truncated: true };
}
