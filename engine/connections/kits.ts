// Each provider through its own SDK (loaded on first use: the web process pays nothing until a tenant
// uses one): @octokit/rest for the code host, @slack/web-api for chat, @linear/sdk for the tracker,
// nodemailer over SMTP for email; the pager's REST API, plain JSON, through the service's own fetch. A kit
// reads its SDK's errors (for the retry layer) and says who a credential is and what it may do.
import { createHash } from 'node:crypto';
import net from 'node:net';
import type { Dispatcher } from 'undici';
import { guardedLookup, type ConnectionProvider, type ConnectionRecord } from '../platform/index.js';
import { PROVIDER_TIMEOUT_MS, reasonOf, retryAfterOf, type ProviderFailure } from './retry.js';

/** What a kit is given: the credential in clear (only ever in memory), where the provider is, and a stop signal. */
export type Access = {
  token: string;
  baseUrl: string | null;
  settings: ConnectionRecord['settings'];
  /** SERVICE_HTTP_ALLOW_PRIVATE: a name may lead to a private or loopback address */
  allowPrivate: boolean;
  signal?: AbortSignal;
};

export type Identity = { identity: string | null; capabilities: string[] };

export type Kit = {
  provider: ConnectionProvider;
  /** the provider's public API; null when there is none (SMTP servers are the tenant's own) */
  defaultBaseUrl: string | null;
  /** the URL schemes a base_url may have */
  schemes: string[];
  classify(err: unknown, token: string): ProviderFailure | null;
  /** who the credential is and what it may do; throws the SDK's error when the provider refuses */
  identify(access: Access): Promise<Identity>;
};

const QUIET = { debug() {}, info() {}, warn() {}, error() {} };

/** The most of an answer a provider's SDK reads, once decoded: a provider's answers are a few KB. */
export const ANSWER_MAX_BYTES = 4 * 1024 * 1024;

/** An answer past ANSWER_MAX_BYTES: its reading stops there (a gzip bomb of 300 KB decoded to 300 MB). */
export class AnswerTooLargeError extends Error {
  /** `status`: the HTTP status the answer came with */
  constructor(readonly status: number | null = null) {
    super(`the provider's answer is over ${ANSWER_MAX_BYTES / 1024 / 1024} MB`);
    this.name = 'AnswerTooLargeError';
  }
}

/** An answer sent encoded although it was asked for as it is: fetch would decode it without a bound. */
export class EncodedAnswerError extends Error {
  /** `status`: the HTTP status the answer came with */
  constructor(
    encoding: string,
    readonly status: number | null = null,
  ) {
    super(`the provider's answer came encoded (${encoding.slice(0, 40)}) although it was asked for as it is`);
    this.name = 'EncodedAnswerError';
  }
}

/**
 * Asks for an answer as it is (`accept-encoding: identity`), refuses one that comes encoded anyway, and stops
 * reading past ANSWER_MAX_BYTES: what fetch hands an SDK is bounded (fetch decodes gzip, br and deflate
 * without a bound: a gzip bomb of 300 KB took 600 MB).
 */
const boundAnswers: Dispatcher.DispatcherComposeInterceptor = (dispatch) => (opts, handler) => {
  let read = 0;
  let answeredStatus: number | null = null;
  const headers = { ...(opts.headers as Record<string, string> | undefined), 'accept-encoding': 'identity' };
  return dispatch(
    { ...opts, headers },
    {
      onRequestStart: (controller, context) => handler.onRequestStart?.(controller, context),
      onRequestUpgrade: (controller, status, upgraded, socket) => handler.onRequestUpgrade?.(controller, status, upgraded, socket),
      onResponseStart(controller, status, answered, message) {
        answeredStatus = status;
        const encoding = answered['content-encoding'];
        if (encoding && String(encoding).toLowerCase() !== 'identity') return controller.abort(new EncodedAnswerError(String(encoding), status));
        return handler.onResponseStart?.(controller, status, answered, message);
      },
      onResponseData(controller, chunk) {
        read += chunk.byteLength;
        if (read > ANSWER_MAX_BYTES) return controller.abort(new AnswerTooLargeError(answeredStatus));
        return handler.onResponseData?.(controller, chunk);
      },
      onResponseEnd: (controller, trailers) => handler.onResponseEnd?.(controller, trailers),
      onResponseError: (controller, err) => handler.onResponseError?.(controller, err),
    },
  );
};

