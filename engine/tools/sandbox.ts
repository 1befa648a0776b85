// Every process a tool starts runs here. On Linux with bubblewrap (`bwrap`): new user, pid, ipc, uts
// and (unless the run may use the network) network namespaces; uid/gid 65534 inside; the system
// folders read-only, /etc without what is not world-readable (shadow files, private keys), the run's
// workspace read-write at /workspace, a private /tmp, nothing else (no data dir, no other workspace, no
// home of the service's user). `--die-with-parent` and the pid namespace make everything a step starts
// (daemons included) die with it, and a stop signals every process in the step's pids cgroup too (a stop
// that lands while bwrap is still starting the command would otherwise orphan it). Limits per step: CPU
// seconds, address space, file size and open files through prlimit inside the sandbox, and the number
// of processes through a pids cgroup when one can be made (RLIMIT_NPROC does not hold for a sandbox
// whose outside user is root).
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import type { Writable } from 'node:stream';
import { OutsideError, type Logger } from '../platform/index.js';
import { stepCgroups, type StepGroup } from './step-cgroups.js';
import { ToolError } from './tool-error.js';

export type SandboxKind = 'bwrap' | 'none';

export type SandboxLimits = { cpuSeconds: number; memoryMb: number; processes: number; fileSizeMb: number };

export type SandboxSpawnOptions = {
  /** the folder the process works in: read-write, seen inside as /workspace */
  workspace: string;
  env: Record<string, string>;
  /** share the host's network (only when the operator allows it) */
  network: boolean;
  /** more folders to mount at the same path, read-write (a worktree's git directory) */
  binds?: string[];
  /** mount the workspace read-only (an audit reads it and writes nothing) */
  readOnly?: boolean;
  /** folders of a tenant's to mount at the same path, read-only (the objects a vibe run's scratch clone shares) */
  readOnlyBinds?: string[];
  /** the service's own files and folders to mount at the same path, read-only (the code an audit phase runs); no tenant can change them, so they are bound by path, links followed */
  serviceBinds?: string[];
};

/**
 * A process started in the sandbox. `kill()` signals everything of it: its process group and, when it has
 * a pids cgroup, every process in that cgroup (bubblewrap gives the command a session of its own, so the
 * group alone misses it if bwrap dies before the command is tied to it). `done()` frees what the sandbox
 * made for it once it has exited.
 */
export type SandboxProcess = {
  child: ChildProcess;
  kill(signal: NodeJS.Signals): void;
  /** Whether the kernel ended a process of it for the step's memory over its limit (read before done()). */
  outOfMemory(): boolean;
  done(): void;
};

/** Signals a process group; a group that is gone already is not an error. */
function killGroup(pid: number | undefined, signal: NodeJS.Signals): void {
  if (pid === undefined) return;
  try {
    process.kill(-pid, signal);
  } catch {
    // the group is gone already
  }
}

export type Sandbox = {
  readonly kind: SandboxKind;
  /** how the number of processes of a step is bounded: a pids cgroup, RLIMIT_NPROC, or nothing */
  readonly processLimit: 'cgroup' | 'rlimit' | 'none';
  /** how a step's memory is bounded: all its processes together (a memory cgroup), or each process's address space */
  readonly memoryLimit: 'cgroup' | 'rlimit' | 'none';
  /** the limits each step runs under; null: none (no sandbox) */
  readonly limits: SandboxLimits | null;
  /** where the workspace is inside: what a step sees as its working folder */
  workspacePath(workspace: string): string;
  /** Starts argv in a new process group (kill the group to stop it all). */
  spawn(argv: string[], opts: SandboxSpawnOptions): SandboxProcess;
  /** Removes what the sandbox made for this process (its cgroup folder). */
  close(): void;
};

export const INSIDE_WORKSPACE = '/workspace';
const NOBODY = '65534';

/** Finds a program on PATH, or null. */
export function which(name: string, pathVar: string | undefined): string | null {
  for (const dir of (pathVar ?? '/usr/local/bin:/usr/bin:/bin').split(':')) {
    const file = path.join(dir, name);
    try {
      fs.accessSync(file, fs.constants.X_OK);
      return file;
    } catch {
      // not here
    }
  }
  return null;
}

