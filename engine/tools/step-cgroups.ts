// A step's control groups: one per step, under a folder of the deployment's (`<prefix>-sandbox`), bounding
// the number of its processes (pids) and the memory of all of them together (memory), where the host lets
// this process make them. cgroup v2 keeps both in one group; v1 has a hierarchy per controller, so a step
// has a group in each. On v1 the deployment's folder is made inside the service's own group (a container's,
// a systemd unit's): a step stays under the limits the operator set on the service. The deployment's
// folders are shared by all its processes (a web and a worker, the next one of a rolling deploy) and never
// removed; each process removes only its own steps' groups, named for it alone (its pid and a random tag: a
// restarted container's process has the same pid), and, at start, the empty groups a process that died
// mid-step left behind.
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';

export type CgroupController = 'pids' | 'memory';

export type StepLimits = { processes: number; memoryBytes: number };

/** The groups of one step. */
export type StepGroup = {
  /** the `cgroup.procs` files the step's first process joins, before it becomes bubblewrap */
  readonly procs: string[];
  /** Signals every process of the step (v1 and v2 both list them in cgroup.procs). */
  kill(signal: NodeJS.Signals): void;
  /** Whether the kernel ended a process of the step for memory over the limit; false when nothing bounds it. */
  outOfMemory(): boolean;
  /** Removes the groups once the step's processes are gone (tried again for a second). */
  remove(): void;
};

export type StepCgroups = {
  /** what a step's groups bound */
  readonly controllers: readonly CgroupController[];
  /** Makes a step's groups with its limits; throws when one that bounded steps at start cannot be made. */
  make(limits: StepLimits): StepGroup;
  /** Removes this process's own step groups that are empty; the deployment's folders stay. */
  close(): void;
};

/** One folder of step groups: v2's one for every controller, or v1's one per controller. */
type Root = { dir: string; v2: boolean; controllers: CgroupController[] };

const write = (file: string, value: string) => fs.writeFileSync(file, value);
const tryWrite = (file: string, value: string) => {
  try {
    write(file, value);
  } catch {
    // the kernel has no such knob (no swap accounting)
  }
};

/** The deployment's folder of step groups, made if it is not there; on v2 its children may use the controllers. */
function prepare(root: Root): void {
  fs.mkdirSync(root.dir, { recursive: true });
  if (root.v2) for (const c of root.controllers) write(path.join(root.dir, 'cgroup.subtree_control'), `+${c}`);
}

/** Writes a step's limits into its group of `root`. */
function limit(root: Root, group: string, limits: StepLimits): void {
  for (const c of root.controllers) {
    if (c === 'pids') write(path.join(group, 'pids.max'), String(limits.processes));
    else if (root.v2) {
      write(path.join(group, 'memory.max'), String(limits.memoryBytes));
      // swap would let a step past its memory: none
      tryWrite(path.join(group, 'memory.swap.max'), '0');
    } else {
      write(path.join(group, 'memory.limit_in_bytes'), String(limits.memoryBytes));
      tryWrite(path.join(group, 'memory.memsw.limit_in_bytes'), String(limits.memoryBytes));
    }
  }
}

/** A folder of `root` whose limits can be written: the controller can be used here. */
function probe(root: Root): boolean {
  const dir = path.join(root.dir, `probe-${process.pid}-${randomBytes(6).toString('hex')}`);
  try {
    prepare(root);
    fs.mkdirSync(dir, { recursive: true });
    limit(root, dir, { processes: 8, memoryBytes: 64 * 1024 * 1024 });
    return true;
  } catch {
    return false;
  } finally {
    try {
      fs.rmdirSync(dir);
    } catch {
      // never made
    }
  }
}

/** This process's own group in v1's hierarchy of `controller`, from /proc/self/cgroup ('/' when not found). */
function ownGroupV1(controller: CgroupController): string {
  try {
    for (const line of fs.readFileSync('/proc/self/cgroup', 'utf8').split('\n')) {
      const [, controllers, group] = /^\d+:([^:]*):(.*)$/.exec(line) ?? [];
      if (controllers?.split(',').includes(controller) && group?.startsWith('/')) return group;
    }
  } catch {
    // no /proc: the hierarchy's root
  }
  return '/';
}

/**
 * Where v1's step groups of `controller` go: inside this process's own group, so that the limits put on
 * the service (a container's memory, a unit's tasks) bound its steps too. A hierarchy mounted at the
 * process's own group (a container's view) does not have the group's path under it: its root is that group.
 */
function v1Base(controller: CgroupController): string {
  const mount = path.join('/sys/fs/cgroup', controller);
  const own = path.join(mount, ownGroupV1(controller));
  return own !== mount && fs.existsSync(own) ? own : mount;
}

