// The one place errors become HTTP: RFC 9457 problem+json with a stable `code` and the request id.
// Anything we do not recognise is a 500 that shows no internals.
import type { ErrorRequestHandler, Request } from 'express';
import { AppError, ERROR_STATUS, ProblemsError, ServiceUnavailableError, type ErrorCode, type FieldError } from '../engine/platform/index.js';

export type Problem = {
  type: string;
  title: string;
  status: number;
  code: ErrorCode;
  detail?: string;
  instance?: string;
  request_id: string;
  errors?: FieldError[];
  /** how many errors were found past the MAX_LISTED_ERRORS listed */
  errors_omitted?: number;
};

/**
 * The most errors a problem lists; the rest are counted. A body with thousands of bad items is refused as
 * well by its first errors, and its answer stays small (50,000 were 4.4 MB).
 */
export const MAX_LISTED_ERRORS = 50;

const TITLES: Record<number, string> = {
  400: 'Bad Request',
  401: 'Unauthorized',
  403: 'Forbidden',
  404: 'Not Found',
  405: 'Method Not Allowed',
  409: 'Conflict',
  413: 'Payload Too Large',
  415: 'Unsupported Media Type',
  417: 'Expectation Failed',
  422: 'Unprocessable Content',
  429: 'Too Many Requests',
  500: 'Internal Server Error',
  502: 'Bad Gateway',
  503: 'Service Unavailable',
  504: 'Gateway Timeout',
};

/** The code of a 4xx that does not come from our own errors (the validator, body-parser). */
const CODE_OF_STATUS: Partial<Record<number, ErrorCode>> = {
  400: 'bad-request',
  401: 'unauthorized',
  404: 'not-found',
  405: 'method-not-allowed',
  409: 'conflict',
  413: 'payload-too-large',
  415: 'unsupported-media-type',
  429: 'rate-limited',
};

type HttpLikeError = Error & {
  status?: number;
  statusCode?: number;
  type?: string;
  errors?: { path?: string; message?: string }[];
  expose?: boolean;
};

/** Maps any error to the problem it shows. Pure: the caller writes it. */
export function toProblem(err: unknown, requestId: string, instance: string): Problem {
  const base = { request_id: requestId, instance };
  if (err instanceof AppError) {
    const status: number = ERROR_STATUS[err.code];
    return {
      type: `/problems/${err.code}`,
      title: TITLES[status] ?? 'Error',
      status,
      code: err.code,
      detail: status === 500 ? 'The service failed to handle this request.' : detailOf(err),
      ...(err instanceof ProblemsError ? listed(err.errors) : {}),
      ...base,
    };
  }
  const e = err as HttpLikeError;
  const status = e?.status ?? e?.statusCode;
  // body-parser: malformed JSON, too large, bad charset
  if (e?.type === 'entity.parse.failed') {
    // strict parsing refuses a bare value (null, "x", 1) too: that is JSON, only not an object
    const text = (e as { body?: unknown }).body;
    return problem(400, 'malformed-json', typeof text === 'string' && isJson(text) ? 'The body must be a JSON object.' : 'The body is not valid JSON.', base);
  }
  if (e?.type === 'entity.too.large') {
    const limit = (e as { limit?: number }).limit;
    return problem(413, 'payload-too-large', `The body is over the ${limit ? `${Math.round(limit / 1024 / 1024)} MB ` : ''}limit.`, base);
  }
  if (e?.type === 'charset.unsupported' || e?.type === 'encoding.unsupported') {
    return problem(415, 'unsupported-media-type', e.message, base);
  }
  // express-openapi-validator and other http-errors shaped errors
  if (typeof status === 'number' && status >= 400 && status < 500) {
    const errors = Array.isArray(e.errors)
      ? uniqueErrors(e.errors.map((i) => ({ path: normalisePath(i.path ?? ''), message: i.message ?? 'invalid' })))
      : undefined;
    const code = CODE_OF_STATUS[status] ?? 'bad-request';
    if (!errors?.length) return problem(status, code, e.message, base);
    const shown = listed(errors);
    const more = shown.errors_omitted ? `; and ${shown.errors_omitted} more` : '';
    return { ...problem(status, code, shown.errors.map((i) => `${i.path} ${i.message}`).join('; ') + more, base), ...shown };
  }
  return problem(500, 'internal', 'The service failed to handle this request.', base);
}