/** The options this bubblewrap takes, read from its --help (older ones lack --size and --disable-userns). */
function optionsOf(bwrap: string): Set<string> {
  const help = spawnSync(bwrap, ['--help'], { encoding: 'utf8', timeout: 5000 });
  return new Set(`${help.stdout ?? ''}${help.stderr ?? ''}`.match(/--[a-z][a-z-]*/g) ?? []);
}

/** Paths under /etc that others may not read: masked inside the sandbox (an empty file or folder). */
function etcSecrets(): { files: string[]; dirs: string[] } {
  const files: string[] = [];
  const dirs: string[] = [];
  const walk = (dir: string, depth: number) => {
    let entries: fs.Dirent[];
    try {
      entries = fs.readdirSync(dir, { withFileTypes: true });
    } catch {
      return;
    }
    for (const e of entries) {
      const full = path.join(dir, e.name);
      let st: fs.Stats;
      try {
        st = fs.lstatSync(full);
      } catch {
        continue;
      }
      if (st.isSymbolicLink()) continue;
      if (st.isDirectory()) {
        if ((st.mode & 0o005) !== 0o005) dirs.push(full);
        else if (depth < 6) walk(full, depth + 1);
      } else if ((st.mode & 0o004) === 0) files.push(full);
    }
  };
  walk('/etc', 0);
  return { files, dirs };
}

/** A top-level folder of / that is a link into /usr (merged /usr) is linked the same way inside. */
function systemRoots(): string[] {
  const args: string[] = ['--ro-bind', '/usr', '/usr'];
  for (const name of ['bin', 'sbin', 'lib', 'lib32', 'lib64', 'libx32']) {
    const p = `/${name}`;
    let st: fs.Stats;
    try {
      st = fs.lstatSync(p);
    } catch {
      continue;
    }
    if (st.isSymbolicLink()) args.push('--symlink', fs.readlinkSync(p), p);
    else if (st.isDirectory()) args.push('--ro-bind', p, p);
  }
  // Node.js installed outside /usr (nvm, /opt): its install folder, read-only
  const nodeRoot = path.dirname(path.dirname(process.execPath));
  if (!nodeRoot.startsWith('/usr/') && nodeRoot !== '/usr' && nodeRoot !== '/') args.push('--ro-bind', nodeRoot, nodeRoot);
  return args;
}

/**
 * The per-process limits prlimit sets inside the sandbox. The address space is bounded only where no memory
 * cgroup bounds the step: it counts what a process reserves, not what it uses (Node reserves over 1 GB and,
 * under a smaller bound, hung or crashed where a step of it used 20 MB).
 */
function prlimitArgs(limits: SandboxLimits, o: { nproc: boolean; addressSpace: boolean }): string[] {
  const mb = 1024 * 1024;
  return [
    // SIGXCPU at the limit, which says why the process ended (the step's `cpu-exceeded`), where a hard limit alone
    // sent SIGKILL, which says nothing; SIGKILL a few seconds on for a process that catches it. No core file: SIGXCPU
    // dumps one by default, into the workspace
    `--cpu=${limits.cpuSeconds}:${limits.cpuSeconds + CPU_GRACE_SECONDS}`,
    '--core=0',
    ...(o.addressSpace ? [`--as=${limits.memoryMb * mb}`] : []),
    `--fsize=${limits.fileSizeMb * mb}`,
    '--nofile=4096',
    ...(o.nproc ? [`--nproc=${limits.processes}`] : []),
  ];
}

/** CPU seconds a process may go on using after its SIGXCPU, before the kernel kills it */
const CPU_GRACE_SECONDS = 2;

/** O_CLOEXEC as /proc/<pid>/fdinfo shows it (octal flags) */
const O_CLOEXEC = 0o2000000;

/**
 * A file this process's own runtime opened without close-on-exec before any of our code ran: V8 names the
 * files of its profiler flags after the process (`--perf-basic-prof`'s perf-<pid>.map, `--perf-prof`'s
 * jit-<pid>.dump, `--prof`'s isolate-<address>-<pid>-v8.log) and keeps writing to them. Closed, their
 * descriptor is the next file opened (the store's): V8's lines went into the SQLite file, which was then no
 * longer a database. A parent cannot name a file after a process that did not exist when it opened it.
 */
export function isOwnProfilerOutput(target: string, pid = process.pid): boolean {
  return new RegExp(`^(perf|jit)-${pid}\\.(map|dump)$|-${pid}-v8\\.log$`).test(path.basename(target));
}

