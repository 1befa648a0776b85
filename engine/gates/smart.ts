// Smart gates: a workspace's readiness now. Each gate of its set is passing, failing, stale (its
// inputs or its definition changed since its latest result), missing (never run) or running; the
// workspace is ready when every required gate passes on the current inputs. A chokidar watcher per
// workspace marks what it knows stale within a second of a change; until one comes, a snapshot reuses
// the digests it computed, so a request does not rehash the tree.
import type { FSWatcher } from 'chokidar';
import type { Platform } from '../deps.js';
import { watchWithinShare, type GateResult, type GateSubject } from '../platform/index.js';
import type { Sandbox } from '../tools/index.js';
import { loadGateSet, type GateDefinition } from './definition.js';
import type { GateRuns } from './gate-runs.js';
import { subjectOf } from './runner.js';
import { inputFiles, gitState, type GitState } from './subject.js';

export type GateState = 'passing' | 'failing' | 'stale' | 'missing' | 'running';

export type SmartGates = {
  workspace: string;
  source: string;
  ready: boolean;
  blocking: { gate_id: string; state: GateState; reason: string }[];
  subject: GateSubject;
  gates: {
    id: string;
    name: string;
    required: boolean;
    state: GateState;
    last: (Pick<GateResult, 'conclusion' | 'summary' | 'finished_at' | 'input_digest'> & { gate_run_id: string | null }) | null;
  }[];
  checked_at: string;
};

/** What a workspace's watcher knows: its git state and the digest of each input set, until a change. */
type Known = {
  /** absent for a one-off snapshot (an audit's): nothing is kept for it */
  watcher?: FSWatcher;
  ready: Promise<void>;
  /** counts the changes seen: what was computed before the latest change is not kept */
  generation: number;
  git?: Promise<GitState>;
  digests: Map<string, Promise<string>>;
  used: number;
  /** more files and folders than a watcher may hold: not watched, each snapshot computed afresh */
  unwatched?: boolean;
  /** the files and folders its watcher holds now (a watch each) */
  entries(): number;
};

const WATCHED_MAX = 32;
/**
 * The most files and folders one workspace's watcher holds (a watch each, from the host's inotify watches, which
 * every process of the user shares): a workspace with more is not watched, and its snapshots are computed
 * afresh, so that one tenant's tree cannot spend the watches the file triggers and others need.
 */
const WATCHED_ENTRIES_MAX = 20_000;
/** The most files and folders all the watchers of the process hold together (of the host's 8,192 to a few hundred thousand). */
const WATCHED_ENTRIES_TOTAL = 80_000;
const IGNORED = /(^|[/\\])(node_modules|\.git[/\\](objects|logs|lfs))([/\\]|$)/;

