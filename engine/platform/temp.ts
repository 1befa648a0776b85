// The service's own temporary files and folders, named `svc-<kind>-<random>` in the system's temp folder: a
// process that dies (SIGKILL, the machine's OOM killer) leaves its own behind, and a later start removes them.
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';

/**
 * What the service keeps in the temp folder while it works: a checkout's git config (with the code host's token)
 * and objects, an upload's spill file, a recogniser's audio, an audit's copy of a repository or of its sources.
 */
export const TEMP_KINDS = ['git', 'git-dir', 'upload', 'transcribe', 'audit-git', 'audit-architecture'] as const;
export type TempKind = (typeof TEMP_KINDS)[number];

/** The prefix of a temp folder (fs.mkdtemp adds six characters) or file (a UUID is added) of a kind. */
export const tempPrefix = (kind: TempKind, tmp = os.tmpdir()): string => path.join(tmp, `svc-${kind}-`);

/** Older than anything that makes one lasts (a run's budget and an audit are at most a day), with an hour to spare. */
export const TEMP_MAX_AGE_MS = 25 * 3_600_000;

const OURS = new RegExp(`^svc-(?:${TEMP_KINDS.join('|')})-(?:[A-Za-z0-9]{6}|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})$`);

/**
 * Removes the temp folders and files a killed process of this host left (only names the service makes, owned by
 * this process's user, never through a link), once older than any of them can be in use: processes of this host
 * that are alive may be using theirs now. One that cannot be removed is left, and the rest still go. How many went.
 */
export async function sweepTemp(now = Date.now(), tmp = os.tmpdir(), uid = process.getuid?.()): Promise<number> {
  let removed = 0;
  for (const e of await fs.readdir(tmp, { withFileTypes: true }).catch(() => [])) {
    if (!(e.isDirectory() || e.isFile()) || !OURS.test(e.name)) continue;
    const at = path.join(tmp, e.name);
    const st = await fs.lstat(at).catch(() => null);
    if (!st || !(st.isDirectory() || st.isFile()) || (uid !== undefined && st.uid !== uid) || now - st.mtimeMs < TEMP_MAX_AGE_MS) continue;
    try {
      await fs.rm(at, { recursive: true, force: true });
      removed++;
    } catch {
      // not ours to remove after all (permissions): left, and the rest still go
    }
  }
  return removed;
}
