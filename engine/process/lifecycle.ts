// How an entry point lives and dies: config and start-up errors print one clear line and exit 1;
// SIGTERM/SIGINT stop taking work and close everything within the grace period, then exit.
import { ConfigError, loadConfig, type Config } from '../../config/env.js';
import { createLogger, type Logger, RedisUnreachableError, wantsPrettyLogs } from '../platform/index.js';
import { LocalRedisError } from './local-redis.js';

/** A signal repeated within this long of the first is its copy, not a second request to stop. */
const REPEATED_SIGNAL_MS = 1000;

/**
 * A port a process cannot listen on is its setting's fault (another process has it, or it needs privileges):
 * said in one line naming the variable, as every other bad setting is, not as a stack trace.
 */
export function listenError(err: NodeJS.ErrnoException, variable: string, port: number): Error {
  if (err.code === 'EADDRINUSE') return new ConfigError([`${variable}: port ${port} is in use by another process`]);
  if (err.code === 'EACCES') return new ConfigError([`${variable}: port ${port} needs privileges this process does not have`]);
  return err;
}

/** close(deadline): the end of the grace period (epoch ms), when the process exits whatever is unfinished. */
export type Stoppable = { close(deadline: number): Promise<void> };

/**
 * Runs an entry point: `start` gets a signal aborted when the process is asked to stop while it starts (a deploy,
 * a scale-in), so that it takes no work it would give back at once.
 */
export async function runMain(name: string, start: (config: Config, log: Logger, stopping: AbortSignal) => Promise<Stoppable>): Promise<void> {
  let config: Config;
  try {
    config = loadConfig();
  } catch (err) {
    if (err instanceof ConfigError) {
      process.stderr.write(`${name}: ${err.message}\n`);
      process.exit(1);
    }
    throw err;
  }
  const log = createLogger(config.logLevel, wantsPrettyLogs(config.isProduction) ? { pretty: true } : undefined).child({ process: name });
  let running: Stoppable | undefined;
  let stopping: { signal: string; at: number; deadline: number } | null = null;
  const asked = new AbortController();
  /** The graceful stop, once the process has started: within the grace period that began with the signal. */
  const shutdown = async (deadline: number) => {
    try {
      await running!.close(deadline);
      log.info('stopped cleanly');
      process.exit(0);
    } catch (err) {
      log.error({ err }, 'shutdown failed');
      process.exit(1);
    }
  };
  const stop = (signal: string) => {
    if (stopping) {
      // the same signal again at once is the first one's copy (a wrapper such as npm or tsx forwards to its child
      // the signal its process group got as well): only a later one, or another, is someone asking again
      if (signal === stopping.signal && Date.now() - stopping.at < REPEATED_SIGNAL_MS) return;
      log.warn({ signal }, 'second signal: exiting now');
      process.exit(1);
    }
    const graceMs = config.shutdownGraceSeconds * 1000;
    stopping = { signal, at: Date.now(), deadline: Date.now() + graceMs };
    asked.abort();
    log.info({ signal, grace_seconds: config.shutdownGraceSeconds, starting: !running }, 'shutting down');
    setTimeout(() => {
      log.error('grace period over: exiting with work unfinished');
      process.exit(1);
    }, graceMs).unref();
    // a signal while the process starts (a deploy, a scale-in) stops it once it has: what it took by then (a
    // worker's first jobs) goes back to the queue as on any stop, rather than dying with Node's default action
    if (running) void shutdown(stopping.deadline);
  };
  // on, not once: a second signal must reach stop (exit 1 at once, the exit handlers run: a private Redis is stopped), not Node's default kill
  process.on('SIGTERM', () => stop('SIGTERM'));
  process.on('SIGINT', () => stop('SIGINT'));
  try {
    running = await start(config, log, asked.signal);
  } catch (err) {
    if (err instanceof RedisUnreachableError || err instanceof LocalRedisError || err instanceof ConfigError) process.stderr.write(`${name}: ${err.message}\n`);
    else log.fatal({ err }, 'start-up failed');
    process.exit(1);
  }
  if (stopping) await shutdown((stopping as { deadline: number }).deadline);
}
