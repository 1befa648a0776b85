// The API's request bodies, read before its routes: JSON in UTF-8 (RFC 8259 §8.1) within its limits,
// checked from its bytes before it is parsed; a body of no type only where the spec takes raw bytes. What is
// checked is what is parsed: body-parser would decode any other utf-* charset after the checks had passed.
import type { IncomingMessage } from 'node:http';
import express, { type NextFunction, type Request, type RequestHandler, type Response } from 'express';
import { bulkyJson, MAX_JSON_VALUES, unsafeJson, UnsupportedMediaTypeError, ValidationError } from '../engine/platform/index.js';
import { refuseDeclaredOver } from './body-limit.js';
import { pathPattern, type OpenApiDocument } from './spec.js';

export const BODY_LIMIT_BYTES = 1024 * 1024;
/**
 * The most items of one list in a JSON body: the spec's longest list (a DAG's tasks). With the values'
 * limit it bounds the validator's work on a body whose every item is wrong, which grows with the number of
 * bad items of a list times the errors before them (Ajv copies its error list for each): 50,000 took 9 s.
 */
export const MAX_LIST_ITEMS = 1000;
const JSON_LIMITS = { values: MAX_JSON_VALUES, items: MAX_LIST_ITEMS };
const JSON_TYPES = ['application/json', 'application/*+json'];
/** type/subtype, each an RFC 9110 token (§8.3.1) */
const MEDIA_TYPE = /^[!#$%&'*+.^_`|~0-9a-z-]+\/[!#$%&'*+.^_`|~0-9a-z-]+$/i;

/** The steps of the API's chain that read a body, in order: its type, its declared length, then the JSON parser. */
export function requestBody(spec: OpenApiDocument): RequestHandler[] {
  const takesRaw = rawUploads(spec);
  return [
    (req: Request, res: Response, next: NextFunction) => {
      if (!req.headers['content-type']) {
        // bytes of no type are application/octet-stream (RFC 9110 §8.3), which a route of raw uploads reads
        // (it judges the bytes, none included: an empty upload is its 422, not the validator's 415 of no type);
        // anywhere else they are refused, not dropped as if no body had been sent
        if (takesRaw(req)) {
          req.headers['content-type'] = 'application/octet-stream';
          return next();
        }
        if (!hasBody(req)) return next();
        // chunks, their length unknown: the body is refused when its first byte comes, and one that ends
        // with none is no body (a client that streams every request, an empty one too)
        if (req.headers['content-length'] === undefined) return void whenEmpty(req, next);
        throw noType();
      }
      // a type that is no media type (`;`, `;;;`): the validator took the request as one of no body, and a
      // route whose body is optional went on without it (an API key asked with an expiry made without one)
      if (hasBody(req) && !MEDIA_TYPE.test(req.headers['content-type'].split(';')[0]!.trim()))
        throw new UnsupportedMediaTypeError(
          `The Content-Type ${JSON.stringify(req.headers['content-type'].slice(0, 100))} is not a media type: send JSON as application/json.`,
        );
      // a route of raw uploads takes no JSON: its validator answers the type 415 (parsed, an upload sent as
      // JSON was a 400 malformed-json, or a 413 past the JSON limit)
      if (!req.is(JSON_TYPES) || takesRaw(req)) return next();
      const charset = charsetsOf(req.headers['content-type']).find((c) => c !== 'utf-8');
      if (charset !== undefined) throw new UnsupportedMediaTypeError(`A JSON body is UTF-8 (RFC 8259): charset=${charset} is not read.`);
      if (!refuseDeclaredOver(BODY_LIMIT_BYTES, req, res, next)) next();
    },
    express.json({
      limit: BODY_LIMIT_BYTES,
      type: (req) => Boolean((req as Request).is(JSON_TYPES)) && !takesRaw(req as Request),
      strict: true,
      // refused before it is parsed: nothing that would store or echo it can overflow on it, and the
      // validator is never handed more than it can check in a few milliseconds
      verify: (_req, _res, buf) => {
        const refused = unsafeJson(buf) ?? bulkyJson(buf, JSON_LIMITS);
        if (refused) throw new ValidationError(refused.detail, [{ path: '/body', message: refused.rule }]);
      },
    }),
  ];
}

const noType = () => new UnsupportedMediaTypeError('The body has no Content-Type: send JSON as application/json.');

/** Reads a chunked body of no type: next() when it ends empty, a 415 at its first byte. */
function whenEmpty(req: Request, next: NextFunction): void {
  const done = (err?: unknown) => {
    req.off('data', onData).off('end', onEnd).off('error', done);
    next(err);
  };
  const onData = (chunk: Buffer) => {
    if (!chunk.length) return;
    req.pause();
    done(noType());
  };
  const onEnd = () => done();
  req.on('data', onData).on('end', onEnd).on('error', done);
}

/** A body is on its way: a length over 0, or chunks (whose length is not known before they are read). */
export function hasBody(req: IncomingMessage): boolean {
  return req.headers['transfer-encoding'] !== undefined || Number(req.headers['content-length']) > 0;
}

/** Every charset parameter of a Content-Type, lower case and unquoted: a repeated one must not hide another. */
function charsetsOf(contentType: string): string[] {
  const found: string[] = [];
  for (const param of contentType.split(';').slice(1)) {
    const eq = param.indexOf('=');
    if (eq === -1 || param.slice(0, eq).trim().toLowerCase() !== 'charset') continue;
    const value = param.slice(eq + 1).trim();
    found.push((value.length > 1 && value.startsWith('"') && value.endsWith('"') ? value.slice(1, -1) : value).toLowerCase());
  }
  return found;
}

/** The operations whose body may be raw bytes (application/octet-stream in the spec: voice uploads), by method and path. */
function rawUploads(spec: OpenApiDocument): (req: Request) => boolean {
  const routes: { method: string; path: RegExp }[] = [];
  for (const [template, operations] of Object.entries(spec.paths))
    for (const [method, op] of Object.entries(operations)) {
      const content = (op as { requestBody?: { content?: Record<string, unknown> } }).requestBody?.content;
      if (!content || !('application/octet-stream' in content)) continue;
      routes.push({ method: method.toUpperCase(), path: pathPattern(template) });
    }
  return (req) => {
    const path = `${req.baseUrl}${req.path}`;
    return routes.some((r) => r.method === req.method && r.path.test(path));
  };
}
