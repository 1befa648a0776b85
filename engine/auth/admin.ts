// The operators' keys (SERVICE_ADMIN_KEYS): they open the queue dashboard and /metrics of every process,
// as a Bearer token, X-API-Key, or the password of HTTP Basic so a browser can open the dashboard.
import { createHash, timingSafeEqual } from 'node:crypto';
import type { IncomingHttpHeaders } from 'node:http';

const digest = (s: string) => createHash('sha256').update(s, 'utf8').digest();

/** Compares against every admin key in constant time (hashing first evens out the lengths). */
export function isAdminKey(presented: string, adminKeys: string[]): boolean {
  const p = digest(presented);
  let match = false;
  for (const k of adminKeys) match = timingSafeEqual(p, digest(k)) || match;
  return match;
}

/**
 * The key a request presents: a Bearer token, else (with `basic`, for the admin routes) the password of
 * HTTP Basic, else X-API-Key. An Authorization that is neither (a browser's Basic for the dashboard, sent
 * along to the API) does not hide an X-API-Key; a Bearer token is taken before an X-API-Key, and a Bearer
 * that holds no one token (`Bearer` alone) is none, not passed over for the X-API-Key.
 */
export function presentedKeyOf(headers: IncomingHttpHeaders, opts: { basic: boolean }): string | undefined {
  const auth = headers.authorization ?? '';
  if (/^Bearer(\s|$)/i.test(auth)) return /^Bearer\s+(\S+)\s*$/i.exec(auth)?.[1];
  const basic = opts.basic ? /^Basic\s+([A-Za-z0-9+/=]+)\s*$/i.exec(auth) : null;
  if (basic) {
    const decoded = Buffer.from(basic[1]!, 'base64').toString('utf8');
    return decoded.slice(decoded.indexOf(':') + 1);
  }
  const header = headers['x-api-key'];
  return typeof header === 'string' && header.trim() ? header.trim() : undefined;
}

/**
 * Whether an Authorization header is HTTP Basic as a browser sends it (base64 of `user:password`): the
 * dashboard's and /metrics's credential, which a browser keeps and then sends by itself, to the API's paths
 * too (/metrics's protection space is the whole origin, RFC 7617 2.2), as it sends a cookie.
 */
export function isBrowserBasic(auth: string): boolean {
  const basic = /^Basic\s+([A-Za-z0-9+/]+={0,2})\s*$/i.exec(auth)?.[1];
  return basic !== undefined && basic.length % 4 === 0 && Buffer.from(basic, 'base64').toString('utf8').includes(':');
}

/** Whether a request carries one of the admin keys; none configured opens nothing. */
export function isAdminRequest(headers: IncomingHttpHeaders, adminKeys: string[]): boolean {
  const key = presentedKeyOf(headers, { basic: true });
  return Boolean(key && adminKeys.length && isAdminKey(key, adminKeys));
}

export const ADMIN_CHALLENGE = 'Basic realm="admin", charset="UTF-8"';
export const adminRefusal = (adminKeys: string[]) =>
  adminKeys.length ? 'an admin key (SERVICE_ADMIN_KEYS) is required' : 'no admin keys are configured (SERVICE_ADMIN_KEYS)';
