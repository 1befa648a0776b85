// Runs one command to its end in the sandbox: its own process group (an abort or a timeout kills it
// and everything it started), the last bytes of its output kept, output streamed as it comes.
import os from 'node:os';
import { StringDecoder } from 'node:string_decoder';
import type { Sandbox, SandboxSpawnOptions } from './sandbox.js';
import { TailBuffer } from './tool.js';

const KILL_GRACE_MS = 500;

export type ProcessResult = {
  exit_code: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
  truncated: boolean;
  /** the timeout ended it */
  timed_out: boolean;
  /** the signal ended it */
  aborted: boolean;
  /** the kernel ended a process of it for its CPU seconds (SIGXCPU: the shell, or bwrap for the process it ran, exits 128 + 24) */
  cpu_exceeded: boolean;
  /** the kernel ended a process of it for the step's memory over its limit (a memory cgroup's) */
  out_of_memory: boolean;
  duration_ms: number;
};

export async function runProcess(
  sandbox: Sandbox,
  argv: string[],
  opts: SandboxSpawnOptions & {
    signal?: AbortSignal;
    timeoutMs?: number;
    maxBytes: number;
    onOutput?: (stream: 'stdout' | 'stderr', text: string) => void;
  },
): Promise<ProcessResult> {
  const started = performance.now();
  const proc = sandbox.spawn(argv, opts);
  const { child } = proc;
  const stdout = new TailBuffer(opts.maxBytes);
  const stderr = new TailBuffer(opts.maxBytes);
  // a character split between two chunks of a pipe streams whole, with the later chunk
  const decoders = { stdout: new StringDecoder('utf8'), stderr: new StringDecoder('utf8') };
  const stream = (name: 'stdout' | 'stderr', tail: TailBuffer) =>
    child[name]!.on('data', (d: Buffer) => {
      tail.push(d);
      const text = decoders[name].write(d);
      if (text) opts.onOutput?.(name, text);
    });
  stream('stdout', stdout);
  stream('stderr', stderr);
  let killTimer: NodeJS.Timeout | undefined;
  let timedOut = false;
  const stop = () => {
    if (child.pid === undefined || killTimer) return;
    proc.kill('SIGTERM');
    killTimer = setTimeout(() => proc.kill('SIGKILL'), KILL_GRACE_MS);
  };
  // once the command's own process has exited, what it left behind goes with it: a process still
  // holding its output open would otherwise keep the step waiting (one that bwrap's stop left orphaned
  // included); a stopped step whose output stays open anyway is ended after the grace
  let unheld: NodeJS.Timeout | undefined;
  child.once('exit', () => {
    proc.kill('SIGKILL');
    if (killTimer)
      unheld = setTimeout(() => {
        child.stdout?.destroy();
        child.stderr?.destroy();
      }, KILL_GRACE_MS);
  });
  const timeout = opts.timeoutMs
    ? setTimeout(() => {
        timedOut = true;
        stop();
      }, opts.timeoutMs)
    : undefined;
  opts.signal?.addEventListener('abort', stop, { once: true });
  if (opts.signal?.aborted) stop();
  try {
    const { code, signal } = await new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => {
      // a program that cannot be started (outside a sandbox: it does not exist) ends as a shell's would: 127
      child.once('error', (err: NodeJS.ErrnoException) => {
        stderr.push(Buffer.from(`${argv[0]}: ${err.code === 'ENOENT' ? 'not found' : err.message}\n`));
        resolve({ code: 127, signal: null });
      });
      child.once('close', (c: number | null, s: NodeJS.Signals | null) => resolve({ code: c, signal: s }));
    });
    // what the output ended with that is not a whole character
    for (const stream of ['stdout', 'stderr'] as const) {
      const rest = decoders[stream].end();
      if (rest) opts.onOutput?.(stream, rest);
    }
    return {
      exit_code: code,
      signal,
      stdout: stdout.text(),
      stderr: stderr.text(),
      truncated: stdout.truncated || stderr.truncated,
      timed_out: timedOut,
      aborted: Boolean(opts.signal?.aborted),
      cpu_exceeded: Boolean(sandbox.limits) && (signal === 'SIGXCPU' || code === 128 + os.constants.signals.SIGXCPU),
      out_of_memory: proc.outOfMemory(),
      duration_ms: Math.round(performance.now() - started),
    };
  } finally {
    opts.signal?.removeEventListener('abort', stop);
    clearTimeout(timeout);
    clearTimeout(killTimer);
    clearTimeout(unheld);
    proc.done();
  }
}
