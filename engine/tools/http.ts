// http: one request. The address is checked at connect time (after DNS), so a name that resolves to
// anything but a public unicast address is refused unless SERVICE_HTTP_ALLOW_PRIVATE=1.
import http from 'node:http';
import https from 'node:https';
import { guardedLookup, privateLiteral } from '../platform/index.js';
import { stringArg, ToolError, type Tool } from './tool.js';

const BODY_MAX_BYTES = 256 * 1024;
const TIMEOUT_MS = 30_000;

/** The bytes kept as text: once the end was cut, up to the last whole character. */
function headText(kept: Buffer, truncated: boolean): string {
  let end = kept.length;
  if (truncated) {
    // a character cut short: its lead byte (11xxxxxx) and the continuation bytes after it are left out
    let back = end - 1;
    while (back >= 0 && end - back <= 4 && (kept[back]! & 0xc0) === 0x80) back--;
    if (back >= 0 && (kept[back]! & 0xc0) === 0xc0) {
      const need = kept[back]! >= 0xf0 ? 4 : kept[back]! >= 0xe0 ? 3 : 2;
      if (end - back < need) end = back;
    }
  }
  return kept.toString('utf8', 0, end);
}

export const httpTool: Tool = {
  name: 'http',
  description: 'Make one HTTP request. Returns status, headers and the body as text (at most 256 KB).',
  parameters: {
    type: 'object',
    required: ['url'],
    properties: {
      url: { type: 'string' },
      method: { type: 'string', enum: ['GET', 'POST', 'PUT', 'PATCH', 'DELETE', 'HEAD'] },
      headers: { type: 'object', additionalProperties: { type: 'string' } },
      body: { type: 'string' },
    },
  },
  async execute(args, ctx) {
    let url: URL;
    try {
      url = new URL(stringArg(args, 'url'));
    } catch (err) {
      if (err instanceof ToolError) throw err;
      throw new ToolError('invalid-args', 'args.url is not a URL');
    }
    if (url.protocol !== 'http:' && url.protocol !== 'https:') throw new ToolError('invalid-args', 'only http and https URLs');
    const literal = ctx.httpAllowPrivate ? null : privateLiteral(url);
    if (literal) throw new ToolError('address-not-allowed', `${literal} is a private or loopback address`);
    const method = typeof args.method === 'string' ? args.method.toUpperCase() : 'GET';
    const headers = (args.headers && typeof args.headers === 'object' ? args.headers : {}) as Record<string, string>;
    const body = typeof args.body === 'string' ? args.body : undefined;
    const client = url.protocol === 'https:' ? https : http;
    return new Promise((resolve, reject) => {
      const req = client.request(
        url,
        { method, headers, signal: ctx.signal, timeout: TIMEOUT_MS, ...(ctx.httpAllowPrivate ? {} : { lookup: guardedLookup as never }) },
        (res) => {
          // the start of the body, as a file's is read: a document cut at its end still begins where it does
          // (its last 256 KB began mid-document); past the bound nothing more is read (an endless body ends here)
          const chunks: Buffer[] = [];
          let size = 0;
          let truncated = false;
          const done = () => {
            const output = { status: res.statusCode, headers: res.headers, body: headText(Buffer.concat(chunks), truncated), truncated };
            resolve(res.statusCode && res.statusCode >= 400 ? { output, error: { code: 'http-error', message: `HTTP ${res.statusCode}` } } : { output });
          };
          res.on('data', (d: Buffer) => {
            if (truncated) return;
            const room = BODY_MAX_BYTES - size;
            chunks.push(d.length > room ? d.subarray(0, room) : d);
            size += Math.min(d.length, room);
            if (d.length > room) {
              truncated = true;
              done();
              res.destroy();
            }
          });
          res.on('end', () => {
            if (!truncated) done();
          });
          res.on('error', (err) => {
            if (!truncated) reject(err);
          });
        },
      );
      req.on('timeout', () => req.destroy(new ToolError('timeout', `no answer within ${TIMEOUT_MS} ms`)));
      req.on('error', (err: NodeJS.ErrnoException) => {
        if (err instanceof ToolError) return reject(err);
        if (err.code === 'EPRIVATE') return reject(new ToolError('address-not-allowed', err.message));
        if (err.name === 'AbortError') return reject(new ToolError('aborted', 'the request was stopped'));
        reject(new ToolError('http-failed', err.message));
      });
      if (body !== undefined) req.write(body);
      req.end();
    });
  },
};