/**
 * Closes what this process was handed open by its parent beyond stdin, stdout and stderr, unless marked to
 * close on exec: such a descriptor (a supervisor's pipe, a wrapper script's socket or file) would otherwise
 * reach every step, and bubblewrap passes it on. Everything Node and SQLite open is close-on-exec; the IPC
 * channel of a parent that forked this process is kept, and so are V8's profiler files (`isOwnProfilerOutput`:
 * a step could reach those, which hold code addresses and names, while an operator profiles). Linux only
 * (/proc); returns what it closed and what it kept.
 */
export function closeInheritedDescriptors(): { closed: { fd: number; target: string }[]; kept: { fd: number; target: string }[] } {
  // the IPC channel of a parent that forked this process (Node takes NODE_CHANNEL_FD out of the environment)
  const keep = new Set([0, 1, 2, (process.channel as { fd?: number } | undefined)?.fd ?? -1]);
  const closed: { fd: number; target: string }[] = [];
  const kept: { fd: number; target: string }[] = [];
  let entries: string[];
  try {
    entries = fs.readdirSync('/proc/self/fdinfo');
  } catch {
    return { closed, kept };
  }
  for (const name of entries) {
    const fd = Number(name);
    if (keep.has(fd)) continue;
    try {
      const flags = /^flags:\s*([0-7]+)/m.exec(fs.readFileSync(`/proc/self/fdinfo/${fd}`, 'utf8'))?.[1];
      if (flags === undefined || Number.parseInt(flags, 8) & O_CLOEXEC) continue;
      const target = fs.readlinkSync(`/proc/self/fd/${fd}`);
      if (isOwnProfilerOutput(target)) {
        kept.push({ fd, target });
        continue;
      }
      fs.closeSync(fd);
      closed.push({ fd, target });
    } catch {
      // gone meanwhile (the listing's own descriptor)
    }
  }
  return { closed, kept };
}

/**
 * Of `hidden` (the service's own folders: its data, the tenants' workspaces), those inside a folder every step
 * sees read-only (/usr, /etc, Node's install folder), each covered by an empty folder: a data dir at
 * /usr/src/app/data (a Dockerfile's WORKDIR) was readable by every tenant's step, its keys and store included.
 */
function hiddenInside(bound: string[], hidden: string[]): string[] {
  const seen = ['/etc', ...bound.filter((_, i) => bound[i - 1] === '--ro-bind')];
  return hidden.filter((h) => seen.some((b) => h !== b && h.startsWith(b.endsWith('/') ? b : `${b}/`))).flatMap((h) => ['--tmpfs', h]);
}

