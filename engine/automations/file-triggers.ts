// file_change triggers: a chokidar watcher per tenant root that has an enabled file_change automation (no
// other folder is watched); a change that matches an automation's globs starts its run after the trigger's
// debounce. Links are not followed, nor watched: a tenant's link to another tenant's folder (or to /usr)
// shows no change there, and costs no watch. Each file and folder watched is one of the host's inotify
// watches, which every process of the user shares: a root holding more than its share is not watched (and
// says so in the log), so that one tenant's tree cannot take the watches of the others and of the gates.
// When several processes watch the same files, a Redis lock per automation and batch of changes (its
// paths and their state) lets only one of them fire it.
import { createHash } from 'node:crypto';
import { realpathSync } from 'node:fs';
import fs from 'node:fs/promises';
import path from 'node:path';
import type { Platform } from '../deps.js';
import { watchWithinShare, type Automation, type RunTrigger, type SharedWatch } from '../platform/index.js';
import { compileGlobs, expandedChars, MAX_GLOB_CHARS } from './globs.js';

type Matcher = { match: (p: string) => boolean; debounceMs: number };
type Watched = { automation: Automation; tenantRoot: string; matchers: Matcher[] };

export type FileTriggers = { start(): Promise<void>; refresh(): Promise<void>; close(): Promise<void> };

/**
 * Folders no trigger looks into, at any depth: dependencies, git's own files, vibe runs' scratch copies and
 * checkouts. Named once: the watcher skips them and validateTriggers refuses a glob that could only match in them.
 */
export const IGNORED_FOLDERS: readonly string[] = ['node_modules', '.git', '.scratch', '.checkouts'];
const ignored = new Set(IGNORED_FOLDERS);
const isIgnored = (p: string) => p.split(/[\\/]/).some((name) => ignored.has(name));
/** The most files and folders (a watch each) one tenant root's watcher holds, and all of them together. */
const ROOT_ENTRIES_MAX = 20_000;
const ENTRIES_TOTAL = 100_000;
/** How long a root found too large waits before it is counted again (it may have shrunk). */
const TOO_LARGE_RETRY_MS = 10 * 60_000;
/** The paths a run's trigger names, and what a pending batch keeps of its paths: its first ones in order. */
const PATHS_KEPT = 100;
/**
 * How long matching file events holds the process before it lets other work in (a turn of the event loop): each
 * automation's globs are bounded (MAX_GLOB_CHARS), but a tenant may keep many, and the process is every tenant's.
 */
const MATCH_SLICE_MS = 10;
/** File events waiting to be matched, at most: past it (a burst faster than matching), new ones are dropped, and said so. */
const EVENTS_QUEUED_MAX = 100_000;
/** How long a folder's check (its real path is its path: no link on the way) is trusted, unless the watcher sees it go or come. */
const FOLDER_CHECK_MS = 1000;
/** Where a folder a file event names is: at its path, somewhere else (a link on the way), or gone already. */
type FolderCheck = 'real' | 'elsewhere' | 'gone';

type Root = {
  watch: SharedWatch;
  /** device, inode and birth time when it was watched: a root made again is another folder */
  identity: string;
  /** more entries than it was allowed: not watched, until `retryAt` */
  tooLarge?: { retryAt: number };
};

/** A batch of changes waiting for its debounce: its first paths in order, and whether there were more. */
type Pending = {
  timer: NodeJS.Timeout;
  paths: string[];
  more: boolean;
  /** the kept paths last seen removed: their folder's change time as the removal was seen (see removal) */
  gone: Map<string, Promise<string>>;
};

