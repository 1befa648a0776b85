// Files of a tenant's folders that the service opens itself, outside the sandbox and as its own user
// (the file tools, the gates' reports, artifacts and inputs). A path is never checked and then opened
// again by name: between the two, a step of the tenant's can put a link in place of a folder on the
// path (swapping them in a loop) and the open would follow it to another tenant's folder or the
// host's. What was opened is checked instead: its real path, read from /proc/self/fd, must be inside
// the root. Folders made for a write are made one at a time from an open, checked folder.
import { constants } from 'node:fs';
import fs, { type FileHandle } from 'node:fs/promises';
import type { Stats } from 'node:fs';
import path from 'node:path';

/** What was named, or what its path led to, is not inside the root (a step that meets it fails with the code). */
export class OutsideError extends Error {
  readonly code = 'path-outside-workspace';
}

const { O_RDONLY, O_WRONLY, O_CREAT, O_NOFOLLOW, O_NONBLOCK, O_DIRECTORY } = constants;

const within = (root: string, p: string) => p === root || p.startsWith(root + path.sep);

/** The path of what an open handle is: its real path at this moment. */
const fdPath = (h: FileHandle) => `/proc/self/fd/${h.fd}`;

/** Throws (after closing it) when what `h` opened is not inside `root`. */
async function keepInside(h: FileHandle, root: string, rel: string): Promise<FileHandle> {
  const real = await fs.readlink(fdPath(h)).catch(() => '');
  if (within(root, real)) return h;
  await h.close();
  throw new OutsideError(`${rel} is not inside the workspace`);
}

/** Links followed at most, as the kernel does (its limit is 40). */
const MAX_HOPS = 40;

/**
 * Where `p` (absolute) leads, whether or not all of it exists: its parts walked once, as the kernel walks them,
 * each link followed (at most MAX_HOPS, the kernel's bound) by putting its target's parts in front of those
 * left, and what is missing appended as it is named. `..` after a link is the parent of where the link leads.
 * `passing` hears each place that exists on the way, links included (where a path goes, not only where it ends).
 */
export async function whereLeads(p: string, passing?: (at: string) => void): Promise<string> {
  const left = p.split(path.sep).filter(Boolean).reverse();
  let at = path.parse(p).root || path.sep;
  let hops = MAX_HOPS;
  let missing = false;
  while (left.length) {
    const part = left.pop()!;
    if (part === '.') continue;
    if (part === '..') {
      at = path.dirname(at);
      continue;
    }
    const next = path.join(at, part);
    if (missing) {
      at = next;
      continue;
    }
    const st = await fs.lstat(next).catch(() => null);
    if (!st) {
      missing = true;
      at = next;
      continue;
    }
    passing?.(next);
    const target = st.isSymbolicLink() && hops-- > 0 ? await fs.readlink(next).catch(() => null) : null;
    if (target === null) {
      at = next;
      continue;
    }
    if (path.isAbsolute(target)) at = path.parse(target).root;
    left.push(...target.split('/').filter(Boolean).reverse());
  }
  return at;
}

/**
 * A failed open's error, unless the path leads outside the root: then the OutsideError an open that
 * succeeded would have met. Whether something outside exists (another tenant's file, a host's folder)
 * never shows in the answer. `follow: false`: a link as the last part is not followed.
 */
async function failedOpen(err: unknown, root: string, full: string, rel: string, follow = true): Promise<never> {
  if (err instanceof OutsideError) throw err;
  const leads = follow ? await whereLeads(full) : path.join(await whereLeads(path.dirname(full)), path.basename(full));
  if (!within(root, leads)) throw new OutsideError(`${rel} is not inside the workspace`);
  throw err;
}

/** Linux's O_PATH (Node names it not): a handle to where a path leads, opening nothing there (no device's or FIFO's open runs). */
const O_PATH = 0o10000000;

/** The error the kernel gives an open with O_NOFOLLOW whose last part is a link. */
const linkRefused = (rel: string) => Object.assign(new Error(`ELOOP: too many symbolic links encountered, open '${rel}'`), { code: 'ELOOP', errno: -40 });