export function bwrapSandbox(opts: { bwrap: string; prlimit: string; limits: SandboxLimits; prefix: string; log: Logger; hidden?: string[] }): Sandbox {
  const secrets = etcSecrets();
  const roots = systemRoots();
  const supports = optionsOf(opts.bwrap);
  const missing = ['--size', '--disable-userns'].filter((o) => !supports.has(o));
  if (missing.length)
    opts.log.warn(
      { missing },
      'this bubblewrap is older than 0.8: steps’ /tmp is not bounded, or steps may make user namespaces (install bubblewrap 0.8 or later)',
    );
  const inherited = closeInheritedDescriptors();
  if (inherited.closed.length)
    opts.log.warn({ closed: inherited.closed }, 'closed descriptors inherited open from the parent process, so that no step reaches them');
  if (inherited.kept.length)
    opts.log.warn({ kept: inherited.kept }, 'kept the files of V8’s profiler flags open: steps can reach them while this process is profiled');
  const cgroups = stepCgroups(opts.prefix);
  const isRoot = process.getuid?.() === 0;
  const processLimit = cgroups?.controllers.includes('pids') ? 'cgroup' : isRoot ? 'none' : 'rlimit';
  const memoryLimit = cgroups?.controllers.includes('memory') ? 'cgroup' : 'rlimit';
  if (processLimit === 'none')
    opts.log.warn('no pids cgroup can be made and the service runs as root: sandboxed steps have no limit on their number of processes');
  if (memoryLimit === 'rlimit')
    opts.log.warn('no memory cgroup can be made: a step’s memory is bounded per process (its address space), not for all its processes together');
  const fixed = [
    '--unshare-user',
    '--unshare-pid',
    '--unshare-ipc',
    '--unshare-uts',
    '--unshare-cgroup-try',
    '--uid',
    NOBODY,
    '--gid',
    NOBODY,
    '--hostname',
    'sandbox',
    ...roots,
    '--ro-bind',
    '/etc',
    '/etc',
    ...secrets.files.flatMap((f) => ['--ro-bind', '/dev/null', f]),
    ...secrets.dirs.flatMap((d) => ['--tmpfs', d]),
    ...hiddenInside(roots, opts.hidden ?? []),
    '--proc',
    '/proc',
    // the kernel's settings are the host's: read-only, whatever user the step is to the host (as root, bwrap's
    // user inside is root outside, and would write core_pattern: the host's root running the tenant's code)
    '--ro-bind',
    '/proc/sys',
    '/proc/sys',
    '--ro-bind-try',
    '/proc/sysrq-trigger',
    '/proc/sysrq-trigger',
    '--dev',
    '/dev',
    // /tmp and /dev/shm are memory: each holds no more than the largest file a step may write (a step wrote 150 MB
    // into /dev/shm where no memory cgroup bounds it); the root and /dev themselves are made read-only below
    ...(supports.has('--size') ? ['--size', String(opts.limits.fileSizeMb * 1024 * 1024)] : []),
    '--tmpfs',
    '/dev/shm',
    ...(supports.has('--size') ? ['--size', String(opts.limits.fileSizeMb * 1024 * 1024)] : []),
    '--tmpfs',
    '/tmp',
    // no user namespace of its own inside (unshare -Ur made a root of it)
    ...(supports.has('--disable-userns') ? ['--disable-userns'] : []),
    '--die-with-parent',
    '--new-session',
    '--clearenv',
  ];
  return {
    kind: 'bwrap',
    processLimit,
    memoryLimit,
    limits: opts.limits,
    workspacePath: () => INSIDE_WORKSPACE,
    close() {
      cgroups?.close();
    },
    spawn(argv, o) {
      refuseUnstartable(argv, o.env);
      const env = { ...o.env, HOME: '/tmp', PWD: INSIDE_WORKSPACE, TMPDIR: '/tmp' };
      // what is bound is opened here and handed to bwrap open (fd 3 on): bwrap never follows the path again
      const fds: number[] = [];
      const bound = (p: string) => String(2 + fds.push(openBound(p)));
      // bubblewrap's options reach it through a pipe (--args), not its command line: the step's environment (a gate's
      // token, a step's secret) was in bwrap's argv, which every user of the host reads (ps, /proc/<pid>/cmdline)
      let options: string[];
      let command: string[];
      try {
        options = [
          ...fixed,
          ...(o.network ? [] : ['--unshare-net']),
          ...(o.binds ?? []).flatMap((b) => ['--bind-fd', bound(b), b]),
          ...(o.readOnlyBinds ?? []).flatMap((b) => ['--ro-bind-fd', bound(b), b]),
          ...(o.serviceBinds ?? []).flatMap((b) => ['--ro-bind', b, b]),
          o.readOnly ? '--ro-bind-fd' : '--bind-fd',
          bound(o.workspace),
          INSIDE_WORKSPACE,
          // once every mount point is made: the root (a tmpfs of no size) and /dev take no file of a step's
          ...(supports.has('--remount-ro') ? ['--remount-ro', '/dev', '--remount-ro', '/'] : []),
          '--chdir',
          INSIDE_WORKSPACE,
          ...Object.entries(env).flatMap(([k, v]) => ['--setenv', k, v]),
        ];
        command = [
          '--',
          opts.prlimit,
          ...prlimitArgs(opts.limits, { nproc: processLimit === 'rlimit', addressSpace: memoryLimit !== 'cgroup' }),
          '--',
          ...argv,
        ];
      } catch (err) {
        for (const fd of fds) fs.closeSync(fd);
        throw err;
      }
      const argsFd = 3 + fds.length;
      const args = ['--args', String(argsFd), ...command];
      const stdio: ('ignore' | 'pipe' | number)[] = ['ignore', 'pipe', 'pipe', ...fds, 'pipe'];
      let group: StepGroup | null = null;
      if (cgroups) {
        try {
          group = cgroups.make({ processes: opts.limits.processes, memoryBytes: opts.limits.memoryMb * 1024 * 1024 });
        } catch (err) {
          // the limits were there at start: no step runs without them
          for (const fd of fds) fs.closeSync(fd);
          opts.log.error({ err: (err as Error).message }, 'a step’s cgroups could not be made: the step is refused');
          throw new ToolError('sandbox-unavailable', 'the sandbox could not limit the step’s processes and memory; the operator is told in the log');
        }
      }
      // the first process joins the step's cgroups, then becomes bwrap: every process of the step is counted.
      // Its groups are inside the service's own (v1): where the service's limit is reached before the step's,
      // the kernel ends the step's processes first, never the service (the step cannot lower it back)
      const join = (procs: string[]) =>
        `{ echo 1000 > /proc/$$/oom_score_adj; } 2>/dev/null; ${procs.map((_, i) => `echo $$ > "$${i + 1}" && `).join('')}shift ${procs.length} && exec "$@"`;
      let child: ChildProcess;
      try {
        child = group
          ? spawn('/bin/sh', ['-c', join(group.procs), 'sandbox', ...group.procs, opts.bwrap, ...args], {
              env: {},
              // from /: the shell sets PWD, and bwrap (pid 1 inside, its environment readable there) keeps it
              cwd: '/',
              detached: true,
              stdio,
            })
          : spawn(opts.bwrap, args, { env: {}, cwd: '/', detached: true, stdio });
      } catch (err) {
        // not started (the arguments and environment together past what the kernel takes): its groups go with it
        group?.remove();
        throw startFailure(err);
      } finally {
        // the child has its own copies; bwrap closes them once bound, so the step never holds one
        for (const fd of fds) fs.closeSync(fd);
      }
      // read to its end by bwrap before it starts anything (a bwrap that died first makes the write fail: its exit says why)
      const optionsPipe = child.stdio[argsFd] as Writable;
      optionsPipe.on('error', () => undefined);
      optionsPipe.end(Buffer.from(options.map((o) => `${o}\0`).join('')));
      return {
        child,
        kill(signal) {
          killGroup(child.pid, signal);
          group?.kill(signal);
        },
        outOfMemory: () => group?.outOfMemory() ?? false,
        done() {
          group?.remove();
          group = null;
        },
      };
    },
  };
}

