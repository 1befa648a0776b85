#!/usr/bin/env node
// automation-service: the command-line tool for CI and operators (the commands are in program.ts). Every
// error ends in one line on stderr and the exit code CI scripts rely on.
import { CommanderError } from 'commander';
import { ConfigError } from '../config/env.js';
import { ApiError, CliError, EXIT, UsageError } from './client.js';
import { visibleLines } from './output.js';
import { buildProgram } from './program.js';

// a reader that went away (`runs list | head`, `gates verify ... | true`) is not the command's failure: what is
// left to print goes nowhere, and the command ends with its own exit code. Unhandled, the pipe's EPIPE ended
// it with a stack trace and 1, which says "failed" (a pack that verifies read as a bad one under pipefail)
for (const stream of [process.stdout, process.stderr])
  stream.on('error', (err: NodeJS.ErrnoException) => {
    if (err.code !== 'EPIPE' && err.code !== 'ERR_STREAM_DESTROYED') throw err;
  });

// the one place an error's message is printed: whatever of it the server (or a file) wrote is shown, never obeyed
// by the terminal, whichever error carried it
const fail = (message: string, exitCode: number): never => {
  process.stderr.write(`automation-service: ${visibleLines(message)}\n`);
  process.exit(exitCode);
};

try {
  await buildProgram().parseAsync(process.argv);
} catch (err) {
  if (err instanceof CommanderError) process.exit(err.exitCode === 0 ? 0 : EXIT.usage);
  if (err instanceof CliError) {
    if (err.exitCode === EXIT.usage && !(err instanceof ApiError)) fail(`${err.message}\n(automation-service <command> --help shows the usage)`, err.exitCode);
    fail(err.message, err.exitCode);
  }
  // what the engine refused in a local command (no such key, an expiry in the past, a gate set that is not
  // valid) is the caller's to correct, not a service away: a retry would be refused the same way. Known by
  // the engine's errors' own `retryable` (the engine's platform is not loaded for this: client commands skip it)
  if (err instanceof ConfigError || err instanceof UsageError || (err instanceof Error && (err as { retryable?: unknown }).retryable === false)) {
    fail((err as Error).message, EXIT.usage);
  }
  // anything else is not the run's failure (1): an answer the tool could not read, or its own fault
  fail(`could not complete the command: ${(err as Error).message ?? String(err)}`, EXIT.unavailable);
}
