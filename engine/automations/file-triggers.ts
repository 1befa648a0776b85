// file_change triggers: one chokidar watcher on the workspace root per process; a change that matches
// an enabled automation's globs starts its run after the trigger's debounce. When several processes
// watch the same files, a Redis lock per automation and debounce window lets only one of them fire.
import path from 'node:path';
import { watch, type FSWatcher } from 'chokidar';
import picomatch from 'picomatch';
import type { Platform } from '../deps.js';
import type { Automation, RunTrigger } from '../platform/index.js';

type Watched = { automation: Automation; tenantRoot: string; matchers: { match: (p: string) => boolean; paths: string[]; debounceMs: number }[] };

export type FileTriggers = { start(): Promise<void>; refresh(): Promise<void>; close(): Promise<void> };

export function fileTriggersOf(
  deps: Pick<Platform, 'store' | 'redis' | 'queues' | 'log'> & { workspaceRoot: string; tenantRootOf(tenantId: string): string },
  opts: { refreshMs: number; ignore: string[]; fire(a: Automation, trigger: RunTrigger): Promise<unknown> },
): FileTriggers {
  const root = deps.workspaceRoot;
  let watched: Watched[] = [];
  const pending = new Map<string, { timer: NodeJS.Timeout; paths: Set<string> }>();
  let watcher: FSWatcher | undefined;
  let refresher: NodeJS.Timeout | undefined;

  async function refresh(): Promise<void> {
    const automations = await deps.store.automations.listEnabledWithTrigger('file_change');
    watched = automations.map((automation) => ({
      automation,
      tenantRoot: deps.tenantRootOf(automation.tenant_id),
      matchers: automation.triggers.flatMap((t) =>
        t.type === 'file_change' ? [{ match: picomatch(t.paths, { dot: true }), paths: t.paths, debounceMs: t.debounce_ms ?? 500 }] : [],
      ),
    }));
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
      entry.timer = setTimeout(() => void fire(w.automation, [...entry.paths], hit.debounceMs), hit.debounceMs);
      pending.set(key, entry);
    }
  }

  async function fire(a: Automation, paths: string[], debounceMs: number): Promise<void> {
    pending.delete(a.id);
    const lock = `${deps.queues.prefix}:file-trigger:${a.id}`;
    const won = await deps.redis.set(lock, '1', 'PX', Math.max(debounceMs, 250), 'NX');
    if (!won) return;
    try {
      await opts.fire(a, { type: 'file_change', paths: paths.sort().slice(0, 100) });
    } catch (err) {
      deps.log.warn({ automation_id: a.id, err: (err as Error).message }, 'file_change trigger did not start a run');
    }
  }

  return {
    refresh,
    async start() {
      await refresh();
      // ignore the service's own files (the SQLite store) when they sit inside the watched root
      const ignored = opts.ignore.map((p) => path.resolve(p)).filter((p) => !(root === p || root.startsWith(p + path.sep)));
      watcher = watch(root, {
        ignoreInitial: true,
        ignored: (p: string) =>
          /(^|[\\/])(node_modules|\.git|\.scratch|\.checkouts)([\\/]|$)/.test(p) || ignored.some((i) => p === i || p.startsWith(i + path.sep)),
      });
      watcher.on('add', onChange).on('change', onChange).on('unlink', onChange);
      watcher.on('error', (err) => deps.log.warn({ err }, 'file watcher error'));
      await new Promise<void>((resolve) => watcher!.once('ready', () => resolve()));
      refresher = setInterval(() => void refresh().catch(() => undefined), opts.refreshMs);
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
