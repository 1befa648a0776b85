// People's sign-in: OpenID Connect's authorization code flow with PKCE (openid-client: discovery, the
// token exchange, the ID token's signature, issuer, audience, expiry and nonce), a tenant read from a
// claim, and server-side sessions in Redis. A session's id lives only in the browser's cookie; Redis
// keeps its sha256. Everything a login needs between the redirect and the callback (its state, nonce,
// PKCE verifier and where to go back to) travels sealed (AES-GCM, SERVICE_SECRET_KEY) in the browser's
// sign-in cookie: starting a sign-in writes nothing, so no one can fill Redis by asking for logins. A
// login is used once: its state is marked used in Redis when its callback succeeds. Every Redis command
// here has REDIS_DEADLINE_MS (redisOrUnavailable): a Redis that does not answer is a 503 with Retry-After,
// never a request held for the outage, and never a session taken as valid without Redis's word.
import { createHash, randomBytes } from 'node:crypto';
import * as oidc from 'openid-client';
import { TENANT_ID_PATTERN, type OidcConfig } from '../../config/env.js';
import { AppError, redisOrUnavailable, ServiceUnavailableError, type Clock, type Logger, type Queues, type Redis, type SecretBox } from '../platform/index.js';

/** A sign-in that cannot be completed: said to the person, logged without tokens. */
export class SignInRefusedError extends AppError {
  readonly code = 'sign-in-refused';
}

/** The signed-in person, as a request sees them. */
export type SignedIn = {
  sub: string;
  email: string | null;
  /** whether the provider said it verified the email (sessions stored before it was kept had passed the check with it) */
  email_verified?: boolean;
  name: string | null;
  tenant_id: string;
  /** the claim's value the tenant was read from: a changed mapping ends the session */
  tenant_claim: string;
  created_at: string;
  /** the absolute end; idle sessions end sooner */
  expires_at: string;
};

export type SsoSettings = OidcConfig & { idleSeconds: number; maxSeconds: number; allowInsecureIssuer: boolean };

/** how long a started sign-in may take (the sign-in cookie's life too) */
export const LOGIN_SECONDS = 600;
const sha256 = (s: string) => createHash('sha256').update(s).digest('hex');
/** the sealed sign-in cookie's additional data: a value sealed for another purpose does not open as one */
const LOGIN_OWNER = 'sso-login';

type Login = { state: string; nonce: string; verifier: string; return_to: string | null; expires_at_ms: number };

