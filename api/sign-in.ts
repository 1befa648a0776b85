// People in a browser: /auth/login, /auth/callback and /auth/logout (OpenID Connect, engine/auth/sso.ts),
// the session cookie they leave, the CSRF rule for requests that cookie authenticates, and CORS for
// the web client's origins.
import { createHash } from 'node:crypto';
import cors from 'cors';
import { Router, type Request, type RequestHandler, type Response } from 'express';
import { LOGIN_SECONDS, type SignedIn, type Sso } from '../engine/auth/index.js';
import { AppError, NotFoundError, ValidationError } from '../engine/platform/index.js';

/** The session's cookie: `__Host-` so only this origin over HTTPS can set it, for every path. */
export const SESSION_COOKIE = '__Host-session';
/**
 * Binds a sign-in's callback to the browser that started it: one cookie a sign-in, named by its state, so that
 * two tabs signing in at once each find their own (one name for all, the later sign-in's cookie replaced the
 * earlier's, and the earlier tab's callback was refused).
 */
const STATE_COOKIE = '__Host-sign-in-';
const stateCookie = (state: string) => STATE_COOKIE + createHash('sha256').update(state).digest('base64url').slice(0, 16);
/**
 * The bytes of sign-in cookies one browser keeps: a new sign-in clears the oldest past it. A cookie is 0.6 KB, up
 * to 4 KB with a long return_to, and a browser sends them all with every request to the service: left to grow,
 * they would pass what a server reads of a request's headers (Node's 16 KB, the URL and the rest included), and
 * every request of that browser would be refused (431), the sign-in that would clear them too.
 */
const SIGN_IN_COOKIE_BYTES = 8192;

export class CsrfRefusedError extends AppError {
  readonly code = 'csrf-refused';
}

export type SignInOptions = {
  sso: Sso | null;
  /** the service's own origin (its redirect URL's) and the web client's (SERVICE_CORS_ORIGINS) */
  allowedOrigins: string[];
  corsOrigins: string[];
  redirectUrl: string | null;
  sessionMaxSeconds: number;
};

declare global {
  namespace Express {
    interface Request {
      /** the signed-in person a session cookie opened */
      signedIn?: SignedIn;
    }
  }
}

export function cookiesOf(req: Request): Record<string, string> {
  const out: Record<string, string> = Object.create(null);
  for (const part of (req.headers.cookie ?? '').split(';')) {
    const at = part.indexOf('=');
    if (at <= 0) continue;
    try {
      out[part.slice(0, at).trim()] = decodeURIComponent(part.slice(at + 1).trim());
    } catch {
      // a cookie that is not ours (or is mangled) is not read
    }
  }
  return out;
}

function setCookie(res: Response, name: string, value: string, maxAgeSeconds: number): void {
  res.append('Set-Cookie', `${name}=${encodeURIComponent(value)}; Path=/; HttpOnly; Secure; SameSite=Lax; Max-Age=${maxAgeSeconds}`);
}

/** methods that change nothing: a cookie may ride on them from anywhere */
export const SAFE_METHODS = new Set(['GET', 'HEAD', 'OPTIONS']);
/** GETs that start work: held to the rule of a POST (a same-site page's <img> could otherwise start an audit) */
const GETS_THAT_START_WORK = new Set(['/api/v1/autonomy/workspace-audit/stream']);

/**
 * A cookie rides along on any request the browser makes, a forged cross-site form's too: a request
 * that changes something and is authenticated by the cookie must show where it came from. `Origin` must
 * be one of ours; without it, `Sec-Fetch-Site` must be same-origin; with neither it is refused. Requests
 * with an API key carry no ambient credential and are exempt.
 */