export function smartGatesOf(
  deps: Pick<Platform, 'store' | 'clock'> & { sandbox: Sandbox; gates: GateRuns; watchedEntriesMax?: number; watchedEntriesTotal?: number },
) {
  const { store, clock, sandbox, gates } = deps;
  const entriesMax = deps.watchedEntriesMax ?? WATCHED_ENTRIES_MAX;
  const entriesTotal = deps.watchedEntriesTotal ?? WATCHED_ENTRIES_TOTAL;
  const known = new Map<string, Known>();

  function knownOf(dir: string): Known {
    let k = known.get(dir);
    if (!k) {
      if (known.size >= WATCHED_MAX) {
        const [oldest] = [...known.entries()].sort((a, b) => a[1].used - b[1].used);
        void oldest![1].watcher?.close();
        known.delete(oldest![0]);
      }
      // within its share of the host's watches (its own most, and what the other watchers leave of the total):
      // past it, at once or once the workspace has grown past it, it is let go
      const share = watchWithinShare(dir, {
        skip: (p) => IGNORED.test(p),
        max: entriesMax,
        total: entriesTotal,
        held: () => [...known.values()].reduce((n, other) => n + other.entries(), 0),
        letGo: () => (fresh.unwatched = true),
      });
      const { watcher } = share;
      const fresh: Known = {
        watcher,
        ready: share.ready,
        generation: 0,
        digests: new Map(),
        used: 0,
        entries: () => share.entries,
      };
      // any change forgets what was computed: the next snapshot computes it again (and rehashes only what changed)
      const forget = () => {
        fresh.generation++;
        fresh.git = undefined;
        fresh.digests.clear();
      };
      watcher.on('all', forget);
      // a watcher that fails may miss changes: its workspace is watched afresh by the next snapshot
      watcher.on('error', () => {
        forget();
        void watcher.close();
        if (known.get(dir) === fresh) known.delete(dir);
      });
      known.set(dir, fresh);
      k = fresh;
    }
    k.used = Date.now();
    return k;
  }

  return {
    /** The gates' readiness now; `watch: false` computes it once, without a watcher or a cache (an audit in a worker). */
    async snapshot(tenantId: string, workspace: string | undefined, opts: { watch?: boolean } = {}): Promise<SmartGates> {
      const ws = await gates.workspaceOf(tenantId, workspace, '/query/workspace');
      const once = (): Known => ({ ready: Promise.resolve(), generation: 0, digests: new Map(), used: 0, entries: () => 0 });
      const watched = opts.watch === false ? once() : knownOf(ws.dir);
      await watched.ready;
      const k = watched.unwatched ? once() : watched;
      const set = await loadGateSet(ws.dir);
      // what this snapshot computes is kept only if no change came while it computed it
      const generation = k.generation;
      const keep = <T>(p: Promise<T>, store: (p: Promise<T>) => void) => {
        void p.then(() => (k.generation === generation ? store(p) : undefined)).catch(() => undefined);
        return p;
      };
      const git = await (k.git ?? keep(gitState(sandbox, ws.dir), (p) => (k.git = p)));
      const digestOf = (g: GateDefinition) => {
        const key = JSON.stringify(g.inputs);
        return (
          k.digests.get(key) ??
          keep(
            inputFiles(ws.dir, g.inputs, git).then((files) => gates.hasherOf(ws.dir).digest(ws.dir, files)),
            (p) => k.digests.set(key, p),
          )
        );
      };
      // the latest result of each gate and the runs under way: no sealed run is read whole (its results, each
      // with its output and annotations, made megabytes a run, and a snapshot read the last 20)
      const [latest, running] = await Promise.all([store.gateRuns.latestResults(tenantId, ws.name), store.gateRuns.runningOf(tenantId, ws.name)]);
      const byGate = new Map(latest.map((l) => [l.result.gate_id, l.result]));
      const runOf = new Map(latest.map((l) => [l.result.gate_id, l.gate_run_id]));
      const runningGates = new Set(running.flatMap((r) => r.gates));
      const rows = await Promise.all(
        set.gates.map(async (g) => {
          const last = byGate.get(g.id);
          let state: GateState;
          let reason: string;
          if (runningGates.has(g.id)) [state, reason] = ['running', 'a gate run is under way'];
          else if (!last) [state, reason] = ['missing', 'it has never run'];
          else if (last.definition_digest !== g.digest) [state, reason] = ['stale', 'its definition changed since its last result'];
          else if (last.input_digest !== (await digestOf(g))) [state, reason] = ['stale', 'its inputs changed since its last result'];
          else if (last.conclusion === 'success') [state, reason] = ['passing', ''];
          else [state, reason] = ['failing', `its last result was ${last.conclusion}: ${last.summary}`];
          return {
            row: {
              id: g.id,
              name: g.name,
              required: g.required,
              state,
              last: last
                ? {
                    conclusion: last.conclusion,
                    summary: last.summary,
                    finished_at: last.finished_at,
                    input_digest: last.input_digest,
                    gate_run_id: runOf.get(g.id) ?? null,
                  }
                : null,
            },
            reason,
          };
        }),
      );
      const blocking = rows
        .filter(({ row }) => row.required && row.state !== 'passing')
        .map(({ row, reason }) => ({ gate_id: row.id, state: row.state, reason }));
      return {
        workspace: ws.name,
        source: set.source,
        ready: blocking.length === 0,
        blocking,
        subject: subjectOf({ workspaceName: ws.name, git }),
        gates: rows.map((r) => r.row),
        checked_at: clock.now().toISOString(),
      };
    },

    async close(): Promise<void> {
      await Promise.all([...known.values()].map((k) => k.watcher?.close()));
      known.clear();
    },
  };
}

export type SmartGatesService = ReturnType<typeof smartGatesOf>;