export function ssoOf(deps: { redis: Redis; queues: Queues; clock: Clock; log: Logger; secretBox: SecretBox }, s: SsoSettings) {
  const { redis, clock, log, secretBox } = deps;
  const usedKey = (state: string) => `${deps.queues.prefix}:sso-used:${sha256(state)}`;
  const sessionKey = (id: string) => `${deps.queues.prefix}:sso-session:${sha256(id)}`;
  let discovered: Promise<oidc.Configuration> | undefined;

  /** The issuer's configuration, discovered on first use (the IdP may start after the service); a failure is tried again next time. */
  function configuration(): Promise<oidc.Configuration> {
    discovered ??= oidc
      .discovery(new URL(s.issuer), s.clientId, s.clientSecret, undefined, s.allowInsecureIssuer ? { execute: [oidc.allowInsecureRequests] } : undefined)
      .catch((err: Error) => {
        discovered = undefined;
        log.warn({ issuer: s.issuer, err: err.message }, 'OpenID Connect discovery failed');
        throw new ServiceUnavailableError('the identity provider cannot be reached; try again shortly', 5);
      });
    return discovered;
  }

  /** The tenant the claim's value names, or why there is none. */
  function tenantOf(claims: Record<string, unknown>): { tenant: string; claim: string } {
    const raw = claims[s.tenantClaim];
    const value = typeof raw === 'string' ? raw : typeof raw === 'number' ? String(raw) : null;
    if (!value) throw new SignInRefusedError(`your account has no ${s.tenantClaim} claim; ask an administrator to give you a tenant`);
    const mapped = Object.keys(s.tenantMap).length ? (Object.hasOwn(s.tenantMap, value) ? s.tenantMap[value] : undefined) : value;
    if (!mapped || !TENANT_ID_PATTERN.test(mapped))
      throw new SignInRefusedError(`${s.tenantClaim} "${value}" is not a tenant of this service; ask an administrator to map it`);
    return { tenant: mapped, claim: value };
  }

  /** Whether an address may sign in under SERVICE_OIDC_ALLOWED_EMAIL_DOMAINS (any may when it is empty). */
  function emailAllowed(email: string | null, verified: boolean): boolean {
    if (!s.allowedEmailDomains.length) return true;
    // the domain after the address's one `@`: an address with a quoted local part or more than one
    // `@` ("x@corp.com@"@elsewhere.com goes to elsewhere.com) is refused, not read as corp.com
    const domain = email ? /^[^@\s"]+@([^@\s"]+)$/.exec(email)?.[1] : undefined;
    // only an address the provider says it verified
    return Boolean(email && verified && domain && s.allowedEmailDomains.includes(domain));
  }

  /** The session, read (and its end or idle clock written) within Redis's deadline, or a 503. */
  const read = (sessionId: string, touch: boolean): Promise<SignedIn | null> =>
    redisOrUnavailable(redis, 'reading the session', () => readNow(sessionId, touch));

  async function readNow(sessionId: string, touch: boolean): Promise<SignedIn | null> {
    const key = sessionKey(sessionId);
    const raw = await redis.get(key);
    if (!raw) return null;
    const session = JSON.parse(raw) as SignedIn;
    const now = clock.now().getTime();
    const left = Math.floor((Date.parse(session.expires_at) - now) / 1000);
    let tenantNow: string | null;
    try {
      tenantNow = tenantOf({ [s.tenantClaim]: session.tenant_claim }).tenant;
    } catch {
      tenantNow = null;
    }
    // what a sign-in is held to now, as for the tenant: a narrowed list of email domains ends the sessions it no longer lets in
    const emailNow = emailAllowed(session.email, session.email_verified !== false);
    if (left <= 0 || tenantNow !== session.tenant_id || !emailNow) {
      await redis.del(key);
      if (tenantNow !== session.tenant_id) log.info({ tenant_id: session.tenant_id, sub: session.sub }, 'session ended: the tenant mapping changed');
      else if (!emailNow) log.info({ tenant_id: session.tenant_id, sub: session.sub }, 'session ended: its email domain may no longer sign in');
      return null;
    }
    if (touch) await redis.expire(key, Math.min(s.idleSeconds, left));
    return session;
  }

  return {
    /** Starts a sign-in: where to send the browser, its state, and the sealed login its cookie carries to the callback. */
    async login(returnTo: string | null): Promise<{ url: string; state: string; cookie: string }> {
      const config = await configuration();
      const state = oidc.randomState();
      const nonce = oidc.randomNonce();
      const verifier = oidc.randomPKCECodeVerifier();
      const login: Login = { state, nonce, verifier, return_to: returnTo, expires_at_ms: clock.now().getTime() + LOGIN_SECONDS * 1000 };
      const cookie = Buffer.from(JSON.stringify(secretBox.seal(JSON.stringify(login), LOGIN_OWNER))).toString('base64url');
      const url = oidc.buildAuthorizationUrl(config, {
        redirect_uri: s.redirectUrl,
        scope: 'openid email profile',
        state,
        nonce,
        code_challenge: await oidc.calculatePKCECodeChallenge(verifier),
        code_challenge_method: 'S256',
      });
      return { url: url.href, state, cookie };
    },

    /**
     * Completes a sign-in from the callback URL. The state must be the one the browser's sealed cookie
     * carries, of a login started here less than LOGIN_SECONDS ago and not used yet (a replayed callback
     * is refused); openid-client checks the code exchange, PKCE, nonce and the ID token. Answers the new
     * session's id and where to go.
     */
    async callback(currentUrl: URL, cookie: string | undefined): Promise<{ sessionId: string; session: SignedIn; returnTo: string | null }> {
      const state = currentUrl.searchParams.get('state');
      if (currentUrl.searchParams.get('error')) throw new SignInRefusedError(`the identity provider refused: ${currentUrl.searchParams.get('error')}`);
      let login: Login | null = null;
      try {
        login = cookie ? (JSON.parse(secretBox.open(JSON.parse(Buffer.from(cookie, 'base64url').toString()), LOGIN_OWNER)) as Login) : null;
      } catch {
        login = null; // not sealed by this service (or by another key): no login of this browser
      }
      if (!state || !login || login.state !== state) throw new SignInRefusedError('this sign-in was not started in this browser; start again');
      if (login.expires_at_ms <= clock.now().getTime()) throw new SignInRefusedError('this sign-in has expired or was already used; start again');
      // used once, marked before its code is exchanged: of two callbacks of one login one goes on, and a login's state
      // cannot be sent again and again with made-up codes, each a request to the provider with the client's secret (a
      // code is good once: a callback that fails cannot be completed anyway; a mark that lands late leaves it used)
      if ((await redisOrUnavailable(redis, 'marking the sign-in used', () => redis.set(usedKey(state), '1', 'EX', LOGIN_SECONDS, 'NX'))) === null)
        throw new SignInRefusedError('this sign-in has expired or was already used; start again');
      const config = await configuration();
      let claims: Record<string, unknown>;
      try {
        const tokens = await oidc.authorizationCodeGrant(config, currentUrl, {
          pkceCodeVerifier: login.verifier,
          expectedState: state,
          expectedNonce: login.nonce,
          idTokenExpected: true,
        });
        claims = (tokens.claims() ?? {}) as Record<string, unknown>;
      } catch (err) {
        // the provider could not be reached: not the person's fault, and the login cannot be retried
        if (err instanceof TypeError || (err as { cause?: unknown }).cause instanceof TypeError)
          throw new ServiceUnavailableError('the identity provider cannot be reached; sign in again shortly', 5);
        // the reason names the check, never a token
        log.warn({ issuer: s.issuer, reason: (err as { code?: string }).code ?? (err as Error).name, err: (err as Error).message }, 'sign-in refused');
        throw new SignInRefusedError('the identity provider’s answer did not check out; start again');
      }
      const email = typeof claims.email === 'string' ? claims.email.toLowerCase() : null;
      const emailVerified = claims.email_verified === true;
      if (!emailAllowed(email, emailVerified)) throw new SignInRefusedError('your email domain may not sign in here');
      const { tenant, claim } = tenantOf(claims);
      const now = clock.now();
      const session: SignedIn = {
        sub: String(claims.sub),
        email,
        email_verified: emailVerified,
        name: typeof claims.name === 'string' ? claims.name : null,
        tenant_id: tenant,
        tenant_claim: claim,
        created_at: now.toISOString(),
        expires_at: new Date(now.getTime() + s.maxSeconds * 1000).toISOString(),
      };
      // a new id at every sign-in: nothing a browser held before opens this session
      const sessionId = randomBytes(32).toString('base64url');
      const key = sessionKey(sessionId);
      // a session stored after its request was answered 503 belongs to no browser: removed once it lands
      await redisOrUnavailable(
        redis,
        'storing the session',
        () => redis.set(key, JSON.stringify(session), 'EX', Math.min(s.idleSeconds, s.maxSeconds)),
        (late) => void late.then(() => redis.del(key)).catch(() => undefined),
      );
      log.info({ tenant_id: tenant, sub: session.sub }, 'signed in');
      return { sessionId, session, returnTo: login.return_to };
    },

    /**
     * The person a session cookie opens, or null: ended, idle too long, past its absolute end, or its
     * tenant no longer what the mapping says (then it is ended here). Each use restarts the idle clock.
     */
    resolve: (sessionId: string): Promise<SignedIn | null> => read(sessionId, true),

    /** The same answer without counting as a use: an open stream asks it at each heartbeat, and a tab left open is no use. */
    check: (sessionId: string): Promise<SignedIn | null> => read(sessionId, false),

    /** Ends the session; without Redis's answer a 503 (the browser keeps its cookie, to log out again). */
    async logout(sessionId: string): Promise<void> {
      await redisOrUnavailable(redis, 'ending the session', () => redis.del(sessionKey(sessionId)));
    },
  };
}

export type Sso = ReturnType<typeof ssoOf>;