const dispatchers = new Map<boolean, Promise<Dispatcher>>();

/**
 * What the fetch of every provider's SDK goes through: answers bounded (boundAnswers), and, unless private
 * addresses are allowed, each connection's own lookup guarded: base_url is checked before each call, but a
 * name whose DNS answer changes between the check and the SDK's connect (rebinding) reached loopback.
 */
function dispatcherOf(allowPrivate: boolean): Promise<Dispatcher> {
  let made = dispatchers.get(allowPrivate);
  if (!made) {
    made = import('undici').then(({ Agent }) => new Agent(allowPrivate ? {} : { connect: { lookup: guardedLookup } }).compose(boundAnswers));
    dispatchers.set(allowPrivate, made);
  }
  return made;
}

/**
 * The fetch an SDK is given: through dispatcherOf, no redirect (one could lead past the address check of base_url),
 * and stopped by the access's signal as well as by any the SDK gives (Slack's WebClient takes no signal of ours).
 */
async function fetchOf(a: Access): Promise<typeof fetch> {
  const dispatcher = await dispatcherOf(a.allowPrivate);
  return (url, init) => {
    const signal = a.signal && init?.signal ? AbortSignal.any([a.signal, init.signal]) : (init?.signal ?? a.signal);
    // (undici's own Dispatcher type, not the one Node's fetch types name: the same interface)
    return fetch(url, { ...init, signal, redirect: 'error', dispatcher } as unknown as RequestInit);
  };
}

/** The bound an answer met (AnswerTooLargeError or EncodedAnswerError), wherever in an SDK's error's causes. */
function boundMet(err: unknown): AnswerTooLargeError | EncodedAnswerError | null {
  type Wrapped = { cause?: unknown; raw?: unknown; original?: unknown };
  for (let e = err, depth = 0; e && depth < 5; e = (e as Wrapped).cause ?? (e as Wrapped).raw ?? (e as Wrapped).original, depth++)
    if (e instanceof AnswerTooLargeError || e instanceof EncodedAnswerError) return e;
  return null;
}

/**
 * What an answer the service refused to read (a bound it met) says. One of success (or of no known status) came:
 * the provider did what was asked, and only its answer is lost (`unread`: never asked again, and no status of the
 * provider's: a 502 for it had a comment made three times). One of refusal is that refusal, its reason the bound.
 */
function boundFailure(err: unknown): ProviderFailure | null {
  const bound = boundMet(err);
  if (!bound) return null;
  if (bound.status !== null && bound.status >= 400) return { status: bound.status, retryAfterSeconds: null, reason: bound.message };
  return { status: bound.status, retryAfterSeconds: null, reason: bound.message, unread: true };
}

// ---- code host: GitHub (or GitHub Enterprise through base_url) ----

/** Whether a code host connection is a GitHub App's installation (its credential the App's private key). */
export const isGithubApp = (settings: ConnectionRecord['settings']): boolean => Boolean(settings.app_id && settings.installation_id);

/** Installation tokens a process keeps, per App connection's key material (at most this many connections). */
const APP_TOKENS_KEPT = 1000;
/** A token this close to its end (GitHub's: an hour after it was made) is made again rather than used. */
const APP_TOKEN_MARGIN_MS = 5 * 60_000;
/** Per App connection's key material: its token and when it ends, or the one being made (one at a time). */
const appTokens = new Map<string, { token: string; expiresAt: number; madeAt: number } | Promise<string>>();
/** How long GitHub may refuse a token it has just made (its replicas learn of it a moment later). */
const APP_TOKEN_NEW_MS = 5000;
const appTokenId = (a: Access) =>
  createHash('sha256')
    .update([a.baseUrl ?? '', a.settings.app_id, a.settings.installation_id, a.token].join('\n'))
    .digest('hex');