export function assertSameOrigin(req: Request, allowedOrigins: string[]): void {
  // a SameSite=Lax cookie also rides on a cross-site top-level navigation: only who-am-I may be reached so
  // (where sign-in lands), never a GET that starts work (an audit stream)
  // (a navigation names no Origin; an allowed web client's own cross-site fetch does)
  const fromAllowed = req.headers.origin !== undefined && allowedOrigins.includes(req.headers.origin);
  // the path as routed: Express takes /stream/ for /stream
  const routed = req.originalUrl.split('?')[0]!.replace(/(.)\/+$/, '$1');
  if (req.headers['sec-fetch-site'] === 'cross-site' && !fromAllowed && routed !== '/api/v1/me')
    throw new CsrfRefusedError('a cross-site navigation cannot use this session');
  if (SAFE_METHODS.has(req.method) && !GETS_THAT_START_WORK.has(routed)) return;
  const origin = req.headers.origin;
  if (origin) {
    if (allowedOrigins.includes(origin)) return;
    throw new CsrfRefusedError(`a request from ${origin} cannot use this session; call from an allowed origin or with an API key`);
  }
  if (req.headers['sec-fetch-site'] === 'same-origin') return;
  throw new CsrfRefusedError('a request authenticated by the session cookie must come from an allowed origin (Origin or Sec-Fetch-Site)');
}

/** A host name of this machine's own: `localhost` (and its subdomains, RFC 6761), 127.0.0.0/8, ::1. */
function isLoopbackName(hostname: string): boolean {
  const name = hostname.toLowerCase().replace(/\.$/, '');
  return name === 'localhost' || name.endsWith('.localhost') || /^127(\.\d{1,3}){3}$/.test(name) || name === '[::1]';
}

/** The host name of a URL (an Origin), or of a Host header (`name:port`, `[v6]:port`); null when it names none. */
function hostnameOf(url: string | undefined, asHost = false): string | null {
  try {
    return url ? new URL(asHost ? `http://${url}` : url).hostname || null : null;
  } catch {
    return null;
  }
}

/**
 * SERVICE_AUTH=none: whoever reaches the port is the tenant `local`, an ambient credential as a cookie is.
 * Only this machine's own clients are served: a request named to another host is refused (DNS rebinding:
 * a page of evil.example whose name now resolves to 127.0.0.1 would otherwise drive the API, shell steps
 * included), and so is a browser's request from another site that changes something or starts work (its
 * page's form or <img>). A client that is no browser (curl, the CLI) names neither Origin nor Sec-Fetch-Site.
 */
export function assertLocalCaller(req: Request, allowedOrigins: string[]): void {
  const hostname = hostnameOf(req.headers.host, true);
  if (!hostname || !isLoopbackName(hostname))
    throw new CsrfRefusedError(
      `with SERVICE_AUTH=none only this machine's own clients are served (Host ${JSON.stringify(req.headers.host ?? '')}): call it as localhost, or serve others with API keys`,
    );
  const origin = req.headers.origin;
  const fromHere = origin !== undefined && (allowedOrigins.includes(origin) || isLoopbackName(hostnameOf(origin) ?? ''));
  const site = req.headers['sec-fetch-site'];
  const elsewhere = origin !== undefined ? !fromHere : site === 'cross-site' || site === 'same-site';
  const routed = req.originalUrl.split('?')[0]!.replace(/(.)\/+$/, '$1');
  if (elsewhere && (!SAFE_METHODS.has(req.method) || GETS_THAT_START_WORK.has(routed)))
    throw new CsrfRefusedError(`a request from ${origin ?? 'another site'} cannot use this service's local access (SERVICE_AUTH=none)`);
}

/** CORS for the web client's origins only: with credentials, and the headers a client reads. */
export function corsFor(origins: string[]): RequestHandler {
  const allow = cors({
    origin: (origin, done) => done(null, origin !== undefined && origins.includes(origin)),
    credentials: true,
    exposedHeaders: ['Location', 'X-Request-Id', 'RateLimit', 'RateLimit-Policy', 'Retry-After', 'Idempotent-Replayed'],
    maxAge: 600,
  });
  // every answer varies with the Origin, not only one to an allowed origin: a cache must not give the answer to a
  // request with no Origin (a navigation) to the web client's fetch, or the other way round
  return (req, res, next) => {
    res.vary('Origin');
    allow(req, res, next);
  };
}

/** Where a sign-in may send the browser back to: a path of this service, or a page of an allowed origin. */
const RETURN_TO_MAX_LENGTH = 2000;

/**
 * The spec's maxLength (the validator checks /api only), counted as the sign-in cookie holds it: its JSON's
 * bytes. Longer, the sealed cookie passes the 4 KB browsers keep, and they drop it: 2,000 characters of `é`
 * (4,000 bytes) or `"` (escaped) made a cookie of 7.6 KB, and the sign-in failed at its callback.
 */