export function fileTriggersOf(
  deps: Pick<Platform, 'store' | 'redis' | 'queues' | 'log'> & {
    tenantRootOf(tenantId: string): string;
    rootEntriesMax?: number;
    entriesTotal?: number;
    tooLargeRetryMs?: number;
  },
  opts: { refreshMs: number; fire(a: Automation, trigger: RunTrigger): Promise<unknown> },
): FileTriggers {
  const rootMax = deps.rootEntriesMax ?? ROOT_ENTRIES_MAX;
  const total = deps.entriesTotal ?? ENTRIES_TOTAL;
  const retryMs = deps.tooLargeRetryMs ?? TOO_LARGE_RETRY_MS;
  let watched: Watched[] = [];
  /** the tenant roots being watched (or found too large), by real path */
  const roots = new Map<string, Root>();
  const pending = new Map<string, Pending>();
  let started = false;
  let closed = false;
  let refresher: NodeJS.Timeout | undefined;

  /** The watches every root holds now (a root being read counts what it has read so far). */
  const entriesHeld = () => {
    let n = 0;
    for (const r of roots.values()) n += r.watch.entries;
    return n;
  };

  const matchersOf = (a: Automation): Matcher[] =>
    a.triggers.flatMap((t) => (t.type === 'file_change' ? [{ match: compileGlobs(t.paths), debounceMs: t.debounce_ms ?? 500 }] : []));

  /** Watches one root within its share of watches (watchWithinShare): past it, the root is let go and said so. */
  function watchRoot(root: string, identity: string): Root {
    const entry = { identity } as Root;
    entry.watch = watchWithinShare(root, {
      // a link is not watched at all: chokidar, not following it, still watched the link's path, and the
      // kernel's watch of a path follows the link, so a change in the folder a link points to (another
      // tenant's) came through as a change of the link itself
      // by the path inside the root: a root under a folder of that name (a tenant named `node_modules`, a workspace
      // root below a `.checkouts`) was skipped whole, and its triggers never fired
      skip: (p, stats) => isIgnored(path.relative(root, p)) || Boolean(stats?.isSymbolicLink()),
      max: rootMax,
      total,
      held: entriesHeld,
      letGo: (held) => {
        entry.tooLarge = { retryAt: Date.now() + retryMs };
        deps.log.warn(
          { root, entries: held, root_max: rootMax, total_max: total },
          `a tenant root holds more files and folders than its file watcher may (each is one of the host's watches): its file_change triggers do not fire`,
        );
      },
    });
    entry.watch.watcher
      .on('add', (f) => onChange(f))
      .on('change', (f) => onChange(f))
      .on('unlink', (f) => onChange(f, removal(f)))
      .on('addDir', (d) => forgetChecks(d))
      .on('unlinkDir', (d) => forgetChecks(d))
      .on('error', (err) => deps.log.warn({ err, root }, 'file watcher error'));
    return entry;
  }

  /** One refresh at a time: two at once would each watch a root the other is adding. */
  let refreshing: Promise<void> = Promise.resolve();
  function refresh(): Promise<void> {
    const next = refreshing.then(refreshOnce, refreshOnce);
    refreshing = next.catch(() => undefined);
    return next;
  }

  /** automations not matched for their globs' cost, each said once (a refresh every few seconds would say it again) */
  const tooCostly = new Set<string>();
  /** Whether an automation's globs are within MAX_GLOB_CHARS: one stored before they were bounded is not matched. */
  const affordable = (a: Automation): boolean => {
    let chars: number;
    try {
      chars = expandedChars(a.triggers.flatMap((t) => (t.type === 'file_change' ? t.paths : [])));
    } catch {
      chars = Infinity; // braces past their own bound
    }
    if (chars <= MAX_GLOB_CHARS) return true;
    const key = `${a.id}:${a.updated_at}`;
    if (!tooCostly.has(key)) {
      tooCostly.add(key);
      deps.log.warn(
        { tenant_id: a.tenant_id, automation_id: a.id, glob_chars: chars, max: MAX_GLOB_CHARS },
        'an automation’s file_change globs cost more than any may (stored before they were bounded): its file changes do not fire it until they are made fewer',
      );
    }
    return false;
  };

  async function refreshOnce(): Promise<void> {
    const automations = (await deps.store.automations.listEnabledWithTrigger('file_change')).filter(affordable);
    // a tenant's root is watched at its real path: a root that is itself a link (a tenant's folder on
    // another disk) is followed, where no link inside it is
    const realRoots = new Map<string, string>();
    const identities = new Map<string, string>();
    for (const tenantId of new Set(automations.map((a) => a.tenant_id))) {
      const root = deps.tenantRootOf(tenantId);
      await fs.mkdir(root, { recursive: true });
      const real = await fs.realpath(root).catch(() => root);
      realRoots.set(tenantId, real);
      // its inode and birth time: a folder made again at once often gets the inode of the one removed
      const st = await fs.stat(real).catch(() => null);
      identities.set(real, st ? `${st.dev}:${st.ino}:${st.birthtimeMs}` : '');
    }
    watched = automations.map((automation) => ({ automation, tenantRoot: realRoots.get(automation.tenant_id)!, matchers: matchersOf(automation) }));
    if (!started || closed) return;
    const wanted = new Map([...new Set(watched.map((w) => w.tenantRoot))].map((r) => [r, identities.get(r) ?? '']));
    // a root no longer wanted, or removed and made again (a run's rm -rf, a restore: the watch of the one
    // removed saw its end and no more), or found too large a while ago, is closed (every watch it holds goes)
    // and, if wanted, watched afresh
    const now = Date.now();
    for (const [root, r] of roots)
      if (wanted.get(root) !== r.identity || (r.tooLarge && now >= r.tooLarge.retryAt)) {
        roots.delete(root);
        await r.watch.watcher.close();
      }
    for (const [root, identity] of wanted) if (!roots.has(root)) roots.set(root, watchRoot(root, identity));
  }

  /**
   * A removal's state, taken as it is seen: its folder's change time then, which every process watching reads
   * alike (read when the batch fires instead, a file written in the folder meanwhile gave each process a batch
   * of its own, and each fired it), and which tells one removal of a file from the next.
   */
  function removal(file: string): Promise<string> {
    return fs.lstat(path.dirname(file)).then(
      (folder) => `gone:${folder.ctimeMs}`,
      () => 'gone',
    );
  }

  /** file events not yet matched (from `head` on), each with the automations it is matched against (those watched when it came) and how far it got */
  let events: { file: string; removed?: Promise<string>; against: Watched[]; next: number; rel?: string }[] = [];
  let head = 0;
  let matching = false;
  let dropped = 0;

  /**
   * Folders checked lately: whether each is where its path says, no link on the way. A folder a run removed and
   * replaced at once by a link (`rmdir inbox && ln -s ../tenant-b inbox`) was read again by the watcher through the
   * link: every file of another tenant's folder, or of the host's, came as an `add` under the watched path, and
   * fired the automation with their names. Such files are dropped, and remembered: the watcher's later word that
   * they were removed (the link taken away, a real folder made in its place) is not reported either, while the
   * removals of files it saw in real folders are.
   */
  const checked = new Map<string, { at: number; where: FolderCheck }>();
  const seenThroughLinks = new Set<string>();
  /** The watcher saw `dir` go or come: its checks, and those of the folders under it, are not trusted any more. */
  function forgetChecks(dir: string): void {
    for (const d of checked.keys()) if (d === dir || d.startsWith(dir + path.sep)) checked.delete(d);
  }
  function checkFolder(dir: string): FolderCheck {
    const hit = checked.get(dir);
    if (hit && Date.now() - hit.at < FOLDER_CHECK_MS) return hit.where;
    let where: FolderCheck;
    try {
      where = realpathSync.native(dir) === dir ? 'real' : 'elsewhere';
    } catch {
      // gone already (a build's folder made and removed at once): its file is not reported, and is no link's either
      where = 'gone';
    }
    if (checked.size > 10_000) checked.clear();
    checked.set(dir, { at: Date.now(), where });
    return where;
  }

  function onChange(file: string, removed?: Promise<string>): void {
    // a file seen through a link is not the tenant's: a change is reported only from a folder that is where its
    // path says, and a removal unless the file was only ever seen through a link
    if (removed) {
      if (seenThroughLinks.delete(file)) return;
    } else {
      const where = checkFolder(path.dirname(file));
      if (where === 'elsewhere') {
        // (at most what the watchers hold: a root is let go past ROOT_ENTRIES_MAX)
        if (seenThroughLinks.size >= 100_000) seenThroughLinks.delete(seenThroughLinks.values().next().value!);
        seenThroughLinks.add(file);
      }
      if (where !== 'real') return;
      // (seen in a real folder since: its removal is the tenant's)
      seenThroughLinks.delete(file);
    }
    if (events.length - head >= EVENTS_QUEUED_MAX) {
      if (dropped++ === 0)
        deps.log.warn({ queued: events.length - head }, 'file events come faster than they are matched: new ones are dropped until the line drains');
      return;
    }
    events.push({ file, removed, against: watched, next: 0 });
    if (!matching) matchEvents();
  }

  /** Matches the events in line, in order, and lets other work in every MATCH_SLICE_MS (most events take a fraction of it). */
  function matchEvents(): void {
    matching = true;
    const until = performance.now() + MATCH_SLICE_MS;
    for (let e = events[head]; e && !closed; e = events[head]) {
      while (e.next < e.against.length) {
        try {
          matchOne(e, e.against[e.next++]!);
        } catch (err) {
          deps.log.warn({ err: (err as Error).message, automation_id: e.against[e.next - 1]!.automation.id }, 'a file event could not be matched');
        }
        if (performance.now() > until) {
          setImmediate(matchEvents);
          return;
        }
      }
      // the matched ones are let go now and then, not one at a time (shifting a long line is slow)
      if (++head >= 4096) {
        events = events.slice(head);
        head = 0;
      }
    }
    events = [];
    head = 0;
    matching = false;
    if (dropped) deps.log.warn({ dropped }, 'file events were dropped while matching could not keep up');
    dropped = 0;
  }

  function matchOne(e: (typeof events)[number], w: Watched): void {
    // an automation's globs are relative to its own tenant's root, and see nothing outside it
    if (!e.file.startsWith(w.tenantRoot + path.sep)) return;
    const rel = (e.rel ??= path.relative(w.tenantRoot, e.file).split(path.sep).join('/'));
    const hit = w.matchers.find((m) => m.match(rel));
    if (!hit) return;
    const key = w.automation.id;
    const entry: Pending = pending.get(key) ?? { timer: undefined as unknown as NodeJS.Timeout, paths: [], more: false, gone: new Map() };
    keep(entry, rel);
    if (e.removed && entry.paths.includes(rel)) entry.gone.set(rel, e.removed);
    else entry.gone.delete(rel);
    clearTimeout(entry.timer);
    entry.timer = setTimeout(() => void fire(w.automation, entry, w.tenantRoot), hit.debounceMs);
    pending.set(key, entry);
  }

  /** Adds a path to a batch, which keeps its first PATHS_KEPT in order (a burst of 100,000 is not held whole). */
  function keep(batch: Pending, rel: string): void {
    const paths = batch.paths;
    let lo = 0;
    for (let hi = paths.length; lo < hi;) {
      const mid = (lo + hi) >> 1;
      if (paths[mid]! < rel) lo = mid + 1;
      else hi = mid;
    }
    if (paths[lo] === rel) return;
    if (lo >= PATHS_KEPT) {
      batch.more = true;
      return;
    }
    paths.splice(lo, 0, rel);
    if (paths.length > PATHS_KEPT) {
      batch.gone.delete(paths.pop()!);
      batch.more = true;
    }
  }

  /** The state a path of a batch is in now: its change time and size, or, gone, its removal's (see removal). */
  async function stateOf(root: string, rel: string, batch: Pending): Promise<string> {
    const st = await fs.lstat(path.join(root, rel)).catch(() => null);
    // the change time, which no one sets (a copy that keeps the modified time still moves it)
    if (st) return `${st.ctimeMs}:${st.size}`;
    return (await batch.gone.get(rel)) ?? 'gone';
  }

  /** Whether every state (stateOf's) is a change made while the automation's latest run ran (from its start to its end, or now). */
  async function madeByOwnRun(a: Automation, states: string[]): Promise<boolean> {
    const latest = (await deps.store.runs.list(a.tenant_id, { automation_id: a.id, limit: 1 })).items[0];
    if (!latest?.started_at) return false;
    const from = Date.parse(latest.started_at);
    const to = latest.finished_at ? Date.parse(latest.finished_at) : Date.now();
    return states.every((state) => {
      // `<ctime>:<size>`, or a removal's `gone:<its folder's ctime>` (`gone` alone: when, unknown)
      const at = Number(state.startsWith('gone') ? state.slice(5) : state.split(':')[0]);
      return state !== 'gone' && at >= from && at <= to;
    });
  }

  /**
   * Fires a batch: never rejects (it is started from a timer, where a rejection would end the process). A batch
   * whose lock or run cannot be had (Redis or the store did not answer, Redis refused the write) is not fired,
   * and says so in the log, as a run refused for a full tenant line is.
   */
  async function fire(fired: Automation, batch: Pending, root: string): Promise<void> {
    pending.delete(fired.id);
    try {
      // the automation as it is now: one disabled, archived or whose file_change triggers changed since the
      // batch began fires only for the paths its triggers still match (runRequest refuses one not enabled)
      const a = (await deps.store.automations.get(fired.tenant_id, fired.id).catch(() => fired)) ?? null;
      const matchers = a ? matchersOf(a) : [];
      const paths: string[] = [];
      let until = performance.now() + MATCH_SLICE_MS;
      for (const p of batch.paths) {
        if (matchers.some((m) => m.match(p))) paths.push(p);
        if (performance.now() > until) {
          await new Promise((r) => setImmediate(r));
          until = performance.now() + MATCH_SLICE_MS;
        }
      }
      if (!a || !paths.length) {
        deps.log.info({ automation_id: fired.id }, 'file changes not fired: the automation no longer watches them');
        return;
      }
      // the batch's identity: its paths and the state each is in now. Every process that saw the same changes
      // takes the same lock and only one fires; a later change of the same files is another state, so another
      // lock, and is never dropped for following the last too closely
      const states = await Promise.all(paths.map((p) => stateOf(root, p, batch)));
      // what the automation's own run wrote does not fire it again (it started itself anew at every run): a
      // batch whose every path changed while its latest run ran is that run's, as a change made while it runs
      // is (a watcher's "do nothing while busy"); a change made after it ended fires
      if (await madeByOwnRun(a, states)) {
        deps.log.info({ automation_id: a.id, paths: paths.length }, 'file changes not fired: made while the automation’s own run ran');
        return;
      }
      const identity = createHash('sha256')
        .update(JSON.stringify([batch.more, paths, states]))
        .digest('hex')
        .slice(0, 24);
      const lock = `${deps.queues.prefix}:file-trigger:${a.id}:${identity}`;
      const debounceMs = Math.max(0, ...matchers.map((m) => m.debounceMs));
      const won = await deps.redis.set(lock, '1', 'PX', Math.max(debounceMs, 250) + 10_000, 'NX');
      if (!won) return;
      await opts.fire(a, { type: 'file_change', paths });
    } catch (err) {
      deps.log.warn({ automation_id: fired.id, err: (err as Error).message }, 'file_change trigger did not start a run');
    }
  }

  return {
    refresh,
    async start() {
      started = true;
      // a store that cannot list the triggers now does not stop the process: the next refresh tries again
      const listed = await refresh().then(
        () => true,
        (err: Error) => (deps.log.warn({ err: err.message }, 'file triggers not refreshed'), false),
      );
      // chokidar says `ready` once a root's files have been read
      if (listed) await Promise.all([...roots.values()].map((r) => r.watch.ready));
      refresher = setInterval(() => void refresh().catch((err: Error) => deps.log.warn({ err: err.message }, 'file triggers not refreshed')), opts.refreshMs);
      refresher.unref();
    },
    async close() {
      closed = true;
      events = [];
      head = 0;
      clearInterval(refresher);
      for (const p of pending.values()) clearTimeout(p.timer);
      pending.clear();
      await Promise.all([...roots.values()].map((r) => r.watch.watcher.close()));
      roots.clear();
    },
  };
}