/**
 * A token the code host refused (401): dropped, so that the next call makes another (an installation suspended
 * and resumed, its token revoked), unless it was made under APP_TOKEN_NEW_MS ago: then the refusal is the host's
 * replicas not knowing it yet, and the caller waits that out and tries it again ('new'). `a`: the connection's
 * access with its private key.
 */
export function refusedInstallationToken(a: Access, token: string): 'dropped' | 'new' {
  const id = appTokenId(a);
  const held = appTokens.get(id);
  if (held && !(held instanceof Promise) && held.token === token) {
    if (Date.now() - held.madeAt < APP_TOKEN_NEW_MS) return 'new';
    appTokens.delete(id);
  }
  return 'dropped';
}

/**
 * An App installation's token for a connection (its credential the App's private key): kept from before while it
 * has over five minutes left, else made: a JWT the key signs (@octokit/auth-app's app authentication, made here,
 * nothing sent), then `POST /app/installations/{id}/access_tokens` through the connection's guarded Octokit.
 * Kept and made one at a time per connection's key material (address, App, installation and key, hashed): no
 * caller is ever handed a token another connection made. auth-app's own installation path shares its tokens
 * being made by installation id alone, across Apps and hosts, so it is not used.
 */
export async function installationToken(a: Access): Promise<string> {
  const id = appTokenId(a);
  const held = appTokens.get(id);
  if (held instanceof Promise) return untilAborted(held, a.signal);
  if (held && held.expiresAt - Date.now() > APP_TOKEN_MARGIN_MS) return held.token;
  // made under no caller's signal: shared by every caller who asks meanwhile, it failed them all when the first was
  // canceled or ran out of time. Each waits for it under its own signal; the making is held to a call's time alone
  const making = (async () => {
    const { createAppAuth } = await import('@octokit/auth-app');
    const { token: jwt } = await createAppAuth({ appId: a.settings.app_id!, privateKey: a.token })({ type: 'app' });
    const gh = await octokitOf({ ...a, token: jwt, signal: AbortSignal.timeout(PROVIDER_TIMEOUT_MS) });
    const made = await gh.request('POST /app/installations/{installation_id}/access_tokens', {
      installation_id: Number(a.settings.installation_id),
      headers: { authorization: `bearer ${jwt}` },
    });
    const token = (made.data as { token?: unknown }).token;
    if (typeof token !== 'string' || !token) throw new CodehostAnswerError(made.status);
    appTokens.set(id, {
      token,
      expiresAt: Date.parse(String((made.data as { expires_at?: unknown }).expires_at)) || Date.now() + 3_600_000,
      madeAt: Date.now(),
    });
    if (appTokens.size > APP_TOKENS_KEPT) appTokens.delete(appTokens.keys().next().value!);
    return token;
  })();
  appTokens.set(id, making);
  // one that failed is not kept: the next call makes one again
  making.catch(() => appTokens.get(id) === making && appTokens.delete(id));
  return untilAborted(making, a.signal);
}

export async function octokitOf(a: Access) {
  const { Octokit } = await import('@octokit/rest');
  return new Octokit({
    auth: a.token,
    baseUrl: (a.baseUrl ?? codehostKit.defaultBaseUrl!).replace(/\/+$/, ''),
    userAgent: 'automation-service',
    log: QUIET,
    // a redirect could lead anywhere, past the address check of base_url: refused
    request: { signal: a.signal, redirect: 'error', fetch: readWhole(await fetchOf(a)) },
  });
}

/**
 * A code host's answer of success read whole before Octokit has it: Octokit takes a body it fails to read (past
 * ANSWER_MAX_BYTES, cut short) for an empty one, and an action made something (a comment) and answered `{}`, its
 * ids missing to the steps after it. Read here, such a body is the failure it is: `provider-answer-unreadable`.
 */