/**
 * Opens a folder (or file) a step binds, checked to be what its path named when it was checked: a real
 * path, so what the open reached must be at that very path. A folder of the workspace swapped since for
 * a link (to another tenant's folder, say) is refused, and bwrap binds the handle (`--bind-fd`).
 */
function openBound(p: string): number {
  let fd: number;
  try {
    fd = fs.openSync(p, fs.constants.O_RDONLY | fs.constants.O_NONBLOCK);
  } catch {
    throw new OutsideError('a folder of the workspace is no longer where the run was checked');
  }
  let real = '';
  try {
    real = fs.readlinkSync(`/proc/self/fd/${fd}`);
  } catch {
    // refused below
  }
  if (real !== path.resolve(p)) {
    fs.closeSync(fd);
    throw new OutsideError('a folder of the workspace was replaced by a link after the run was checked');
  }
  return fd;
}

/** No isolation: the process runs as the service's own user, in the workspace itself. */
/** The most one argument or environment entry of a process may be, its ending NUL included (Linux's MAX_ARG_STRLEN). */
const ARG_MAX_BYTES = 128 * 1024;
/** What the kernel gives a process's arguments and environment together (a quarter of an 8 MB stack), less room for the sandbox's own. */
const ARGV_ENV_MAX_BYTES = 2 * 1024 * 1024 - 16 * 1024;
const TOO_LARGE_TO_START = 'the step’s arguments and environment together are more than the kernel gives a process';

/**
 * A step the kernel would not start, refused before anything is made for it: a NUL byte (no argument or
 * environment entry can hold one), one argument or entry past ARG_MAX_BYTES, or all of them past
 * ARGV_ENV_MAX_BYTES. Said without the sandbox's own
 * arguments (Node named the step's command `args[117]` of bubblewrap's).
 */