function problem(status: number, code: ErrorCode, detail: string, base: { request_id: string; instance: string }): Problem {
  return { type: `/problems/${code}`, title: TITLES[status] ?? 'Error', status, code, detail, ...base };
}

/**
 * An error's detail: its message, or for one of more than MAX_LISTED_ERRORS errors the listed ones and a count of
 * the rest, as the validator's (a DAG of 1,000 tasks whose every dependency was wrong was a 2.3 MB answer).
 */
function detailOf(err: AppError): string {
  if (!(err instanceof ProblemsError) || err.errors.length <= MAX_LISTED_ERRORS) return err.message;
  const shown = listed(err.errors);
  return `${shown.errors.map((i) => `${i.path} ${i.message}`).join('; ')}; and ${shown.errors_omitted} more`;
}

/** The first MAX_LISTED_ERRORS errors, and how many more there were when there were more. */
function listed(errors: FieldError[]): { errors: FieldError[]; errors_omitted?: number } {
  if (errors.length <= MAX_LISTED_ERRORS) return { errors };
  return { errors: errors.slice(0, MAX_LISTED_ERRORS), errors_omitted: errors.length - MAX_LISTED_ERRORS };
}

/** Errors that only say a wrapper (if/then/else, oneOf) did not match: noise when a precise error is there too. */
const WRAPPER = /^must match ("then"|"else") schema$|^must match exactly one schema in oneOf$/;

function uniqueErrors(all: FieldError[]): FieldError[] {
  const precise = all.filter((e) => !WRAPPER.test(e.message));
  const errors = precise.length ? precise : all;
  const seen = new Set<string>();
  return errors.filter((e) => {
    const key = `${e.path}\u0000${e.message}`;
    return seen.has(key) ? false : (seen.add(key), true);
  });
}

/** express-openapi-validator writes `.body.name` or `/body/name`; we always answer JSON pointers. */
function normalisePath(p: string): string {
  if (!p) return '/';
  return p.startsWith('/') ? p : `/${p.replace(/^\./, '').replace(/\./g, '/')}`;
}

export function requestIdOf(req: Request): string {
  return String((req as Request & { id?: unknown }).id ?? '');
}

export function problemHandler(): ErrorRequestHandler {
  return (caught, req, res, _next) => {
    // the client went away (an upload cut off, a tab closed): what stopped is no failure of the service
    if (res.destroyed || req.socket.destroyed) {
      req.log?.info({ err: (caught as Error)?.message }, 'request ended: the client went away');
      return;
    }
    const err = storeUnavailable(caught) ?? caught;
    const p = toProblem(err, requestIdOf(req), req.originalUrl.split('?')[0] ?? '/');
    // an operator's missing setting (no transcription provider) is a refusal to log as such, not a failure with its stack
    if (p.status >= 500 && !(err instanceof AppError && err.code.endsWith('-not-configured'))) req.log?.error({ err }, 'request failed');
    else req.log?.info({ code: p.code, status: p.status }, 'request refused');
    if (res.headersSent) {
      res.end();
      return;
    }
    if (p.status === 401 && !res.hasHeader('WWW-Authenticate')) res.setHeader('WWW-Authenticate', 'Bearer realm="api"');
    const retryAfter = (err as { retryAfterSeconds?: unknown }).retryAfterSeconds;
    if (err instanceof AppError && typeof retryAfter === 'number') res.setHeader('Retry-After', String(retryAfter));
    const allow = (err as { headers?: Record<string, string> }).headers?.Allow;
    if (p.status === 405 && allow) res.setHeader('Allow', allow);
    res.status(p.status).type('application/problem+json').send(JSON.stringify(p));
  };
}

function isJson(text: string): boolean {
  try {
    JSON.parse(text);
    return true;
  } catch {
    return false;
  }
}

/** SQLite's answers that pass with time (a full disk, a file it cannot write now, a lock held too long). */
const PASSING_STORE_FAILURES = /^SQLITE_(FULL|IOERR|READONLY|BUSY|CANTOPEN)/;

/**
 * A store that cannot write now is the service unavailable (503, Retry-After), not a fault of the request
 * or a bug (500): the client is told to try again, as a run's creation already tells it.
 */
export function storeUnavailable(err: unknown): ServiceUnavailableError | null {
  const code = (err as { code?: unknown } | null)?.code;
  if (typeof code !== 'string' || !PASSING_STORE_FAILURES.test(code)) return null;
  return new ServiceUnavailableError(`the store cannot write now (${code}); retry shortly`, 5, { cause: err });
}
