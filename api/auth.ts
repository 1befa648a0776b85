// Who is calling. API routes: a tenant's API key (Authorization: Bearer, or X-API-Key), resolved by
// its hash. Admin routes: one of SERVICE_ADMIN_KEYS, as Bearer or as the password of HTTP Basic so a
// browser can open the dashboard. SERVICE_AUTH=none makes every API caller the tenant "local".
import { createHash, timingSafeEqual } from 'node:crypto';
import type { Request, RequestHandler } from 'express';
import type { ApiKeys } from '../engine/auth/index.js';
import { UnauthorizedError } from '../engine/platform/index.js';
import { bindToRequestLog } from './request-log.js';

export const LOCAL_TENANT = 'local';

declare global {
  namespace Express {
    interface Request {
      tenantId?: string;
    }
  }
}

/** The calling tenant; set by `authenticate`, so every /api/v1 handler has one. */
export function tenantOf(req: Request): string {
  if (!req.tenantId) throw new UnauthorizedError('no tenant on this request');
  return req.tenantId;
}

function presentedKey(req: Request): string | undefined {
  const auth = req.headers.authorization;
  if (auth) {
    const m = /^Bearer\s+(\S+)\s*$/i.exec(auth);
    return m?.[1];
  }
  const header = req.headers['x-api-key'];
  return typeof header === 'string' && header.trim() ? header.trim() : undefined;
}

export function authenticate(opts: { mode: 'required' | 'none'; apiKeys: ApiKeys }): RequestHandler {
  return async (req, _res, next) => {
    if (opts.mode === 'none') {
      req.tenantId = LOCAL_TENANT;
      return next();
    }
    const key = presentedKey(req);
    if (!key) throw new UnauthorizedError('send an API key as "Authorization: Bearer <key>" or "X-API-Key: <key>"');
    const record = await opts.apiKeys.resolve(key);
    if (!record) throw new UnauthorizedError('the API key is not valid');
    req.tenantId = record.tenant_id;
    bindToRequestLog(req, { tenant_id: record.tenant_id, key_id: record.id });
    next();
  };
}

const digest = (s: string) => createHash('sha256').update(s, 'utf8').digest();

/** Compares against every admin key in constant time (hashing first evens out the lengths). */
export function isAdminKey(presented: string, adminKeys: string[]): boolean {
  const p = digest(presented);
  let match = false;
  for (const k of adminKeys) match = timingSafeEqual(p, digest(k)) || match;
  return match;
}

function adminCredential(req: Request): string | undefined {
  const auth = req.headers.authorization ?? '';
  const basic = /^Basic\s+([A-Za-z0-9+/=]+)\s*$/i.exec(auth);
  if (basic) {
    const decoded = Buffer.from(basic[1]!, 'base64').toString('utf8');
    return decoded.slice(decoded.indexOf(':') + 1);
  }
  return presentedKey(req);
}

/** Guards the dashboard and metrics. Tenant keys are refused: only SERVICE_ADMIN_KEYS open them. */
export function requireAdmin(adminKeys: string[]): RequestHandler {
  return (req, res, next) => {
    const key = adminCredential(req);
    if (key && adminKeys.length && isAdminKey(key, adminKeys)) return next();
    res.setHeader('WWW-Authenticate', 'Basic realm="admin", charset="UTF-8"');
    throw new UnauthorizedError(adminKeys.length ? 'an admin key (SERVICE_ADMIN_KEYS) is required' : 'no admin keys are configured (SERVICE_ADMIN_KEYS)');
  };
}
