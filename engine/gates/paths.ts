// The service reads files of a tenant's workspace itself (hashing inputs, the secret scan, reports,
// artifacts) outside the sandbox, so every such read goes through here: the path is resolved with
// its folders' links followed and must stay inside the workspace's real path, and the file itself is
// opened without following a link (a link is reported as one, with its target's name, never read).
// What a read opens is checked again once open (engine/platform/inside.ts): a folder swapped for a
// link between the check and the open leads nowhere.
import fs from 'node:fs/promises';
import path from 'node:path';
import { openInside } from '../platform/index.js';

export type WorkspaceEntry =
  { kind: 'file'; size: number; mtimeMs: number; ctimeMs: number; ino: number } | { kind: 'link'; target: string } | { kind: 'other' } | null;

/** Is a glob or a path of a gate set kept inside the workspace: relative, with no `..` part? */
export const staysInside = (pattern: string) => !path.isAbsolute(pattern) && !pattern.startsWith('~') && !pattern.split(/[/\\]/).includes('..');

/** The file's path with its folders resolved, or null when that leaves the workspace (`root` is a real path). */
async function resolved(root: string, rel: string): Promise<string | null> {
  const full = path.resolve(root, rel);
  if (!full.startsWith(root + path.sep)) return null;
  const parent = await fs.realpath(path.dirname(full)).catch(() => null);
  if (!parent || (parent !== root && !parent.startsWith(root + path.sep))) return null;
  return path.join(parent, path.basename(full));
}

export async function entryOf(root: string, rel: string): Promise<WorkspaceEntry> {
  const file = await resolved(root, rel);
  const stat = file ? await fs.lstat(file).catch(() => null) : null;
  if (!file || !stat) return null;
  if (stat.isSymbolicLink()) return { kind: 'link', target: await fs.readlink(file).catch(() => '') };
  if (!stat.isFile()) return { kind: 'other' };
  return { kind: 'file', size: stat.size, mtimeMs: stat.mtimeMs, ctimeMs: stat.ctimeMs, ino: stat.ino };
}

/** A plain file's bytes (at most `maxBytes`, else null), or null when it is not one inside the workspace. */
export async function readInside(root: string, rel: string, maxBytes: number): Promise<Buffer | null> {
  const file = await resolved(root, rel);
  if (!file) return null;
  const handle = await openInside(root, path.relative(root, file), { follow: false }).catch(() => null);
  if (!handle) return null;
  try {
    const stat = await handle.stat();
    if (!stat.isFile() || stat.size > maxBytes) return null;
    const buf = Buffer.alloc(stat.size);
    const { bytesRead } = await handle.read(buf, 0, stat.size, 0);
    return buf.subarray(0, bytesRead);
  } finally {
    await handle.close();
  }
}
