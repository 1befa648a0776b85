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
];

export function createLogger(level: string, destination?: pino.DestinationStream): Logger {
  return pino(
    {
      level,
      base: { pid: process.pid },
      redact: { paths: REDACT_PATHS, censor: '[redacted]' },
      timestamp: pino.stdTimeFunctions.isoTime,
    },
    destination,
  );
}
