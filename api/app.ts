// Builds the Express app from its dependencies. Opens no connection: api/main.ts and main.ts do.
import { METHODS } from 'node:http';
import express, { type Express, type Request, type RequestHandler } from 'express';
import * as OpenApiValidator from 'express-openapi-validator';
import { fastRouteLookup } from './route-matchers.js';
import {
  BadRequestError,
  ExpectationFailedError,
  NotFoundError,
  type EventHub,
  type Logger,
  type Metrics,
  type Queues,
  type Redis,
} from '../engine/platform/index.js';
import type { Engine } from '../engine/index.js';
import type { Store } from '../engine/store/index.js';
import { adminRouter } from './admin.js';
import { authenticate, rateLimit, whoIs } from './auth.js';
import { corsFor, signInRouter } from './sign-in.js';
import { docsRouter } from './docs.js';
import { problemHandler } from './problem.js';
import { requestLog } from './request-log.js';
import { automationsRouter } from './routes/automations.js';
import { autonomyRouter } from './routes/autonomy.js';
import { auditRouter } from './routes/audit.js';
import { healthRouter, type SandboxReport } from './routes/health.js';
import { runsRouter } from './routes/runs.js';
import { sessionsRouter } from './routes/sessions.js';
import { voiceRouter } from './routes/voice.js';
import { apiKeysRouter } from './routes/api-keys.js';
import { connectionsRouter } from './routes/connections.js';
import { notificationDeliveriesRouter, notificationEndpointsRouter } from './routes/notifications.js';
import { webhookDeliveriesRouter, webhookIntakeRouter, webhookSecretsRouter } from './routes/webhooks.js';
import { chain } from './chain.js';
import { requestBody } from './request-body.js';
import { finiteNumericQuery } from './numeric-query.js';
import { singleHeaders } from './single-headers.js';
import { loadSpec, pathPattern, type OpenApiDocument } from './spec.js';
import { OpenStreams } from './sse.js';

export type AppDeps = {
  engine: Engine;
  hub: EventHub;
  metrics: Metrics;
  sandbox: SandboxReport;
  sseHeartbeatMs: number;
  /** event streams one tenant may hold open on this server (SERVICE_TENANT_MAX_STREAMS) */
  maxStreamsPerTenant?: number;
  redis: Redis;
  store: Store;
  queues: Queues;
  log: Logger;
  auth: 'required' | 'none';
  adminKeys: string[];
  /** /openapi.json, /docs and /redoc exist only when true (never in production) */
  docs: boolean;
  /** validate our own responses against the spec too: on in tests */
  validateResponses?: boolean;
  /** people's sign-in (engine.sso) and the web client's origins */
  signIn: { corsOrigins: string[]; redirectUrl: string | null; sessionMaxSeconds: number };
};

/**
 * The spec as the validator wants it: Ajv reads `discriminator` to check a oneOf against the one
 * variant its property names (one error that names the missing field, not one per variant), but does
 * not take `mapping`, which the documentation pages use. The variants' `type` enums say the same.
 * Query values may carry reserved characters as they are (`?workspace=apps/web`,
 * `?since=2026-01-01T00:00:00Z`: RFC 3986 allows `/`, `:` and `?` in a query), so every query parameter
 * is read with `allowReserved`; the validator refused them unless percent-encoded.
 */
function forValidator<T>(spec: T): T {
  const strip = (node: unknown): unknown => {
    if (Array.isArray(node)) return node.map(strip);
    if (!node || typeof node !== 'object') return node;
    const out: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(node))
      out[k] = k === 'discriminator' && v && typeof v === 'object' ? { propertyName: (v as { propertyName: string }).propertyName } : strip(v);
    if (out.in === 'query' && typeof out.name === 'string') out.allowReserved = true;
    return out;
  };
  return strip(spec) as T;
}

/**
 * express-openapi-validator as the API runs it: every request under /api checked against the spec (query
 * coerced, bodies not; a oneOf with a discriminator checked against the variant its `type` names), our
 * own responses too when `validateResponses` (tests), its operation found by the route lookup of
 * route-matchers.ts. Exported for the benches' floor, which must check requests exactly as the service does.
 */
export function requestValidator(spec: OpenApiDocument, validateResponses: boolean) {
  fastRouteLookup();
  return OpenApiValidator.middleware({
    apiSpec: forValidator(spec) as never,
    validateRequests: { allErrors: true, allowUnknownQueryParameters: false, discriminator: true },
    validateResponses,
    validateSecurity: false,
    validateFormats: true,
    // full: a date-time's day is checked against its month (fast mode took 2027-02-30, which Date.parse rolls into March)
    ajvFormats: { mode: 'full' },
    // multipart bodies (voice uploads) are read by their route as they stream, with its own limits; never buffered here
    fileUploader: false,
    // in any case: a path that reaches an API route is never let through unchecked
    ignorePaths: (p: string) => !/^\/api\//i.test(p),
  });
}

