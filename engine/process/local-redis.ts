// A private redis-server for `npm start` and `npm test` on a machine where no Redis answers, so that one
// command works on a fresh machine. It runs as a child in its own process group, on a free loopback
// port, with its data (AOF) under the data dir, and stops with its owner; one left running by an owner
// killed with SIGKILL is found through its pidfile and stopped before the next one starts.
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import fs from 'node:fs/promises';
import net from 'node:net';
import path from 'node:path';
import type { Config } from '../../config/env.js';
import type { Logger } from '../platform/index.js';

export const DEFAULT_REDIS_HOST = '127.0.0.1';
export const DEFAULT_REDIS_PORT = 6379;

const INSTALL_HINT =
  `no Redis answers on ${DEFAULT_REDIS_HOST}:${DEFAULT_REDIS_PORT} and redis-server is not installed: ` +
  'apt-get install redis-server (Debian/Ubuntu) or brew install redis (macOS), or set REDIS_URL';
/** data in an append-only file (no RDB snapshots), in the foreground as the owner's child, loopback clients only */
const SETTINGS = ['--appendonly', 'yes', '--save', '', '--daemonize', 'no', '--protected-mode', 'yes'];
const READY_TIMEOUT_MS = 10_000;
const STOP_TIMEOUT_MS = 5_000;
const POLL_MS = 50;

/** Why the private redis-server could not start: one line, printed as it is. */
export class LocalRedisError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'LocalRedisError';
  }
}

export type LocalRedis = {
  url: string;
  port: number;
  pid: number;
  /** its own folder, <dataDir>/redis: the AOF and the pidfile */
  dir: string;
  /** SIGTERM (redis-server flushes its AOF and exits), SIGKILL if it has not exited within 5 s */
  stop(): Promise<void>;
};

export type LocalRedisOptions = { dataDir: string; log?: Logger; /** the binary; default redis-server */ redisServer?: string };

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** Something accepts a TCP connection at host:port within `timeoutMs`. */
export function answersAt(host: string, port: number, timeoutMs: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = net.connect({ host, port, timeout: timeoutMs });
    const done = (ok: boolean) => {
      socket.destroy();
      resolve(ok);
    };
    socket.once('connect', () => done(true));
    socket.once('timeout', () => done(false));
    socket.once('error', () => done(false));
  });
}

/**
 * The config to run with, and the private redis-server started for it if any: one starts only outside
 * production, when REDIS_URL was not given and nothing answers on the default address.
 */
export async function ensureRedis(
  config: Config,
  opts: { log?: Logger; redisServer?: string; defaultPort?: number } = {},
): Promise<{ config: Config; local: LocalRedis | null }> {
  if (config.redisUrlSet || config.isProduction) return { config, local: null };
  if (await answersAt(DEFAULT_REDIS_HOST, opts.defaultPort ?? DEFAULT_REDIS_PORT, 1000)) return { config, local: null };
  const local = await startLocalRedis({ dataDir: config.dataDir, log: opts.log, redisServer: opts.redisServer });
  return { config: { ...config, redisUrl: local.url }, local };
}

export async function startLocalRedis(opts: LocalRedisOptions): Promise<LocalRedis> {
  const dir = path.join(opts.dataDir, 'redis');
  const pidfile = path.join(dir, 'redis.pid');
  await fs.mkdir(dir, { recursive: true });
  await stopLeftover(dir, pidfile, opts.log);
  const port = await freeLoopbackPort();
  const child = spawn(
    opts.redisServer ?? 'redis-server',
    ['--port', String(port), '--bind', DEFAULT_REDIS_HOST, '--dir', dir, '--pidfile', pidfile, ...SETTINGS],
    { detached: true, stdio: ['ignore', 'pipe', 'pipe'] },
  );
  const output = tailOf(child);
  let ended: string | null = null;
  child.once('error', (err: NodeJS.ErrnoException) => (ended ??= err.code === 'ENOENT' ? INSTALL_HINT : `redis-server could not start: ${err.message}`));
  // 'close', not 'exit': by then everything it wrote has been read
  child.once('close', (code, sig) => (ended ??= `redis-server exited (${sig ?? `code ${code}`}) before answering on port ${port}: ${output() || 'no output'}`));
  // the owner may exit without stop() (a second signal, the grace period over): the child goes with it
  const killOnExit = () => child.kill('SIGTERM');
  process.once('exit', killOnExit);
  const stop = async () => {
    process.off('exit', killOnExit);
    await stopChild(child);
  };

  const failure = await untilPong(port, () => ended);
  if (failure) {
    await stop();
    throw new LocalRedisError(failure);
  }
  const url = `redis://${DEFAULT_REDIS_HOST}:${port}`;
  opts.log?.info({ url, dir, pid: child.pid }, 'started a private redis-server');
  return { url, port, pid: child.pid!, dir, stop };
}