/**
 * Opens `rel` under `root` (a real path) to read, or as a folder; never blocks. Where the path leads is found
 * first with a handle that opens nothing (O_PATH) and checked; only a plain file or a folder inside the root is
 * then opened, through that handle: a link to a device or a FIFO outside (another tenant's, the host's) was
 * opened before it was refused, and a writer waiting on that FIFO went on. Anything else is answered with the
 * O_PATH handle, for the caller's stat to refuse (it reads nothing). `follow: false` refuses a link as the last
 * part (ELOOP). Throws OutsideError, or the file system's error (ENOENT, ...) for a path that leads inside the root.
 */
export async function openInside(root: string, rel: string, opts: { follow?: boolean; folder?: boolean } = {}): Promise<FileHandle> {
  const full = path.resolve(root, rel);
  if (!within(root, full)) throw new OutsideError(`${rel} is not inside the workspace`);
  const located = await fs
    .open(full, O_PATH | (opts.follow === false ? O_NOFOLLOW : 0) | (opts.folder ? O_DIRECTORY : 0))
    .catch((err: unknown) => failedOpen(err, root, full, rel, opts.follow !== false));
  const inside = await keepInside(located, root, rel);
  let kind: Stats;
  try {
    kind = await inside.stat();
  } catch (err) {
    await inside.close();
    throw err;
  }
  // with O_NOFOLLOW, O_PATH opens a link itself where an open would refuse it
  if (kind.isSymbolicLink()) {
    await inside.close();
    throw linkRefused(rel);
  }
  if (!kind.isFile() && !kind.isDirectory()) return inside;
  try {
    return await fs.open(fdPath(inside), O_RDONLY | O_NONBLOCK | (opts.folder ? O_DIRECTORY : 0));
  } finally {
    await inside.close();
  }
}

/** Opens a folder found in an open folder, without following a link. */
export async function openChildFolder(parent: FileHandle, name: string): Promise<FileHandle> {
  return fs.open(path.join(fdPath(parent), name), O_RDONLY | O_NONBLOCK | O_DIRECTORY | O_NOFOLLOW);
}

/** The names in an open folder, with their kinds (a link is a link, never what it points to). */
export function entriesOf(folder: FileHandle) {
  return fs.readdir(fdPath(folder), { withFileTypes: true });
}

/**
 * Opens `rel` under `root` to write, making it and its missing folders; the file is not truncated (the
 * caller checks it is a plain file first). A link as the last part is refused (ELOOP).
 */
export async function openToWriteInside(root: string, rel: string): Promise<FileHandle> {
  const full = path.resolve(root, rel);
  if (!within(root, full) || full === root) throw new OutsideError(`${rel} is not inside the workspace`);
  return writeInside(root, full, rel).catch((err: unknown) => failedOpen(err, root, full, rel, false));
}

async function writeInside(root: string, full: string, rel: string): Promise<FileHandle> {
  let folder = await openInside(root, '.', { folder: true });
  try {
    for (const part of path.relative(root, path.dirname(full)).split(path.sep).filter(Boolean)) {
      const at = path.join(fdPath(folder), part);
      const opened = await fs.open(at, O_RDONLY | O_NONBLOCK | O_DIRECTORY).catch(async (err: NodeJS.ErrnoException) => {
        if (err.code !== 'ENOENT') throw err;
        await fs.mkdir(at).catch((e: NodeJS.ErrnoException) => {
          if (e.code !== 'EEXIST') throw e;
        });
        return fs.open(at, O_RDONLY | O_NONBLOCK | O_DIRECTORY);
      });
      const previous = folder;
      folder = opened;
      await previous.close();
      // a link among the folders may be followed, as long as it leads to a folder inside the root
      await fs.readlink(fdPath(folder)).then((real) => {
        if (!within(root, real)) throw new OutsideError(`${rel} is not inside the workspace`);
      });
    }
    return await fs.open(path.join(fdPath(folder), path.basename(full)), O_WRONLY | O_CREAT | O_NOFOLLOW | O_NONBLOCK, 0o644);
  } finally {
    await folder.close();
  }
}