/**
 * The API's validator, built once a process for each `validateResponses`: its Ajv compiles the whole spec
 * (about 0.4 s of CPU), and a process that makes several apps (the tests' services) has them share it. It
 * keeps nothing of an app's (the path parameters it installs on the first app it sees are unused: the
 * API's routes are on routers, whose parameters are their own).
 */
const validators = new Map<boolean, ReturnType<typeof requestValidator>>();
function sharedValidator(spec: OpenApiDocument, validateResponses: boolean) {
  let built = validators.get(validateResponses);
  if (!built) validators.set(validateResponses, (built = requestValidator(spec, validateResponses)));
  return built;
}

export function createApp(deps: AppDeps): Express {
  const app = express();
  app.disable('x-powered-by');
  app.set('query parser', 'simple');
  // the API's paths are the spec's, letter for letter: /API/v1/runs is not /api/v1/runs
  app.set('case sensitive routing', true);
  const streams = new OpenStreams(deps.maxStreamsPerTenant);
  app.locals.streams = streams;
  // aborted by the server's close: a request that waits (an audit's long-poll) answers at once what it has
  const closing = new AbortController();
  app.locals.closing = closing;
  // a route that answers stored JSON texts as they are (json-page.ts) parses them first when true
  app.locals.validateResponses = deps.validateResponses ?? false;

  app.use(
    chain(
      requestLog(app, { log: deps.log, httpDuration: deps.metrics.httpDuration, quiet: (p) => p === '/healthz' || p === '/readyz' }),
      // HTTP/1.1 requires Host (RFC 9112 §3.2): refused here, as a problem with the request's id (the server
      // lets such requests through for this: Node's own refusal was a bare 400)
      (req, _res, next) => {
        if (req.headers.host === undefined && req.httpVersionMajor === 1 && req.httpVersionMinor >= 1)
          throw new BadRequestError('An HTTP/1.1 request must carry a Host header (RFC 9112).');
        // the server hands such a request here for the same reason (Node's own answer was a bare 417)
        const expect = req.headers.expect;
        if (expect !== undefined && expect.trim().toLowerCase() !== '100-continue')
          throw new ExpectationFailedError(`The Expect header asks for ${JSON.stringify(expect.slice(0, 100))}: only 100-continue is met (RFC 9110).`);
        next();
      },
    ),
  );

  const spec = loadSpec();
  // providers sign the bytes they send: the intake reads them raw, with no API key, before any parser
  // (at the root, not mounted at /webhooks: a mount would follow the API's case-sensitive routing, and a
  // provider's URL has always matched in any case). A header of the spec's given twice is refused there too:
  // Node joined two delivery ids into one neither named (`d-1, d-2`, and `d-1` again was no replay of it)
  app.use(
    singleHeaders(
      spec,
      (req) => /^\/webhooks\/[^/]+\/[^/]+\/?$/i.test(req.path),
      (template) => template.startsWith('/webhooks/'),
    ),
  );
  app.use(webhookIntakeRouter(deps.engine));

  // Then the API: its requests are most of the traffic, and the routers after it (health, docs, the
  // dashboard, sign-in) have no path under /api/v1, so no API request walks them.
  // Who is calling comes first: an unauthenticated body is never parsed.
  // People: sign-in and its session cookie; the web client's origins may call with it (CORS, CSRF rule).
  const allowedOrigins = [...(deps.signIn.redirectUrl ? [new URL(deps.signIn.redirectUrl).origin] : []), ...deps.signIn.corsOrigins];
  // one Express layer (chain.ts)
  app.use(
    '/api/v1',
    chain(
      ...(deps.signIn.corsOrigins.length ? [corsFor(deps.signIn.corsOrigins)] : []),
      authenticate({ mode: deps.auth, apiKeys: deps.engine.apiKeys, sso: deps.engine.sso, allowedOrigins }),
      rateLimit(deps.engine.apiRateLimit),
      // JSON bodies, within their limits from before a byte is read; audio uploads (multipart or raw) count
      // their own bytes against their own limit as they stream
      ...requestBody(spec),
    ),
  );
  const underApi = (req: Request) => req.path === '/api' || req.path.startsWith('/api/');
  app.use(
    chain(
      // HEAD is GET without the body (RFC 9110), wherever GET is: checked as the GET it stands for (the spec
      // lists GETs), then routed as HEAD, which Express answers with the GET route and Node without a body
      (req, res, next) => {
        if (req.method === 'HEAD' && underApi(req)) {
          req.method = 'GET';
          res.locals.head = true;
        }
        next();
      },
      // no parameter of the spec is written in brackets (none is a deepObject): `status[a]=1` is refused as any
      // parameter the spec does not name is, where the validator made an object of it and failed on it (a 500)
      (req, _res, next) => {
        const bracketed = underApi(req) ? Object.keys(req.query as object).filter((k) => k.includes('[')) : [];
        if (!bracketed.length) return next();
        const errors = bracketed.map((k) => ({ path: `/query/${k}`, message: 'is not a parameter of this operation (lists are comma-separated)' }));
        throw Object.assign(new Error(errors.map((e) => `${e.path}: ${e.message}`).join('; ')), { status: 400, errors });
      },
      finiteNumericQuery(spec),
      singleHeaders(spec, underApi),
      ...sharedValidator(spec, deps.validateResponses ?? false),
      (req, res, next) => {
        if (res.locals.head) req.method = 'HEAD';
        next();
      },
    ),
  );
  app.use('/api/v1/automations', automationsRouter(deps.engine));
  app.use('/api/v1/autonomy', autonomyRouter(deps.engine, { hub: deps.hub, heartbeatMs: deps.sseHeartbeatMs, streams }));
  app.use('/api/v1/autonomy', auditRouter(deps.engine, { hub: deps.hub, heartbeatMs: deps.sseHeartbeatMs, streams, closing: closing.signal }));
  app.use('/api/v1/autonomy', voiceRouter(deps.engine, spec));
  app.use('/api/v1/runs', runsRouter(deps.engine));
  app.use('/api/v1/sessions', sessionsRouter(deps.engine, { hub: deps.hub, heartbeatMs: deps.sseHeartbeatMs, streams }));
  app.get('/api/v1/me', (req, res) => void res.json(whoIs(req)));
  app.use('/api/v1/api-keys', apiKeysRouter(deps.engine));
  app.use('/api/v1/webhook-secrets', webhookSecretsRouter(deps.engine));
  app.use('/api/v1/connections', connectionsRouter(deps.engine));
  app.use('/api/v1/notification-endpoints', notificationEndpointsRouter(deps.engine));
  app.use('/api/v1/notification-deliveries', notificationDeliveriesRouter(deps.engine));
  app.use('/api/v1/webhook-deliveries', webhookDeliveriesRouter(deps.engine));

  app.use(healthRouter({ redis: deps.redis, queuePrefix: deps.queues.prefix, store: deps.store, sandbox: deps.sandbox, log: deps.log }));
  if (deps.docs) app.use(docsRouter(spec));
  app.use(adminRouter({ queues: deps.queues, adminKeys: deps.adminKeys, metrics: deps.metrics }));
  app.use(signInRouter({ sso: deps.engine.sso, allowedOrigins, ...deps.signIn }));

  app.use(otherMethods(spec, { docs: Boolean(deps.docs), signIn: Boolean(deps.engine.sso) }));
  app.use((req) => {
    throw new NotFoundError(`no route ${req.method} ${req.path}`);
  });
  app.use(problemHandler());
  return app;
}