function refuseUnstartable(argv: string[], env: Record<string, string>): void {
  const entries = Object.entries(env);
  if (argv.some((a) => a.includes('\0')) || entries.some(([k, v]) => k.includes('\0') || v.includes('\0')))
    throw new ToolError('invalid-args', 'the step’s command or environment holds a NUL byte, which no process can be given');
  const over =
    argv.find((a) => Buffer.byteLength(a) >= ARG_MAX_BYTES) ?? entries.find(([k, v]) => Buffer.byteLength(k) + Buffer.byteLength(v) + 1 >= ARG_MAX_BYTES)?.[0];
  if (over !== undefined)
    throw new ToolError(
      'invalid-args',
      `one argument or environment entry of the step is over ${ARG_MAX_BYTES / 1024} KB, the most the kernel gives a process: put a longer script in a file of the workspace and run that`,
    );
  // together (each string, its NUL and its pointer): past the kernel's bound, the step's command could not be started
  // (bubblewrap's own start no longer meets it: the environment reaches bubblewrap through a pipe)
  const total = argv.reduce((n, a) => n + Buffer.byteLength(a) + 9, 0) + entries.reduce((n, [k, v]) => n + Buffer.byteLength(k) + Buffer.byteLength(v) + 10, 0);
  if (total >= ARGV_ENV_MAX_BYTES) throw new ToolError('invalid-args', TOO_LARGE_TO_START);
}

/** A process the kernel did not start, said as the step's fault where it is (E2BIG: its arguments and environment together too large). */
function startFailure(err: unknown): Error {
  const code = (err as NodeJS.ErrnoException)?.code;
  if (code === 'E2BIG') return new ToolError('invalid-args', TOO_LARGE_TO_START);
  if (code === 'ERR_INVALID_ARG_VALUE' || code === 'ERR_INVALID_ARG_TYPE')
    return new ToolError('invalid-args', 'the step’s command or environment cannot be given to a process');
  return err as Error;
}

/**
 * The process groups of steps started with no sandbox that may still live (a step's daemon outlives its step):
 * killed when this process exits, however it exits. bwrap's --die-with-parent does that for a sandboxed step; a
 * step with none, its group of its own, lived on unowned after a worker's exit, beside its job's next run.
 */
const unsandboxedGroups = new Set<number>();
let killedAtExit = false;

/** Forgets the groups that are gone (a group of none answers ESRCH to signal 0). */
function forgetGoneGroups(): void {
  for (const pid of unsandboxedGroups)
    try {
      process.kill(-pid, 0);
    } catch {
      unsandboxedGroups.delete(pid);
    }
}

export function noSandbox(): Sandbox {
  if (!killedAtExit) {
    killedAtExit = true;
    process.on('exit', () => {
      for (const pid of unsandboxedGroups) killGroup(pid, 'SIGKILL');
    });
  }
  return {
    kind: 'none',
    processLimit: 'none',
    memoryLimit: 'none',
    limits: null,
    workspacePath: (workspace) => workspace,
    close() {},
    spawn(argv, o) {
      refuseUnstartable(argv, o.env);
      let child: ChildProcess;
      try {
        child = spawn(argv[0]!, argv.slice(1), { cwd: o.workspace, env: o.env, detached: true, stdio: ['ignore', 'pipe', 'pipe'] });
      } catch (err) {
        throw startFailure(err);
      }
      if (child.pid !== undefined) unsandboxedGroups.add(child.pid);
      return { child, kill: (signal) => killGroup(child.pid, signal), outOfMemory: () => false, done: forgetGoneGroups };
    },
  };
}

/**
 * The sandbox of this process: `bwrap` when asked for or (auto) when it is installed, else none.
 * Throws when bwrap is asked for and missing.
 */
export function openSandbox(opts: {
  mode: 'bwrap' | 'none' | 'auto';
  limits: SandboxLimits;
  prefix: string;
  pathVar: string | undefined;
  log: Logger;
  /** the service's own folders (real paths), never to be seen by a step even where a system folder holds them */
  hidden?: string[];
}): Sandbox {
  if (opts.mode === 'none') return noSandbox();
  const bwrap = which('bwrap', opts.pathVar);
  const prlimit = which('prlimit', opts.pathVar);
  if (!bwrap || !prlimit) {
    if (opts.mode === 'bwrap')
      throw new Error(`SERVICE_SANDBOX=bwrap, but ${bwrap ? 'prlimit' : 'bwrap'} is not installed (apt-get install bubblewrap util-linux)`);
    return noSandbox();
  }
  return bwrapSandbox({ bwrap, prlimit, limits: opts.limits, prefix: opts.prefix, log: opts.log, hidden: opts.hidden });
}
