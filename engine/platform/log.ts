// pino, with every secret-bearing field redacted wherever it appears. Request bodies are never logged.
import { pino, type Logger } from 'pino';

export type { Logger };

export const REDACT_PATHS = [
  'req.headers.authorization',
  'req.headers["x-api-key"]',
  'req.headers.cookie',
  'req.headers["x-hub-signature-256"]',
  'req.headers["x-chat-signature"]',
  'req.headers["x-slack-signature"]',
  'req.headers["tracker-signature"]',
  'req.headers["linear-signature"]',
  'req.headers["x-pager-signature"]',
  'req.headers["x-pagerduty-signature"]',
  'req.headers["x-service-signature"]',
  'res.headers["set-cookie"]',
  'key',
  'api_key',
  'secret',
  'secrets',
  'password',
  '*.key',
  '*.api_key',
  '*.secret',
  '*.secrets',
  '*.password',
  // a URL that did not parse (TypeError: Invalid URL) carries it whole, query and all
  'err.input',
  // an ioredis reply error carries its command: a refused AUTH its password
  'err.command.args',
  '*.err.command.args',
];

/**
 * A logger writing JSON lines (to `destination`, else stdout). `pretty` (a person at a terminal, outside
 * production) sends the same lines through pino-pretty as a transport: coloured, one readable line each.
 */
export function createLogger(level: string, destination?: pino.DestinationStream | { pretty: true }): Logger {
  const options: pino.LoggerOptions = {
    level,
    base: { pid: process.pid },
    redact: { paths: REDACT_PATHS, censor: '[redacted]' },
    timestamp: pino.stdTimeFunctions.isoTime,
  };
  if (destination && 'pretty' in destination)
    return pino(options, pino.transport({ target: 'pino-pretty', options: { translateTime: 'SYS:HH:MM:ss.l', ignore: 'pid,hostname', singleLine: true } }));
  return pino(options, destination);
}

/** Where a command's log lines go: stderr, so that what it prints (a JSON document) stays whole on stdout. */
export const stderrDestination = (): pino.DestinationStream => pino.destination(2);

/** Readable logs for a person: stdout is a terminal and this is not production. */
export const wantsPrettyLogs = (isProduction: boolean, stdout: { isTTY?: boolean } = process.stdout): boolean => !isProduction && Boolean(stdout.isTTY);