const DOCS_PATHS = new Set(['/docs', '/redoc', '/openapi.json']);

/**
 * The paths of the spec outside the API and the intake (health, docs, sign-in), asked with a method they do not
 * have: 405 with Allow, as the API's paths answer (a 404 there said the path did not exist). The docs' and
 * sign-in's paths only while they are served.
 */
function otherMethods(spec: OpenApiDocument, opts: { docs: boolean; signIn: boolean }): RequestHandler {
  const served = (template: string) =>
    !template.startsWith('/api/') &&
    !template.startsWith('/webhooks/') &&
    (opts.docs || !DOCS_PATHS.has(template)) &&
    (opts.signIn || !template.startsWith('/auth/'));
  const routes = Object.entries(spec.paths)
    .filter(([template]) => served(template))
    .map(([template, item]) => {
      const methods = Object.keys(item as object)
        .map((m) => m.toUpperCase())
        .filter((m) => METHODS.includes(m));
      if (methods.includes('GET')) methods.push('HEAD');
      // as the health, docs and sign-in routers match: any case
      return { path: pathPattern(template, { anyCase: true }), methods };
    });
  return (req, _res, next) => {
    const route = req.method === 'OPTIONS' ? undefined : routes.find((r) => r.path.test(req.path));
    if (!route || route.methods.includes(req.method)) return next();
    throw Object.assign(new Error(`${req.method} method not allowed`), { status: 405, headers: { Allow: route.methods.join(', ') } });
  };
}
