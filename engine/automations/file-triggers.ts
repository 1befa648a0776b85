// file_change triggers: one chokidar watcher per process over the tenant roots that have an enabled
// file_change automation (no other folder is watched); a change that matches an automation's globs
// starts its run after the trigger's debounce. Links are not followed, nor watched: a tenant's link to
// another tenant's folder (or to /usr) shows no change there, and costs no watch. When several processes watch
// the same files, a Redis lock per automation and batch of changes (its paths and their state) lets
// only one of them fire it.
import { createHash } from 'node:crypto';
import fs from 'node:fs/promises';
import path from 'node:path';
import { watch, type FSWatcher } from 'chokidar';
import type { Platform } from '../deps.js';
import type { Automation, RunTrigger } from '../platform/index.js';
import { compileGlobs } from './globs.js';

type Watched = { automation: Automation; tenantRoot: string; matchers: { match: (p: string) => boolean; paths: string[]; debounceMs: number }[] };

export type FileTriggers = { start(): Promise<void>; refresh(): Promise<void>; close(): Promise<void> };

/** folders no trigger looks into: dependencies, git's own files, vibe runs' scratch copies and checkouts */
const IGNORED = /(^|[\\/])(node_modules|\.git|\.scratch|\.checkouts)([\\/]|$)/;

export function fileTriggersOf(
  deps: Pick<Platform, 'store' | 'redis' | 'queues' | 'log'> & { tenantRootOf(tenantId: string): string },
  opts: { refreshMs: number; fire(a: Automation, trigger: RunTrigger): Promise<unknown> },
): FileTriggers {
  let watched: Watched[] = [];
  /** the tenant roots being watched, each with its identity (device, inode, birth time) when it was added */
  let roots = new Map<string, string>();
  const pending = new Map<string, { timer: NodeJS.Timeout; paths: Set<string> }>();
  let watcher: FSWatcher | undefined;
  let refresher: NodeJS.Timeout | undefined;

  async function refresh(): Promise<void> {
    const automations = await deps.store.automations.listEnabledWithTrigger('file_change');
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
    watched = automations.map((automation) => ({
      automation,
      tenantRoot: realRoots.get(automation.tenant_id)!,
      matchers: automation.triggers.flatMap((t) =>
        t.type === 'file_change' ? [{ match: compileGlobs(t.paths), paths: t.paths, debounceMs: t.debounce_ms ?? 500 }] : [],
      ),
    }));
    if (!watcher) return;
    const wanted = new Map([...new Set(watched.map((w) => w.tenantRoot))].map((r) => [r, identities.get(r) ?? '']));
    // a root removed and made again (a run's rm -rf, a restore) is another folder: the watch of the one
    // removed saw its end and no more, so the new one is watched afresh
    const dropped = [...roots].filter(([r, id]) => wanted.get(r) !== id).map(([r]) => r);
    const added = [...wanted].filter(([r, id]) => roots.get(r) !== id).map(([r]) => r);
    if (dropped.length) watcher.unwatch(dropped);
    if (added.length) watcher.add(added);
    roots = wanted;
  }

  function onChange(file: string): void {
    for (const w of watched) {
      // an automation's globs are relative to its own tenant's root, and see nothing outside it
      if (!file.startsWith(w.tenantRoot + path.sep)) continue;
      const rel = path.relative(w.tenantRoot, file).split(path.sep).join('/');
      const hit = w.matchers.find((m) => m.match(rel));
      if (!hit) continue;
      const key = w.automation.id;
      const entry = pending.get(key) ?? { timer: undefined as unknown as NodeJS.Timeout, paths: new Set<string>() };
      entry.paths.add(rel);
      clearTimeout(entry.timer);
      entry.timer = setTimeout(() => void fire(w.automation, entry, w.tenantRoot, hit.debounceMs), hit.debounceMs);
      pending.set(key, entry);
    }
  }

  async function fire(a: Automation, batch: { paths: Set<string> }, root: string, debounceMs: number): Promise<void> {
    pending.delete(a.id);
    const paths = [...batch.paths].sort();
    // the batch's identity: its paths and the state each is in now (modified time, or gone). Every process
    // that saw the same changes takes the same lock and only one fires; a later change of the same files
    // is another state, so another lock, and is never dropped for following the last too closely
    const states = await Promise.all(
      paths.slice(0, 100).map((p) =>
        fs.stat(path.join(root, p)).then(
          (st) => st.mtimeMs,
          () => 'gone',
        ),
      ),
    );
    const identity = createHash('sha256')
      .update(JSON.stringify([paths.length, paths.slice(0, 100), states]))
      .digest('hex')
      .slice(0, 24);
    const lock = `${deps.queues.prefix}:file-trigger:${a.id}:${identity}`;
    const won = await deps.redis.set(lock, '1', 'PX', Math.max(debounceMs, 250) + 10_000, 'NX');
    if (!won) return;
    try {
      await opts.fire(a, { type: 'file_change', paths: paths.slice(0, 100) });
    } catch (err) {
      deps.log.warn({ automation_id: a.id, err: (err as Error).message }, 'file_change trigger did not start a run');
    }
  }

  return {
    refresh,
    async start() {
      // a link is not watched at all: chokidar, not following it, still watched the link's path, and the
      // kernel's watch of a path follows the link, so a change in the folder a link points to (another
      // tenant's) came through as a change of the link itself
      watcher = watch([], {
        ignoreInitial: true,
        followSymlinks: false,
        ignored: (p: string, stats?: { isSymbolicLink(): boolean }) => IGNORED.test(p) || Boolean(stats?.isSymbolicLink()),
      });
      watcher.on('add', onChange).on('change', onChange).on('unlink', onChange);
      watcher.on('error', (err) => deps.log.warn({ err }, 'file watcher error'));
      // chokidar says `ready` once, when the roots first added have been read
      const ready = new Promise<void>((resolve) => watcher!.once('ready', () => resolve()));
      // a store that cannot list the triggers now does not stop the process: the next refresh tries again
      const listed = await refresh().then(
        () => true,
        (err: Error) => (deps.log.warn({ err: err.message }, 'file triggers not refreshed'), false),
      );
      if (listed && roots.size) await ready;
      refresher = setInterval(() => void refresh().catch((err: Error) => deps.log.warn({ err: err.message }, 'file triggers not refreshed')), opts.refreshMs);
      refresher.unref();
    },
    async close() {
      clearInterval(refresher);
      for (const p of pending.values()) clearTimeout(p.timer);
      pending.clear();
      await watcher?.close();
    },
  };
}