function readWhole(inner: typeof fetch): typeof fetch {
  return async (url, init) => {
    const res = await inner(url, init);
    if (res.status < 200 || res.status >= 300 || !res.body) return res;
    const body = await res.arrayBuffer();
    return new Response(body, { status: res.status, statusText: res.statusText, headers: res.headers });
  };
}

/** A code host answer that names no user: cut short (no status), or not GitHub's. */
class CodehostAnswerError extends Error {
  constructor(readonly status: number | null) {
    super(status === null ? 'no whole answer' : 'the answer names no user');
    this.name = 'CodehostAnswerError';
  }
}

/** What GitHub says to wait when a secondary rate limit's answer names no time: "at least one minute". */
const SECONDARY_LIMIT_WAIT_SECONDS = 60;

/**
 * The seconds GitHub says to wait before asking again: its Retry-After (a secondary rate limit), else, when no
 * request is left (x-ratelimit-remaining: 0), until x-ratelimit-reset (in seconds since the epoch), else a minute
 * for a secondary rate limit its message names without either; null for none.
 */
function codehostWait(headers: Record<string, string | undefined>, message: string): number | null {
  const retryAfter = retryAfterOf(headers['retry-after']);
  if (retryAfter !== null) return retryAfter;
  const reset = Number(headers['x-ratelimit-reset']);
  if (headers['x-ratelimit-remaining'] === '0' && headers['x-ratelimit-reset'] && Number.isFinite(reset))
    return Math.max(0, Math.ceil(reset - Date.now() / 1000));
  return /secondary rate limit/i.test(message) ? SECONDARY_LIMIT_WAIT_SECONDS : null;
}

/** What an Octokit error says: its status, headers and GitHub's own short message. */
const answerOf = (err: unknown) => {
  const e = err as { status?: number; response?: { headers?: Record<string, string>; data?: unknown } };
  const message = (e?.response?.data as { message?: unknown } | undefined)?.message;
  return { status: e?.status, headers: e?.response?.headers ?? {}, message: typeof message === 'string' ? message : '' };
};

/** A 403 of GitHub's that is a rate limit (it names a wait), not a refusal of the credential. */
const isRateLimited = (err: unknown): boolean => {
  const a = answerOf(err);
  return a.status === 403 && codehostWait(a.headers, a.message) !== null;
};

export const codehostKit: Kit = {
  provider: 'codehost',
  defaultBaseUrl: 'https://api.github.com',
  schemes: ['https:', 'http:'],
  classify(err, token) {
    if (err instanceof CodehostAnswerError) return { status: err.status === null ? null : 502, retryAfterSeconds: null, reason: err.message };
    const bound = boundFailure(err);
    if (bound) return bound;
    const e = err as { name?: string; status?: number; response?: { headers?: Record<string, string>; data?: unknown } };
    if (e?.name !== 'HttpError' || typeof e.status !== 'number') return null;
    // @octokit/request reports a request that never got an answer as a 500 without a response
    if (!e.response) return { status: null, retryAfterSeconds: null, reason: 'no answer' };
    // GitHub's own short message, never the rest of a body (which could be anything a server sent)
    const { headers, message } = answerOf(err);
    return {
      // GitHub answers a rate limit 403 as often as 429: asked again when it says, not taken for a refused credential
      status: isRateLimited(err) ? 429 : e.status,
      retryAfterSeconds: codehostWait(headers, message),
      reason: reasonOf(message, token),
    };
  },
  async identify(a) {
    const gh = await octokitOf(a);
    try {
      const me = await gh.rest.users.getAuthenticated();
      const scopes = String(me.headers['x-oauth-scopes'] ?? '')
        .split(',')
        .map((s) => s.trim())
        .filter(Boolean);
      // an answer cut short or not GitHub's (@octokit/request gives its text, or nothing, as data) names no one
      const data: unknown = me.data;
      const login = data && typeof data === 'object' ? (data as { login?: unknown }).login : undefined;
      if (typeof login !== 'string' || !login) throw new CodehostAnswerError(a.signal?.aborted ? null : me.status);
      return { identity: login, capabilities: scopes };
    } catch (err) {
      // a GitHub App installation token cannot read /user: it is its installation, with its repositories
      if ((err as { status?: number }).status !== 403 || isRateLimited(err)) throw err;
      const repos = await gh.rest.apps.listReposAccessibleToInstallation({ per_page: 1 });
      return { identity: `installation (${repos.data.total_count} repositories)`, capabilities: ['installation'] };
    }
  },
};

