// http: one request. The address is checked at connect time (after DNS), so a name that resolves to
// anything but a public unicast address is refused unless SERVICE_HTTP_ALLOW_PRIVATE=1.
import dns from 'node:dns';
import http from 'node:http';
import https from 'node:https';
import net from 'node:net';
import ipaddr from 'ipaddr.js';
import { stringArg, TailBuffer, ToolError, type Tool } from './tool.js';

const BODY_MAX_BYTES = 256 * 1024;
const TIMEOUT_MS = 30_000;

/**
 * Only public unicast addresses may be reached: ipaddr.js's range list (maintained upstream) names every
 * other range (loopback, private, link-local, carrier-grade NAT, NAT64 64:ff9b::/96, 6to4 2002::/16,
 * Teredo, reserved, multicast...). An IPv4 address written as IPv6 (::ffff:a.b.c.d, ::a.b.c.d) is
 * judged as the IPv4 address it carries.
 */
export function isPrivateAddress(address: string): boolean {
  let parsed: ipaddr.IPv4 | ipaddr.IPv6;
  try {
    parsed = ipaddr.parse(address);
  } catch {
    return true; // not an address we can judge: refused
  }
  if (parsed.kind() === 'ipv6' && (parsed as ipaddr.IPv6).isIPv4MappedAddress()) parsed = (parsed as ipaddr.IPv6).toIPv4Address();
  return parsed.range() !== 'unicast';
}

type LookupCallback = (err: NodeJS.ErrnoException | null, address: string | dns.LookupAddress[], family?: number) => void;

function guardedLookup(hostname: string, options: dns.LookupOptions, callback: LookupCallback): void {
  dns.lookup(hostname, { ...options, all: true }, (err, addresses) => {
    if (err) return callback(err, '');
    const list = addresses as dns.LookupAddress[];
    const blocked = list.find((a) => isPrivateAddress(a.address));
    if (blocked) {
      const e = Object.assign(new Error(`${hostname} resolves to ${blocked.address}, a private address`), { code: 'EPRIVATE' });
      return callback(e, '');
    }
    if (options.all) return callback(null, list);
    callback(null, list[0]!.address, list[0]!.family);
  });
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
    const literal = url.hostname.replace(/^\[|\]$/g, '');
    if (!ctx.httpAllowPrivate && net.isIP(literal) && isPrivateAddress(literal)) {
      throw new ToolError('address-not-allowed', `${literal} is a private or loopback address`);
    }
    const method = typeof args.method === 'string' ? args.method.toUpperCase() : 'GET';
    const headers = (args.headers && typeof args.headers === 'object' ? args.headers : {}) as Record<string, string>;
    const body = typeof args.body === 'string' ? args.body : undefined;
    const client = url.protocol === 'https:' ? https : http;
    return new Promise((resolve, reject) => {
      const req = client.request(
        url,
        { method, headers, signal: ctx.signal, timeout: TIMEOUT_MS, ...(ctx.httpAllowPrivate ? {} : { lookup: guardedLookup as never }) },
        (res) => {
          const buf = new TailBuffer(BODY_MAX_BYTES);
          res.on('data', (d: Buffer) => buf.push(d));
          res.on('end', () => {
            const output = { status: res.statusCode, headers: res.headers, body: buf.text(), truncated: buf.truncated };
            resolve(res.statusCode && res.statusCode >= 400 ? { output, error: { code: 'http-error', message: `HTTP ${res.statusCode}` } } : { output });
          });
          res.on('error', reject);
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