function assertFits(returnTo: string): string {
  if (Buffer.byteLength(JSON.stringify(returnTo)) - 2 > RETURN_TO_MAX_LENGTH)
    throw new ValidationError('return_to is too long', [
      { path: '/query/return_to', message: `at most ${RETURN_TO_MAX_LENGTH} bytes as JSON (a character beyond ASCII, or one JSON escapes, counts for more)` },
    ]);
  return returnTo;
}

function returnToOf(raw: unknown, allowedOrigins: string[]): string | null {
  if (raw === undefined || raw === '') return null;
  if (typeof raw !== 'string') throw new ValidationError('return_to must be one URL', [{ path: '/query/return_to', message: 'one value' }]);
  if (raw.length > RETURN_TO_MAX_LENGTH)
    throw new ValidationError('return_to is too long', [{ path: '/query/return_to', message: `at most ${RETURN_TO_MAX_LENGTH} characters` }]);
  if (raw.startsWith('/') && !raw.startsWith('//') && !raw.startsWith('/\\')) return assertFits(raw);
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    throw new ValidationError('return_to is not a URL', [{ path: '/query/return_to', message: 'a path of this service or a URL of an allowed origin' }]);
  }
  if (!allowedOrigins.includes(url.origin))
    throw new ValidationError('return_to is not an allowed origin', [{ path: '/query/return_to', message: `${url.origin} is not in SERVICE_CORS_ORIGINS` }]);
  return assertFits(url.href);
}

export function signInRouter(o: SignInOptions): Router {
  const router = Router();
  if (o.corsOrigins.length) router.use('/auth', corsFor(o.corsOrigins));
  const sso = () => {
    if (!o.sso)
      throw new NotFoundError(
        'sign-in is not configured here (SERVICE_OIDC_ISSUER, SERVICE_OIDC_CLIENT_ID, SERVICE_OIDC_CLIENT_SECRET, SERVICE_OIDC_REDIRECT_URL)',
      );
    return o.sso;
  };

  router.get('/auth/login', async (req, res) => {
    const returnTo = returnToOf(req.query.return_to, o.allowedOrigins);
    const started = await sso().login(returnTo);
    const name = stateCookie(started.state);
    // a browser sends its cookies of one path oldest first (RFC 6265, 5.4): the newest sign-ins are kept
    let bytes = name.length + started.cookie.length;
    const going = Object.entries(cookiesOf(req)).filter(([n]) => n.startsWith(STATE_COOKIE));
    for (const [n, value] of going.reverse()) if ((bytes += n.length + value.length + 2) > SIGN_IN_COOKIE_BYTES) setCookie(res, n, '', 0);
    setCookie(res, name, started.cookie, LOGIN_SECONDS);
    res.redirect(302, started.url);
  });

  router.get('/auth/callback', async (req, res) => {
    const signIn = sso();
    // the URL the provider redirected to, as registered (a proxy in front may have changed host or scheme)
    const current = new URL(o.redirectUrl!);
    // its query as sent (the request target may be in any form, even one no URL parses)
    const query = req.originalUrl.indexOf('?');
    current.search = query === -1 ? '' : req.originalUrl.slice(query);
    const cookies = cookiesOf(req);
    const state = current.searchParams.get('state');
    const done = await signIn.callback(current, state ? cookies[stateCookie(state)] : undefined);
    // signing in again ends the session this browser had: a logout from here on ends the one it holds, and
    // nothing left behind stays open for its idle time
    // (an old one that cannot be ended now lapses at its idle time: the new one, stored, is still handed over)
    if (cookies[SESSION_COOKIE]) await signIn.logout(cookies[SESSION_COOKIE]).catch(() => undefined);
    setCookie(res, stateCookie(state!), '', 0);
    setCookie(res, SESSION_COOKIE, done.sessionId, o.sessionMaxSeconds);
    res.redirect(302, done.returnTo ?? '/api/v1/me');
  });

  router.post('/auth/logout', async (req, res) => {
    const id = cookiesOf(req)[SESSION_COOKIE];
    if (id && o.sso) {
      assertSameOrigin(req, o.allowedOrigins);
      await o.sso.logout(id);
    }
    setCookie(res, SESSION_COOKIE, '', 0);
    res.status(204).end();
  });

  return router;
}
