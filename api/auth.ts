// Who is calling. API routes: a tenant's API key (Authorization: Bearer, or X-API-Key), resolved by
// its hash, or, when sign-in is configured, a person's session cookie (with the CSRF rule of sign-in.ts). Admin routes: one of SERVICE_ADMIN_KEYS, as Bearer or as the password of HTTP Basic so a
// browser can open the dashboard. SERVICE_AUTH=none makes every API caller the tenant "local".
import type { Request, RequestHandler } from 'express';
import {
  ADMIN_CHALLENGE,
  adminRefusal,
  ApiRateLimitedError,
  isAdminRequest,
  isBrowserBasic,
  presentedKeyOf,
  type ApiKeys,
  type ApiRateLimit,
  type Sso,
} from '../engine/auth/index.js';
import { assertLocalCaller, assertSameOrigin, cookiesOf, SESSION_COOKIE } from './sign-in.js';
import { LOCAL_TENANT, UnauthorizedError } from '../engine/platform/index.js';
import { bindToRequestLog } from './request-log.js';

declare global {
  namespace Express {
    interface Request {
      tenantId?: string;
      /** the API key the request came with (none with SERVICE_AUTH=none) */
      apiKeyId?: string;
      /**
       * Whether the request's credential still opens the API (the key not revoked or expired, the
       * session not ended): a stream asks again as it goes, and ends when the answer is no.
       */
      stillAuthorized?: () => Promise<boolean>;
    }
  }
}

/** The calling tenant; set by `authenticate`, so every /api/v1 handler has one. */
export function tenantOf(req: Request): string {
  if (!req.tenantId) throw new UnauthorizedError('no tenant on this request');
  return req.tenantId;
}

export function authenticate(opts: { mode: 'required' | 'none'; apiKeys: ApiKeys; sso: Sso | null; allowedOrigins: string[] }): RequestHandler {
  return async (req, _res, next) => {
    if (opts.mode === 'none') {
      assertLocalCaller(req, opts.allowedOrigins);
      req.tenantId = LOCAL_TENANT;
      return next();
    }
    const key = presentedKeyOf(req.headers, { basic: false });
    if (key) {
      const record = await opts.apiKeys.resolve(key);
      if (!record) throw new UnauthorizedError('the API key is not valid (unknown, revoked or expired)');
      req.tenantId = record.tenant_id;
      req.apiKeyId = record.id;
      req.stillAuthorized = async () => (await opts.apiKeys.resolve(key))?.id === record.id;
      bindToRequestLog(req, { tenant_id: record.tenant_id, key_id: record.id });
      return next();
    }
    // a credential sent that holds no key (`Bearer` alone, `Basic !!!`, a scheme the API does not take, an empty
    // X-API-Key) is refused as a wrong key is, never passed over for the cookie: a caller is not served as someone
    // it did not say it was. Only a browser's own Basic for the dashboard, which it sends by itself as it sends the
    // cookie, is left to the cookie.
    const auth = req.headers.authorization;
    if (auth !== undefined && !isBrowserBasic(auth))
      throw new UnauthorizedError('the Authorization header holds no API key: send "Authorization: Bearer <key>" or "X-API-Key: <key>"');
    if (req.headers['x-api-key'] !== undefined) throw new UnauthorizedError('the X-API-Key header is empty: send "X-API-Key: <key>"');
    const sessionId = opts.sso ? cookiesOf(req)[SESSION_COOKIE] : undefined;
    if (sessionId) {
      // the CSRF rule before the session is read: a request it refuses changes nothing, the session's idle clock included
      assertSameOrigin(req, opts.allowedOrigins);
      const signedIn = await opts.sso!.resolve(sessionId);
      if (!signedIn) throw new UnauthorizedError('the session has ended; sign in again at /auth/login');
      req.tenantId = signedIn.tenant_id;
      req.signedIn = signedIn;
      // checked without counting as a use: a stream left open does not keep an idle session alive
      req.stillAuthorized = async () => (await opts.sso!.check(sessionId))?.tenant_id === signedIn.tenant_id;
      bindToRequestLog(req, { tenant_id: signedIn.tenant_id, sub: signedIn.sub });
      return next();
    }
    throw new UnauthorizedError(
      opts.sso
        ? 'send an API key as "Authorization: Bearer <key>" or "X-API-Key: <key>", or sign in at /auth/login'
        : 'send an API key as "Authorization: Bearer <key>" or "X-API-Key: <key>"',
    );
  };
}

/**
 * Counts the request against its tenant's and its key's budgets (engine/auth/rate-limit.ts) and says
 * where it stands in the IETF draft's headers: `RateLimit-Policy` names the budgets, `RateLimit` the one
 * nearest to its end (remaining requests, seconds to the window's end). A spent budget is a 429 with
 * Retry-After.
 */
export function rateLimit(limits: ApiRateLimit): RequestHandler {
  const policy = limits.policies.map((p) => `"${p.policy}";q=${p.limit};w=${p.windowSeconds}`).join(', ');
  return async (req, res, next) => {
    res.setHeader('RateLimit-Policy', policy);
    const state = await limits.consume(tenantOf(req), req.apiKeyId ?? (req.signedIn ? `person:${req.signedIn.sub}` : null)).catch((err: unknown) => {
      if (err instanceof ApiRateLimitedError) res.setHeader('RateLimit', `"${err.state.policy}";r=0;t=${err.state.resetSeconds}`);
      throw err;
    });
    res.setHeader('RateLimit', `"${state.policy}";r=${state.remaining};t=${state.resetSeconds}`);
    next();
  };
}

/** GET /api/v1/me: who the request is, and how it proved it. */
export function whoIs(req: Request) {
  const person = req.signedIn;
  return {
    tenant_id: tenantOf(req),
    auth: person ? ('session' as const) : req.apiKeyId ? ('api_key' as const) : ('none' as const),
    api_key_id: req.apiKeyId ?? null,
    user: person ? { sub: person.sub, email: person.email, name: person.name } : null,
    session_expires_at: person?.expires_at ?? null,
  };
}

/** Guards the dashboard and metrics. Tenant keys are refused: only SERVICE_ADMIN_KEYS open them. */
export function requireAdmin(adminKeys: string[]): RequestHandler {
  return (req, res, next) => {
    if (isAdminRequest(req.headers, adminKeys)) return next();
    res.setHeader('WWW-Authenticate', ADMIN_CHALLENGE);
    throw new UnauthorizedError(adminRefusal(adminKeys));
  };
}
