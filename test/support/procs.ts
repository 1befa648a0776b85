// The service's processes as the Procfile starts them (their built entry points), for the tests of how they
// start, print, answer and stop: each in its own process group, killed with it after each test.
import { spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { builtEntry } from './built.js';
import { deleteRedisPrefix, KEYS, testRedisUrl, uniquePrefix } from './harness.js';

export type Proc = { child: ChildProcess; out: () => string; exited: Promise<{ code: number | null; signal: NodeJS.Signals | null; ms: number }> };

/** A process of the service as the Procfile starts it: its built entry point (`api/main.ts`: dist/api/main.js). */
export const start = (entry: string, env: Record<string, string>): Proc => spawnProc(process.execPath, [builtEntry(entry)], env);

export function spawnProc(command: string, args: string[], env: Record<string, string>): Proc {
  const started = Date.now();
  // detached: its own process group, so cleanup can kill the whole group
  const child = spawn(command, args, { env: { ...process.env, ...env }, detached: true, stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  child.stdout!.on('data', (d) => (out += d));
  child.stderr!.on('data', (d) => (out += d));
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null; ms: number }>((resolve) =>
    child.on('exit', (code, signal) => resolve({ code, signal, ms: Date.now() - started })),
  );
  return { child, out: () => out, exited };
}

export async function waitFor(p: Proc, pattern: RegExp, ms = 30_000): Promise<RegExpMatchArray> {
  const until = Date.now() + ms;
  for (;;) {
    const m = p.out().match(pattern);
    if (m) return m;
    if (Date.now() > until || p.child.exitCode !== null) throw new Error(`no ${pattern} in output:\n${p.out()}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

/**
 * Each test's data dir and queue prefix, and the processes it started (pushed on `procs`): killed after it, with
 * its Redis keys, its data dir and the workspace root a test gave beside it (`<data dir>-ws`, which the service made).
 */
export function serviceProcesses(): { procs: Proc[]; dataDir: () => string; env: () => Record<string, string> } {
  const procs: Proc[] = [];
  let dataDir = '';
  let prefix = '';
  beforeEach(async () => {
    dataDir = await fs.mkdtemp(path.join(os.tmpdir(), 'svc-proc-'));
    prefix = uniquePrefix();
  });
  afterEach(async () => {
    for (const p of procs.splice(0)) {
      try {
        process.kill(-p.child.pid!, 'SIGKILL');
      } catch {
        // already gone
      }
    }
    await deleteRedisPrefix(prefix);
    for (const dir of [dataDir, `${dataDir}-ws`]) await fs.rm(dir, { recursive: true, force: true });
  });
  const env = () => ({
    REDIS_URL: testRedisUrl(),
    SERVICE_QUEUE_PREFIX: prefix,
    SERVICE_DATA_DIR: dataDir,
    PORT: '0',
    SERVICE_API_KEYS: `acme:${KEYS.a}`,
    SERVICE_ADMIN_KEYS: KEYS.admin,
    LOG_LEVEL: 'info',
  });
  return { procs, dataDir: () => dataDir, env };
}