/** The last few lines redis-server wrote (it logs to stdout; bad arguments go to stderr), read all along so its pipes never fill. */
function tailOf(child: ChildProcess): () => string {
  let text = '';
  const keep = (chunk: Buffer) => {
    text = (text + chunk.toString('utf8')).slice(-2000);
  };
  child.stdout?.on('data', keep);
  child.stderr?.on('data', keep);
  return () =>
    text
      .split('\n')
      .map((l) => l.trim())
      .filter(Boolean)
      .slice(-3)
      .join(' | ');
}

/** '' once redis-server answers PING with +PONG (not -LOADING); else why not: it ended, or 10 s passed. */
async function untilPong(port: number, ended: () => string | null): Promise<string> {
  for (const deadline = Date.now() + READY_TIMEOUT_MS; Date.now() < deadline; await sleep(POLL_MS)) {
    const reason = ended();
    if (reason) return reason;
    if (await pongs(port)) return '';
  }
  return `redis-server on port ${port} did not answer PING within ${READY_TIMEOUT_MS / 1000} s`;
}

function pongs(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = net.connect({ host: DEFAULT_REDIS_HOST, port, timeout: 1000 });
    const done = (ok: boolean) => {
      socket.destroy();
      resolve(ok);
    };
    socket.once('connect', () => socket.write('PING\r\n'));
    socket.once('data', (data) => done(data.toString().startsWith('+PONG')));
    socket.once('timeout', () => done(false));
    socket.once('error', () => done(false));
  });
}

async function stopChild(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null || child.pid === undefined) return;
  const exited = new Promise((resolve) => child.once('exit', resolve));
  child.kill('SIGTERM');
  const timer = setTimeout(() => child.kill('SIGKILL'), STOP_TIMEOUT_MS);
  await exited;
  clearTimeout(timer);
}

/** Stops the redis-server an earlier owner left running on this dir (killed with SIGKILL): its AOF keeps the data. */
async function stopLeftover(dir: string, pidfile: string, log: Logger | undefined): Promise<void> {
  const pid = Number((await fs.readFile(pidfile, 'utf8').catch(() => '')).trim());
  const realDir = await fs.realpath(dir);
  if (!Number.isInteger(pid) || pid <= 0 || !(await isRedisServerIn(pid, realDir))) return;
  log?.warn({ pid }, 'stopping the private redis-server an earlier start left running');
  signal(pid, 'SIGTERM');
  for (const deadline = Date.now() + STOP_TIMEOUT_MS; Date.now() < deadline; await sleep(POLL_MS)) {
    if (!(await isRedisServerIn(pid, realDir))) return;
  }
  signal(pid, 'SIGKILL');
}

/**
 * The process `pid` is alive and is a redis-server working in `dir` (it chdirs to its --dir), so a pid
 * reused by someone else's process is never signalled. Without /proc (macOS), its command must do.
 */
async function isRedisServerIn(pid: number, dir: string): Promise<boolean> {
  if (!(await fs.stat('/proc/self').catch(() => null))) {
    return (spawnSync('ps', ['-p', String(pid), '-o', 'command='], { encoding: 'utf8' }).stdout ?? '').includes('redis-server');
  }
  // a zombie has an empty command line and no cwd; another user's process answers EACCES
  const [command, cwd] = await Promise.all([fs.readFile(`/proc/${pid}/cmdline`, 'utf8').catch(() => ''), fs.readlink(`/proc/${pid}/cwd`).catch(() => '')]);
  return command.includes('redis-server') && cwd === dir;
}

function signal(pid: number, name: NodeJS.Signals): void {
  try {
    process.kill(pid, name);
  } catch {
    // gone already
  }
}

function freeLoopbackPort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.once('error', reject);
    server.listen(0, DEFAULT_REDIS_HOST, () => {
      const { port } = server.address() as net.AddressInfo;
      server.close(() => resolve(port));
    });
  });
}