// ---- chat: Slack ----

export async function slackOf(a: Access) {
  const { WebClient, LogLevel } = await import('@slack/web-api');
  const base = (a.baseUrl ?? chatKit.defaultBaseUrl!).replace(/\/*$/, '/');
  // retries and rate limits are the retry layer's, so that every provider waits as Retry-After says
  return new WebClient(a.token, {
    slackApiUrl: base,
    retryConfig: { retries: 0 },
    rejectRateLimitedCalls: true,
    logLevel: LogLevel.ERROR,
    logger: SLACK_QUIET,
    timeout: PROVIDER_TIMEOUT_MS,
    // a redirect could lead past the address check of base_url: refused
    fetch: slackRetryAfter(await fetchOf(a)),
  });
}

/**
 * A 429's Retry-After as the Slack SDK reads it, a whole number of seconds: one of none, or an HTTP date, made it
 * throw a plain error (no code), which was never tried again and said `provider-error` with the SDK's message. An
 * HTTP date is its seconds from now; none is a second (the retry layer's first wait), as the SDK's own retries take.
 */
function slackRetryAfter(inner: typeof fetch): typeof fetch {
  return async (url, init) => {
    const res = await inner(url, init);
    const named = res.headers.get('retry-after');
    if (res.status !== 429 || (named !== null && /^\d+$/.test(named.trim()))) return res;
    const headers = new Headers(res.headers);
    headers.set('retry-after', String(Math.ceil(retryAfterOf(named) ?? 1)));
    return new Response(res.body, { status: res.status, statusText: res.statusText, headers });
  };
}

const SLACK_QUIET = { ...QUIET, setLevel() {}, getLevel: () => 'error' as never, setName() {} };
const SLACK_AUTH_ERRORS = new Set([
  'invalid_auth',
  'not_authed',
  'account_inactive',
  'token_revoked',
  'token_expired',
  'missing_scope',
  'not_allowed_token_type',
]);

export const chatKit: Kit = {
  provider: 'chat',
  defaultBaseUrl: 'https://slack.com/api/',
  schemes: ['https:', 'http:'],
  classify(err, token) {
    const bound = boundFailure(err);
    if (bound) return bound;
    const e = err as { code?: string; retryAfter?: number; statusCode?: number; headers?: Record<string, string>; data?: { error?: string } };
    switch (e?.code) {
      case 'slack_webapi_rate_limited_error':
        return { status: 429, retryAfterSeconds: e.retryAfter ?? null, reason: 'ratelimited' };
      case 'slack_webapi_http_error':
        return { status: e.statusCode ?? 500, retryAfterSeconds: retryAfterOf(e.headers?.['retry-after']), reason: reasonOf((err as Error).message, token) };
      case 'slack_webapi_platform_error': {
        // Slack's error is a code; a compatible server may put anything there (the token itself, echoed)
        const code = e.data?.error ?? 'error';
        const reason = reasonOf(code, token);
        return { status: SLACK_AUTH_ERRORS.has(code) ? 401 : code === 'ratelimited' ? 429 : 400, retryAfterSeconds: null, reason };
      }
      case 'slack_webapi_request_error':
        return { status: null, retryAfterSeconds: null, reason: reasonOf((err as Error).message, token) };
      default:
        return null;
    }
  },
  async identify(a) {
    const slack = await slackOf(a);
    const me = await slack.auth.test();
    return {
      identity: [me.user, me.team].filter(Boolean).join(' in ') || null,
      capabilities: me.response_metadata?.scopes ?? [],
    };
  },
};

// ---- tracker: Linear ----

export async function linearOf(a: Access) {
  const { LinearClient } = await import('@linear/sdk');
  // the SDK takes no fetch of its own, but hands these options on to the global one: no redirect, and the dispatcher
  const dispatcher = await dispatcherOf(a.allowPrivate);
  return new LinearClient({ apiKey: a.token, ...(a.baseUrl ? { apiUrl: a.baseUrl } : {}), signal: a.signal, redirect: 'error', dispatcher } as never);
}

/** Linear's error types that say more than the HTTP status (a refused key comes as a 400 with an authentication error). */
const LINEAR_STATUS: Record<string, number> = { AuthenticationError: 401, Forbidden: 403, FeatureNotAccessible: 403, Ratelimited: 429, InvalidInput: 400 };

export const trackerKit: Kit = {
  provider: 'tracker',
  defaultBaseUrl: 'https://api.linear.app/graphql',
  schemes: ['https:', 'http:'],
  classify(err, token) {
    const bound = boundFailure(err);
    if (bound) return bound;
    const e = err as { name?: string; type?: string; status?: number; retryAfter?: number; raw?: { response?: { headers?: Headers } } };
    if (!e || typeof e.type !== 'string' || !('errors' in (e as object))) return null;
    const answered = typeof e.status === 'number' && e.status >= 400 ? e.status : null;
    // no status and no telling type: the request never got an answer
    const status = LINEAR_STATUS[e.type] ?? answered ?? (e.type === 'InternalError' ? 500 : null);
    const retryAfter = e.retryAfter ?? retryAfterOf(e.raw?.response?.headers?.get?.('retry-after'));
    return { status, retryAfterSeconds: retryAfter ?? null, reason: reasonOf(e.type, token) };
  },
  async identify(a) {
    const linear = await linearOf(a);
    const viewer = await linear.viewer;
    // a Linear key acts as its user: a member (or a guest, on the teams it was invited to), an admin or not
    const role = [viewer.guest ? 'guest' : 'member', ...(viewer.admin ? ['admin'] : []), ...(viewer.active === false ? ['inactive'] : [])];
    return { identity: viewer.email || viewer.name || viewer.id, capabilities: role };
  },
};

// ---- pager: PagerDuty ----

/** A PagerDuty answer of 400 or more. */
class PagerAnswerError extends Error {
  constructor(
    readonly status: number,
    readonly retryAfter: string | null,
    reason: string,
  ) {
    super(reason);
    this.name = 'PagerAnswerError';
  }
}

/** A PagerDuty answer of success that did not come whole (or was not JSON): what was asked happened, its answer is lost. */
class PagerNoAnswerError extends Error {
  override name = 'PagerNoAnswerError';
}

/** No answer came: no connection, a name the guarded lookup refused, a redirect. */
class PagerUnreachableError extends Error {
  override name = 'PagerUnreachableError';
}

/**
 * One PagerDuty REST call, plain JSON through fetchOf (its bounds, its guarded lookup, no redirect), made once: the
 * retry layer alone asks again (pdjs re-sent a 429 three times at once, and the retry layer repeated that: 12
 * requests in 2 s for one call). `from` is the user the change is made as (PagerDuty's From header).
 */
export async function pagerCall(a: Access, method: 'GET' | 'POST' | 'PUT', path: string, data?: object): Promise<Record<string, unknown>> {
  const base = (a.baseUrl ?? pagerKit.defaultBaseUrl!).replace(/\/+$/, '');
  const headers: Record<string, string> = {
    accept: 'application/vnd.pagerduty+json;version=2',
    authorization: `Token token=${a.token}`,
    'user-agent': 'automation-service',
    ...(data ? { 'content-type': 'application/json' } : {}),
    ...(a.settings.from ? { from: a.settings.from } : {}),
  };
  // what the service's own bound or stop signal ended is for the retry layer to read as it is
  const ours = (err: unknown) => boundMet(err) !== null || a.signal?.aborted === true;
  const res = await (
    await fetchOf(a)
  )(`${base}${path}`, { method, headers, ...(data ? { body: JSON.stringify(data) } : {}) }).catch((err: unknown) => {
    if (ours(err) || !(err instanceof TypeError) || err.message !== 'fetch failed') throw err;
    throw new PagerUnreachableError((err.cause as Error | undefined)?.message ?? err.message);
  });
  const retryAfter = res.headers.get('retry-after');
  let body: unknown;
  try {
    const text = await res.text();
    body = res.status === 204 ? {} : JSON.parse(text);
  } catch (err) {
    if (ours(err)) throw err;
    // a refusal whose body is not JSON (a proxy's page) is that refusal
    if (res.status >= 400) throw new PagerAnswerError(res.status, retryAfter, `HTTP ${res.status}`);
    throw new PagerNoAnswerError(`the answer (HTTP ${res.status}) did not come whole`);
  }
  if (res.status >= 400) {
    const message = (body as { error?: { message?: unknown } } | null)?.error?.message;
    throw new PagerAnswerError(res.status, retryAfter, typeof message === 'string' ? message : `HTTP ${res.status}`);
  }
  return body && typeof body === 'object' ? (body as Record<string, unknown>) : {};
}

export const pagerKit: Kit = {
  provider: 'pager',
  defaultBaseUrl: 'https://api.pagerduty.com',
  schemes: ['https:', 'http:'],
  classify(err, token) {
    const bound = boundFailure(err);
    if (bound) return bound;
    if (err instanceof PagerAnswerError) return { status: err.status, retryAfterSeconds: retryAfterOf(err.retryAfter), reason: reasonOf(err.message, token) };
    // an answer of success that did not come whole: what was asked happened, only its answer is lost
    if (err instanceof PagerNoAnswerError) return { status: null, retryAfterSeconds: null, reason: err.message, unread: true };
    if (err instanceof PagerUnreachableError) return { status: null, retryAfterSeconds: null, reason: reasonOf(err.message, token) };
    return null;
  },
  async identify(a) {
    const abilities = await pagerCall(a, 'GET', '/abilities');
    return { identity: a.settings.from ?? null, capabilities: ((abilities.abilities as string[] | undefined) ?? []).map(String) };
  },
};

// ---- email: SMTP ----

/**
 * The connection nodemailer speaks SMTP over, its name looked up guarded as dispatcherOf's are (unless private
 * addresses are allowed): nodemailer looks names up itself (its own resolver, and a cache of five minutes for the
 * whole process), past the check of base_url, so a name whose answer changed after the check (rebinding) reached
 * loopback. Every address the name has is tried in turn (autoSelectFamily), as nodemailer would. A refused name is
 * nodemailer's EDNS, a connection that fails its ECONNECTION (or ETIMEDOUT): the provider could not be reached.
 * The stop signal ends the connection itself: nodemailer's timeouts are of silence, and a server that sends a
 * line now and then kept a connection the caller had given up on open for as long as it went on.
 */
function smtpSocket(
  host: string,
  port: number,
  o: { guarded: boolean; signal?: AbortSignal },
): (options: unknown, done: (err: Error | null, socket?: { connection: net.Socket }) => void) => void {
  return (_options, done) => {
    const socket = net.connect({ host, port, ...(o.guarded ? { lookup: guardedLookup } : {}), autoSelectFamily: true });
    let connected = false;
    const stop = () => (connected ? socket.destroy() : fail(Object.assign(new Error(`stopped before ${host}:${port} answered`), { code: 'ETIMEDOUT' })));
    const fail = (err: NodeJS.ErrnoException) => {
      socket.destroy();
      const code = ['EPRIVATE', 'ENOTFOUND', 'EAI_AGAIN'].includes(err.code ?? '') ? 'EDNS' : err.code === 'ETIMEDOUT' ? 'ETIMEDOUT' : 'ECONNECTION';
      done(Object.assign(new Error(err.message), { code }));
    };
    socket.setTimeout(SMTP_CONNECT_TIMEOUT_MS, () => fail(Object.assign(new Error(`no connection to ${host}:${port} within 10 s`), { code: 'ETIMEDOUT' })));
    socket.once('error', fail);
    socket.once('connect', () => {
      connected = true;
      socket.setTimeout(0);
      socket.off('error', fail);
      done(null, { connection: socket });
    });
    o.signal?.addEventListener('abort', stop, { once: true });
    socket.once('close', () => o.signal?.removeEventListener('abort', stop));
    if (o.signal?.aborted) stop();
  };
}
const SMTP_CONNECT_TIMEOUT_MS = 10_000;

export async function mailerOf(a: Access) {
  const nodemailer = (await import('nodemailer')).default;
  const url = new URL(a.baseUrl!);
  const host = url.hostname.replace(/^\[|\]$/g, '');
  const port = url.port ? Number(url.port) : url.protocol === 'smtps:' ? 465 : 587;
  return nodemailer.createTransport({
    host,
    getSocket: smtpSocket(host, port, { guarded: !a.allowPrivate, signal: a.signal }),
    port,
    secure: url.protocol === 'smtps:',
    // never the password in clear over the network: STARTTLS or nothing, but for a relay on this host
    requireTLS: url.protocol === 'smtp:' && !['127.0.0.1', 'localhost', '::1'].includes(host),
    auth: { user: a.settings.username, pass: a.token },
    connectionTimeout: 10_000,
    greetingTimeout: 10_000,
    socketTimeout: 30_000,
  });
}

/** `work`, or an ETIMEDOUT error (nodemailer's code for no answer) once `signal` aborts; the work goes on for others. */
export function untilAborted<T>(work: Promise<T>, signal: AbortSignal | undefined): Promise<T> {
  if (!signal) return work;
  return new Promise<T>((resolve, reject) => {
    const stop = () => reject(Object.assign(new Error('no answer in time'), { code: 'ETIMEDOUT' }));
    if (signal.aborted) return stop();
    signal.addEventListener('abort', stop, { once: true });
    work.then(resolve, reject).finally(() => signal.removeEventListener('abort', stop));
  });
}

const SMTP_UNREACHABLE = new Set(['ECONNECTION', 'ETIMEDOUT', 'ESOCKET', 'EDNS', 'ETLS']);

export const emailKit: Kit = {
  provider: 'email',
  defaultBaseUrl: null,
  schemes: ['smtp:', 'smtps:'],
  classify(err, token) {
    const e = err as { code?: string; responseCode?: number; response?: string };
    if (!e || typeof e.code !== 'string') return null;
    const reason = reasonOf(e.response ?? (err as Error).message, token);
    if (e.code === 'EAUTH') return { status: 401, retryAfterSeconds: null, reason };
    if (SMTP_UNREACHABLE.has(e.code)) return { status: null, retryAfterSeconds: null, reason };
    // SMTP 4xx is "try again later" (the mail was not taken: safe to send again), 5xx "never"
    if (typeof e.responseCode === 'number')
      return e.responseCode < 500 ? { status: 503, retryAfterSeconds: null, reason, unsent: true } : { status: 400, retryAfterSeconds: null, reason };
    return e.code.startsWith('E') ? { status: 400, retryAfterSeconds: null, reason } : null;
  },
  async identify(a) {
    const mailer = await mailerOf(a);
    try {
      // nodemailer's own timeouts are of silence: a server that sends a line every few seconds held verify for good
      await untilAborted(mailer.verify(), a.signal);
    } finally {
      mailer.close();
    }
    return { identity: a.settings.username ?? null, capabilities: ['send'] };
  },
};

export const KITS: Record<ConnectionProvider, Kit> = { codehost: codehostKit, chat: chatKit, tracker: trackerKit, pager: pagerKit, email: emailKit };