/** The roots this process may make step groups in: v2 (unified) if it has pids, else v1's pids and memory. */
function rootsOf(prefix: string): Root[] {
  const name = `${prefix}-sandbox`;
  for (const base of ['/sys/fs/cgroup', '/sys/fs/cgroup/unified']) {
    let available: string[];
    try {
      available = fs.readFileSync(path.join(base, 'cgroup.controllers'), 'utf8').split(/\s+/);
    } catch {
      continue;
    }
    if (!available.includes('pids')) continue;
    const dir = path.join(base, name);
    if (!probe({ dir, v2: true, controllers: ['pids'] })) continue;
    const both: Root = { dir, v2: true, controllers: ['pids', 'memory'] };
    return [available.includes('memory') && probe(both) ? both : { dir, v2: true, controllers: ['pids'] }];
  }
  const v1 = (c: CgroupController): Root[] => {
    if (!fs.existsSync(path.join('/sys/fs/cgroup', c))) return [];
    const root: Root = { dir: path.join(v1Base(c), name), v2: false, controllers: [c] };
    return probe(root) ? [root] : [];
  };
  return [...v1('pids'), ...v1('memory')];
}

/** Signals every process listed in a group. */
function killAll(dir: string, signal: NodeJS.Signals): void {
  let pids: string[];
  try {
    pids = fs.readFileSync(path.join(dir, 'cgroup.procs'), 'utf8').split('\n').filter(Boolean);
  } catch {
    return; // removed: nothing left in it
  }
  for (const pid of pids) {
    try {
      process.kill(Number(pid), signal);
    } catch {
      // exited meanwhile
    }
  }
}

/** How many of a memory group's processes the kernel killed for want of memory (v2 memory.events, v1 memory.oom_control). */
function oomKills(root: Root, group: string): number {
  try {
    const text = fs.readFileSync(path.join(group, root.v2 ? 'memory.events' : 'memory.oom_control'), 'utf8');
    return Number(/^oom_kill (\d+)$/m.exec(text)?.[1] ?? 0);
  } catch {
    return 0;
  }
}

/** A step group older than this with no process in it is a leftover: its step joins it as it starts. */
const LEFTOVER_AGE_MS = 60_000;

/**
 * Removes the empty step groups of a root that are older than a step takes to join its group: what a
 * process that died mid-step (killed, out of memory) left behind. A group with a process in it cannot be
 * removed, so the running steps of the deployment's other processes keep theirs.
 */
function sweepLeftovers(root: Root): void {
  let names: string[];
  try {
    names = fs.readdirSync(root.dir);
  } catch {
    return;
  }
  for (const name of names) {
    if (!/^(step|probe)-/.test(name)) continue;
    const dir = path.join(root.dir, name);
    try {
      if (Date.now() - fs.statSync(dir).mtimeMs < LEFTOVER_AGE_MS) continue;
      fs.rmdirSync(dir);
    } catch {
      // a running step's, or gone meanwhile
    }
  }
}

/** The step groups this process can make, or null when the host lets it make none. */
export function stepCgroups(prefix: string): StepCgroups | null {
  const roots = rootsOf(prefix);
  if (!roots.length) return null;
  for (const root of roots) sweepLeftovers(root);
  // this sandbox's alone: another process with the same pid (a container restarted, another's pid
  // namespace) neither meets its names nor removes its groups
  const mine = `step-${process.pid}-${randomBytes(6).toString('hex')}-`;
  let stepCounter = 0;
  return {
    controllers: roots.flatMap((r) => r.controllers),
    make(limits) {
      const name = `${mine}${++stepCounter}`;
      const made: { root: Root; dir: string }[] = [];
      const removeAll = () => {
        for (const { dir } of made.splice(0)) {
          const remove = (tries: number) => {
            try {
              fs.rmdirSync(dir);
            } catch {
              if (tries > 0) setTimeout(() => remove(tries - 1), 50).unref();
            }
          };
          remove(20);
        }
      };
      try {
        for (const root of roots) {
          const dir = path.join(root.dir, name);
          try {
            fs.mkdirSync(dir);
          } catch {
            // the deployment's folder made again if it went (removed by hand, or by a process of an older version)
            prepare(root);
            fs.mkdirSync(dir);
          }
          made.push({ root, dir });
          limit(root, dir, limits);
        }
      } catch (err) {
        removeAll();
        throw err;
      }
      const pidsGroup = made.find((m) => m.root.controllers.includes('pids'))?.dir ?? made[0]!.dir;
      const memory = made.find((m) => m.root.controllers.includes('memory'));
      return {
        procs: made.map((m) => path.join(m.dir, 'cgroup.procs')),
        kill: (signal) => killAll(pidsGroup, signal),
        outOfMemory: () => (memory ? oomKills(memory.root, memory.dir) > 0 : false),
        remove: removeAll,
      };
    },
    close() {
      for (const root of roots) {
        try {
          for (const d of fs.readdirSync(root.dir, { withFileTypes: true }))
            if (d.isDirectory() && d.name.startsWith(mine)) fs.rmdirSync(path.join(root.dir, d.name));
        } catch {
          // a step still running keeps its group
        }
      }
    },
  };
}
