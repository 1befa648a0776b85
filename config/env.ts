// The only reader of process.env. Parses every variable once, at start, into a typed Config;
// a bad environment throws one ConfigError that names every bad variable. The command-line tool reads it
// before it knows its command, so it imports nothing of the service's runtime (no Redis client: the URL's
// parser is apart).
import path from 'node:path';
import { z } from 'zod';
import { TOOL_NAMES, type ToolName } from '../engine/platform/records.js';
import { hasHashTag, parseRedisUrl } from '../engine/platform/redis-url.js';
import { publicKeyFromText } from '../engine/evidence/keys.js';

export type ApiKeySeed = { tenantId: string; key: string };

export type NotifyConfig = {
  /** tries of one delivery, the first included */
  attempts: number;
  /** the first wait between tries; each next one doubles */
  backoffMs: number;
  /** deliveries failed for good in a row that disable an endpoint */
  disableAfter: number;
  timeoutMs: number;
  /** tries of one tenant's deliveries in flight at once, over every process: endpoints that never answer hold no more */
  tenantConcurrency: number;
  /** endpoints a tenant keeps: each event of the tenant is one stored delivery and one job per endpoint, made in its append */
  maxEndpoints: number;
  /** days an ended delivery (its event's payload with it) is kept after its last try (SERVICE_NOTIFICATION_DELIVERIES_KEPT_DAYS) */
  deliveriesKeptDays: number;
};

export type Config = {
  nodeEnv: string;
  isProduction: boolean;
  port: number;
  redisUrl: string;
  /** REDIS_URL was given: no private redis-server is ever started in its place */
  redisUrlSet: boolean;
  mongodbUri: string | undefined;
  /** which store: mongo when MONGODB_URI is set; sqlite otherwise (in production only when SERVICE_STORE=sqlite says so) */
  store: 'sqlite' | 'mongo';
  dataDir: string;
  queuePrefix: string;
  apiKeys: ApiKeySeed[];
  auth: 'required' | 'none';
  workspaceRoot: string;
  auditAllowSensitivePaths: boolean;
  /** production: folders besides a tenant's root that audits may look at */
  auditAllowedRoots: string[];
  audit: {
    reportTtlSeconds: number;
    reportsMax: number;
    tenantMaxRunning: number;
    phaseTimeoutSeconds: number;
    registryUrl: string | null;
    concurrency: number;
    /** phases of one tenant running at once over every worker process (SERVICE_AUDIT_TENANT_CONCURRENCY) */
    tenantConcurrency: number;
  };
  adminKeys: string[];
  secretKey: string | undefined;
  /** the Ed25519 seed that signs the evidence ledger (SERVICE_EVIDENCE_KEY); generated into the data dir outside production */
  evidenceKey: string | undefined;
  /** the ledger's earlier public keys (SERVICE_EVIDENCE_PREVIOUS_KEYS): entries they signed before a rotation still verify */
  evidencePreviousKeys: string[];
  tenantMaxRunning: number;
  /** runs of one tenant that may wait in its line; a new run past it is a 429 (SERVICE_TENANT_MAX_WAITING) */
  tenantMaxWaiting: number;
  /** MB of step output a tenant's runs stream into the event log a UTC day; the rest is not streamed (SERVICE_TENANT_OUTPUT_MB_PER_DAY) */
  tenantOutputMbPerDay: number;
  /** how many times a run cut off by a crash runs again before it ends `worker-lost` (SERVICE_RUN_LOST_RERUNS) */
  runLostReruns: number;
  agent: { baseUrl: string | undefined; apiKey: string | undefined; model: string | undefined; timeoutSeconds: number; maxRetries: number };
  /** voice transcription (SERVICE_TRANSCRIBE_*); provider undefined: the route answers 503 */
  transcribe: TranscribeConfig;
  webhookReplayWindowSeconds: number;
  /** webhook requests one tenant may send per minute, over all kinds; more answer 429 */
  webhookRateLimitPerMinute: number;
  /** days an accepted delivery's body and event are kept after it was received; 0: for good (SERVICE_WEBHOOK_DELIVERIES_KEPT_DAYS) */
  webhookDeliveriesKeptDays: number;
  /** outbound notifications (SERVICE_NOTIFY_*, SERVICE_NOTIFICATION_*) */
  notify: NotifyConfig;
  /** /api/v1 requests a minute: per tenant (SERVICE_API_RATE_LIMIT_PER_MINUTE) and per key (SERVICE_API_KEY_RATE_LIMIT_PER_MINUTE, default the same) */
  apiRateLimit: { perTenantPerMinute: number; perKeyPerMinute: number };
  /** people's sign-in (SERVICE_OIDC_*); null: API keys only */
  oidc: OidcConfig | null;
  /** cookie sessions' idle and absolute lifetimes */
  sessions: { idleSeconds: number; maxSeconds: number };
  /** web origins that may call the API from a browser, with cookies (SERVICE_CORS_ORIGINS) */
  corsOrigins: string[];
  logLevel: string;
  /** a worker process's own /metrics and /healthz port (SERVICE_WORKER_METRICS_PORT); unset: none */
  workerMetricsPort: number | undefined;
  shutdownGraceSeconds: number;
  /** how long a request's body may send nothing before it is answered 408 and its connection closed */
  bodyIdleSeconds: number;
  /** defaultMaxSteps: the tool calls an attempt of a run with a goal may make when it names no max_steps */
  runBudget: { defaultSeconds: number; maxSeconds: number; defaultMaxSteps: number };
  workerConcurrency: number;
  /** gates one worker process runs at once */
  gatesConcurrency: number;
  /** gates of one tenant running at once, over every worker process */
  gatesTenantConcurrency: number;
  /** the http tool may reach private and loopback addresses */
  httpAllowPrivate: boolean;
  /** SERVICE_REDIS_TLS_INSECURE: a rediss: server's certificate is not verified (managed Redis with self-signed certificates) */
  redisTlsInsecure: boolean;
  sseHeartbeatSeconds: number;
  reconcileIntervalSeconds: number;
  /** days an ended run (its steps, turns and own session) is kept after it was made; 0: for good (SERVICE_RUNS_KEPT_DAYS) */
  runsKeptDays: number;
  /** days an API key is kept after it was revoked or expired (SERVICE_API_KEYS_SPENT_KEPT_DAYS); 0: for good */
  apiKeysSpentKeptDays: number;
  /** how long a worker's lock on a run lasts; a dead worker's run is noticed within about twice this */
  stalledIntervalSeconds: number;
  fileTriggerRefreshSeconds: number;
  /** the shortest interval a cron trigger may fire at (SERVICE_CRON_MIN_INTERVAL_SECONDS) */
  cronMinIntervalSeconds: number;
  /** the most tasks one session holds (SERVICE_SESSION_MAX_TASKS) */
  sessionMaxTasks: number;
  /** the most agents one session holds (SERVICE_SESSION_MAX_AGENTS) */
  sessionMaxAgents: number;
  /** the most event streams one tenant holds open on one web process (SERVICE_TENANT_MAX_STREAMS) */
  tenantMaxStreams: number;
  /** the most automations a tenant keeps, archived ones aside (SERVICE_TENANT_MAX_AUTOMATIONS) */
  tenantMaxAutomations: number;
  /** the most API keys not revoked a tenant may make through the API (SERVICE_TENANT_MAX_API_KEYS) */
  tenantMaxApiKeys: number;
  /** the most connections a tenant keeps (SERVICE_TENANT_MAX_CONNECTIONS) */
  tenantMaxConnections: number;
  /** the environment a shell step starts from: a short allowlist, never the service's secrets */
  childEnv: Record<string, string>;
  /** how tool processes are isolated: `auto` picks bwrap when it is installed; `explicit` when SERVICE_SANDBOX was set */
  sandbox: { mode: 'bwrap' | 'none' | 'auto'; explicit: boolean; allowNetwork: boolean; limits: SandboxLimits };
  /** the tools tenants may use at all; a run's or automation's allowlist can only narrow it */
  toolsAllowed: ToolName[];
};

/** Voice transcription: `openai` is any OpenAI-compatible /audio/transcriptions endpoint; `local` runs on this machine. */
export type OidcConfig = {
  issuer: string;
  clientId: string;
  clientSecret: string;
  redirectUrl: string;
  /** the ID token claim that names the tenant */
  tenantClaim: string;
  /** claim value to tenant; a value not in a non-empty map is refused */
  tenantMap: Record<string, string>;
  /** when set, only people whose verified email is in one of these domains */
  allowedEmailDomains: string[];
};

export type TranscribeConfig = {
  provider: 'openai' | 'local' | undefined;
  baseUrl: string | undefined;
  apiKey: string | undefined;
  model: string | undefined;
  maxSeconds: number;
};

/** Resource limits of one sandboxed step. */
export type SandboxLimits = { cpuSeconds: number; memoryMb: number; processes: number; fileSizeMb: number };

const CHILD_ENV_NAMES = ['PATH', 'HOME', 'LANG', 'LANGUAGE', 'TZ', 'TERM', 'SHELL', 'USER', 'LOGNAME', 'TMPDIR'];

export class ConfigError extends Error {
  constructor(readonly problems: string[]) {
    super(`invalid environment:\n${problems.map((p) => `  - ${p}`).join('\n')}`);
    this.name = 'ConfigError';
  }
}

export const TENANT_ID_PATTERN = /^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$/;
/** The longest a notification may wait, over all its tries, before its last one. */
export const NOTIFY_WAIT_MAX_MS = 7 * 86_400_000;
const TRUE = new Set(['1', 'true', 'yes', 'on']);
const FALSE = new Set(['0', 'false', 'no', 'off', '']);

const flag = z
  .string()
  .optional()
  .transform((v, ctx) => {
    const s = (v ?? '').trim().toLowerCase();
    if (TRUE.has(s)) return true;
    if (FALSE.has(s)) return false;
    ctx.addIssue({ code: 'custom', message: `expected 1/0, true/false, yes/no or on/off, got "${v}"` });
    return z.NEVER;
  });

/** A switch SPEC names by its one value `1` (a setting that widens what is reachable): anything else but 0 or unset is refused. */
const exactlyOne = z
  .string()
  .optional()
  .transform((v, ctx) => {
    const s = (v ?? '').trim();
    if (s === '1') return true;
    if (s === '0' || s === '') return false;
    ctx.addIssue({ code: 'custom', message: `expected 1 (on) or 0 (off), got "${v}"` });
    return z.NEVER;
  });

const int = (def: number, min: number, max: number) =>
  z
    .string()
    .optional()
    .transform((v, ctx) => {
      if (v === undefined || v.trim() === '') return def;
      // digits only: Number() also reads 0x1E, 1e3 and 0b11
      const n = /^\s*\d+\s*$/.test(v) ? Number(v) : NaN;
      if (!Number.isInteger(n) || n < min || n > max) {
        ctx.addIssue({ code: 'custom', message: `expected a whole number from ${min} to ${max}, got "${v}"` });
        return z.NEVER;
      }
      return n;
    });

const optionalText = z
  .string()
  .optional()
  .transform((v) => (v === undefined || v.trim() === '' ? undefined : v.trim()));

const url = (protocols: string[], def?: string) =>
  z
    .string()
    .optional()
    .transform((v, ctx) => {
      const s = v === undefined || v.trim() === '' ? def : v.trim();
      if (s === undefined) return undefined;
      try {
        const u = new URL(s);
        if (!protocols.includes(u.protocol)) throw new Error('protocol');
        return s;
      } catch {
        ctx.addIssue({ code: 'custom', message: `expected a ${protocols.join(' or ')} URL` });
        return z.NEVER;
      }
    });

/**
 * A MongoDB connection string: its scheme and a host are checked here, the rest by the driver as it connects.
 * A replica set's seed list (`mongodb://db1:27017,db2:27017/app?replicaSet=rs0`) is no WHATWG URL.
 */
const mongodbUri = z
  .string()
  .optional()
  .transform((v, ctx) => {
    const s = v?.trim();
    if (!s) return undefined;
    if (!/^mongodb(\+srv)?:\/\/[^\s/?#]+([/?][^\s]*)?$/.test(s)) {
      ctx.addIssue({ code: 'custom', message: 'expected a mongodb:// or mongodb+srv:// connection string' });
      return z.NEVER;
    }
    return s;
  });

/** 32 bytes as 64 hex characters or as base64 (padded or not): Buffer.from skips what is not base64, so the text is checked first. */
const is32Bytes = (v: string) => /^[0-9a-fA-F]{64}$/.test(v) || (/^[A-Za-z0-9+/_-]{43}=?$/.test(v) && Buffer.from(v, 'base64').length === 32);

/** An http(s) origin as a browser sends it (`https://App.Example.com:443` is `https://app.example.com`); null for anything more or else. */
function originOf(text: string): string | null {
  if (!/^https?:\/\/[^/\s?#@]+\/?$/i.test(text)) return null;
  try {
    return new URL(text).origin;
  } catch {
    return null;
  }
}

const list = z
  .string()
  .optional()
  .transform((v) =>
    (v ?? '')
      .split(',')
      .map((s) => s.trim())
      .filter(Boolean),
  );

const apiKeySeeds = list.transform((items, ctx) => {
  const seeds: ApiKeySeed[] = [];
  for (const [i, item] of items.entries()) {
    const at = item.indexOf(':');
    const tenantId = item.slice(0, at);
    const key = item.slice(at + 1);
    if (at < 1 || !TENANT_ID_PATTERN.test(tenantId) || key.length < 16) {
      // never echo the key itself: this message reaches logs
      ctx.addIssue({
        code: 'custom',
        message: `entry ${i + 1} must be tenant:key with a tenant id of letters, digits, _ or - and a key of at least 16 characters`,
      });
      return z.NEVER;
    }
    const bound = seeds.find((s) => s.key === key);
    if (bound && bound.tenantId !== tenantId) {
      ctx.addIssue({
        code: 'custom',
        message: `entry ${i + 1} gives tenant ${tenantId} the key entry ${seeds.indexOf(bound) + 1} gives tenant ${bound.tenantId}: a key opens one tenant`,
      });
      return z.NEVER;
    }
    seeds.push({ tenantId, key });
  }
  return seeds;
});

const schema = z.object({
  NODE_ENV: z
    .string()
    .optional()
    .transform((v) => v?.trim() || 'development')
    // Node's libraries (Express among them) and this service take only `production`, in lower case, for production:
    // `Production` or `prod` ran with every production guard off (auth none, generated keys) and no word of it
    .refine((v) => v === 'production' || !/^prod(uction)?$/i.test(v), {
      message: 'write production, in lower case: this value is not production to the service or its libraries',
    }),
  PORT: int(8080, 0, 65535),
  REDIS_URL: z
    .string()
    .optional()
    .transform((v, ctx) => {
      const s = v?.trim() || 'redis://127.0.0.1:6379';
      try {
        parseRedisUrl(s);
        return s;
      } catch (err) {
        ctx.addIssue({ code: 'custom', message: (err as Error).message });
        return z.NEVER;
      }
    }),
  MONGODB_URI: mongodbUri,
  SERVICE_STORE: optionalText.pipe(z.enum(['sqlite', 'mongo'], { message: 'expected "sqlite" or "mongo"' }).optional()),
  SERVICE_DATA_DIR: z
    .string()
    .optional()
    .transform((v) => path.resolve(v?.trim() || 'data')),
  SERVICE_QUEUE_PREFIX: z
    .string()
    .optional()
    .transform((v) => v?.trim() || 'svc')
    .pipe(
      z
        .string()
        .regex(/^(?=.{1,64}$)[A-Za-z0-9_.-]*(\{[A-Za-z0-9_.-]+\})?[A-Za-z0-9_.-]*$/, 'expected 1-64 letters, digits, _ . or -, with at most one {hash tag}'),
    ),
  SERVICE_API_KEYS: apiKeySeeds,
  SERVICE_AUTH: z
    .string()
    .optional()
    .transform((v) => v?.trim() || 'required')
    .pipe(z.enum(['required', 'none'], { message: 'expected "required" or "none"' })),
  SERVICE_SANDBOX: z
    .string()
    .optional()
    .transform((v) => v?.trim() || 'auto')
    .pipe(z.enum(['bwrap', 'none', 'auto'], { message: 'expected "bwrap" or "none"' })),
  SERVICE_SANDBOX_ALLOW_NETWORK: flag,
  SERVICE_SANDBOX_CPU_SECONDS: int(600, 1, 86_400),
  SERVICE_SANDBOX_MEMORY_MB: int(4096, 64, 1_048_576),
  SERVICE_SANDBOX_PROCESSES: int(256, 8, 100_000),
  SERVICE_SANDBOX_FILE_SIZE_MB: int(1024, 1, 1_048_576),
  SERVICE_TOOLS_ALLOWED: list.transform((names, ctx) => {
    if (!names.length) return [...TOOL_NAMES];
    const unknown = names.filter((n) => !(TOOL_NAMES as readonly string[]).includes(n));
    if (unknown.length) {
      ctx.addIssue({ code: 'custom', message: `unknown tools ${unknown.join(', ')}; expected some of ${TOOL_NAMES.join(', ')}` });
      return z.NEVER;
    }
    return [...new Set(names)] as ToolName[];
  }),
  SERVICE_WORKSPACE_ROOT: z
    .string()
    .optional()
    .transform((v) => path.resolve(v?.trim() || 'workspaces')),
  SERVICE_AUDIT_ALLOW_SENSITIVE_PATHS: exactlyOne,
  SERVICE_AUDIT_ALLOWED_ROOTS: list,
  SERVICE_AUDIT_REPORT_TTL_SECONDS: int(3600, 1, 30 * 86_400),
  SERVICE_AUDIT_REPORTS_MAX: int(50, 1, 10_000),
  SERVICE_AUDIT_PHASE_TIMEOUT_SECONDS: int(600, 1, 86_400),
  SERVICE_AUDIT_CONCURRENCY: int(4, 1, 100),
  SERVICE_AUDIT_TENANT_MAX_RUNNING: int(3, 1, 1000),
  SERVICE_AUDIT_TENANT_CONCURRENCY: int(0, 0, 1000),
  SERVICE_AUDIT_REGISTRY_URL: z
    .string()
    .optional()
    .transform((v) => v?.trim() || 'https://registry.npmjs.org')
    .pipe(z.union([z.literal('none'), z.url({ protocol: /^https?$/, message: 'expected an http(s) URL or "none"' })])),
  SERVICE_ADMIN_KEYS: list.refine((keys) => keys.every((k) => k.length >= 16), 'every admin key must be at least 16 characters'),
  SERVICE_SECRET_KEY: optionalText.refine((v) => v === undefined || is32Bytes(v), 'expected 32 bytes as 64 hex characters or base64'),
  SERVICE_EVIDENCE_KEY: optionalText.refine((v) => v === undefined || is32Bytes(v), 'expected a 32-byte Ed25519 seed as 64 hex characters or base64'),
  // each an Ed25519 public key: its 32 raw bytes (hex or base64), or the base64 line of its PEM (44 bytes)
  SERVICE_EVIDENCE_PREVIOUS_KEYS: list.refine(
    (keys) => keys.every((k) => publicKeyFromText(k) !== null),
    'expected Ed25519 public keys, comma-separated: each 64 hex characters, or the base64 of its 32 bytes or of its PEM',
  ),
  SERVICE_TENANT_MAX_RUNNING: int(10, 1, 10_000),
  SERVICE_TENANT_MAX_WAITING: int(50_000, 1, 10_000_000),
  SERVICE_TENANT_OUTPUT_MB_PER_DAY: int(256, 1, 1_000_000),
  SERVICE_RUN_LOST_RERUNS: int(2, 0, 100),
  SERVICE_AGENT_BASE_URL: url(['http:', 'https:']),
  SERVICE_AGENT_API_KEY: optionalText,
  SERVICE_AGENT_MODEL: optionalText,
  SERVICE_AGENT_TIMEOUT_SECONDS: int(120, 1, 3600),
  SERVICE_AGENT_MAX_RETRIES: int(3, 0, 10),
  SERVICE_TRANSCRIBE_PROVIDER: optionalText.pipe(z.enum(['openai', 'local'], { message: 'expected "openai" or "local"' }).optional()),
  SERVICE_TRANSCRIBE_BASE_URL: url(['http:', 'https:']),
  SERVICE_TRANSCRIBE_API_KEY: optionalText,
  SERVICE_TRANSCRIBE_MODEL: optionalText,
  SERVICE_TRANSCRIBE_MAX_SECONDS: int(600, 1, 86_400),
  SERVICE_WEBHOOK_REPLAY_WINDOW_SECONDS: int(300, 1, 86_400),
  SERVICE_WEBHOOK_RATE_LIMIT_PER_MINUTE: int(1200, 1, 10_000_000),
  SERVICE_WEBHOOK_DELIVERIES_KEPT_DAYS: int(30, 0, 36_500),
  SERVICE_NOTIFY_ATTEMPTS: int(8, 1, 50),
  SERVICE_NOTIFY_BACKOFF_MS: int(5000, 1, 3_600_000),
  SERVICE_NOTIFY_DISABLE_AFTER: int(10, 1, 10_000),
  SERVICE_NOTIFY_TIMEOUT_SECONDS: int(15, 1, 300),
  SERVICE_NOTIFY_TENANT_CONCURRENCY: int(5, 1, 1000),
  SERVICE_TENANT_MAX_NOTIFICATION_ENDPOINTS: int(50, 1, 1000),
  SERVICE_NOTIFICATION_DELIVERIES_KEPT_DAYS: int(30, 1, 3650),
  SERVICE_API_RATE_LIMIT_PER_MINUTE: int(6000, 1, 100_000_000),
  SERVICE_OIDC_ISSUER: url(['http:', 'https:']),
  SERVICE_OIDC_CLIENT_ID: optionalText,
  SERVICE_OIDC_CLIENT_SECRET: optionalText,
  SERVICE_OIDC_REDIRECT_URL: url(['http:', 'https:']),
  SERVICE_OIDC_TENANT_CLAIM: optionalText,
  // split at the last colon (a claim value may hold colons: urn:org:acme); the tenant as sign-in takes it
  SERVICE_OIDC_TENANT_MAP: list.refine(
    (pairs) => pairs.every((p) => p.lastIndexOf(':') > 0 && TENANT_ID_PATTERN.test(p.slice(p.lastIndexOf(':') + 1))),
    'expected claim-value:tenant pairs separated by commas, each tenant a letter or digit then up to 63 of letters, digits, _ and -',
  ),
  SERVICE_OIDC_ALLOWED_EMAIL_DOMAINS: list,
  SERVICE_SESSION_IDLE_SECONDS: int(8 * 3600, 60, 30 * 86_400),
  SERVICE_SESSION_MAX_SECONDS: int(7 * 86_400, 60, 365 * 86_400),
  // kept as a browser sends an Origin (a lower-case host, no default port), which is what they are compared with
  SERVICE_CORS_ORIGINS: list
    .refine(
      (origins) => origins.every((o) => originOf(o) !== null),
      'expected origins such as https://app.example.com (a scheme and a host, no path), separated by commas',
    )
    .transform((origins) => origins.map((o) => originOf(o)!)),
  // 0: the tenant's figure
  SERVICE_API_KEY_RATE_LIMIT_PER_MINUTE: int(0, 0, 100_000_000),
  SERVICE_WORKER_METRICS_PORT: int(0, 0, 65535),
  SERVICE_SHUTDOWN_GRACE_SECONDS: int(10, 1, 3600), // at least 1 s for interrupted runs to go back to the queue before the exit
  SERVICE_BODY_IDLE_SECONDS: int(30, 1, 3600),
  SERVICE_RUN_DEFAULT_BUDGET_SECONDS: int(600, 1, 86_400),
  SERVICE_RUN_MAX_BUDGET_SECONDS: int(3600, 1, 86_400),
  SERVICE_RUN_DEFAULT_MAX_STEPS: int(200, 1, 10_000),
  SERVICE_WORKER_CONCURRENCY: int(10, 1, 1000),
  SERVICE_GATES_CONCURRENCY: int(4, 1, 100),
  // 0: one less than SERVICE_GATES_CONCURRENCY (at least 1), so that one tenant's gates leave a place for another's
  // (all of them with SERVICE_AUTH=none)
  SERVICE_GATES_TENANT_CONCURRENCY: int(0, 0, 1000),
  SERVICE_HTTP_ALLOW_PRIVATE: flag,
  SERVICE_REDIS_TLS_INSECURE: flag,
  SERVICE_SSE_HEARTBEAT_SECONDS: int(15, 1, 300),
  SERVICE_RECONCILE_INTERVAL_SECONDS: int(30, 1, 3600),
  SERVICE_RUNS_KEPT_DAYS: int(90, 0, 36_500),
  SERVICE_API_KEYS_SPENT_KEPT_DAYS: int(90, 0, 36_500),
  SERVICE_STALLED_INTERVAL_SECONDS: int(15, 1, 600),
  SERVICE_FILE_TRIGGER_REFRESH_SECONDS: int(5, 1, 3600),
  SERVICE_CRON_MIN_INTERVAL_SECONDS: int(60, 1, 86_400),
  SERVICE_SESSION_MAX_TASKS: int(10_000, 1, 1_000_000),
  SERVICE_SESSION_MAX_AGENTS: int(100, 1, 10_000),
  SERVICE_TENANT_MAX_STREAMS: int(100, 1, 100_000),
  SERVICE_TENANT_MAX_AUTOMATIONS: int(1000, 1, 1_000_000),
  SERVICE_TENANT_MAX_API_KEYS: int(1000, 1, 1_000_000),
  SERVICE_TENANT_MAX_CONNECTIONS: int(200, 1, 100_000),
  LOG_LEVEL: z
    .string()
    .optional()
    .transform((v) => v?.trim() || 'info')
    .pipe(z.enum(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'], { message: 'expected a pino level' })),
});

type Parsed = z.infer<typeof schema>;

/**
 * What the variables say together (each read alone already): one message each. `service`: the rules of a
 * process that serves (its keys, its shared store, no SERVICE_AUTH=none in production); a local tool that
 * starts no service (`gates run`) is held to the rest.
 */
function problemsTogether(e: Parsed, service = true): string[] {
  const isProduction = e.NODE_ENV === 'production' && service;
  const problems: string[] = [];
  if (isProduction && e.SERVICE_AUTH === 'none') problems.push('SERVICE_AUTH: "none" is refused when NODE_ENV=production');
  if (isProduction && !e.SERVICE_SECRET_KEY) problems.push('SERVICE_SECRET_KEY: required when NODE_ENV=production');
  if (isProduction && !e.SERVICE_EVIDENCE_KEY) problems.push('SERVICE_EVIDENCE_KEY: required when NODE_ENV=production');
  if (e.SERVICE_STORE === 'mongo' && !e.MONGODB_URI) problems.push('SERVICE_STORE: "mongo" needs MONGODB_URI');
  if (e.SERVICE_STORE === 'sqlite' && e.MONGODB_URI) problems.push('SERVICE_STORE: "sqlite" and MONGODB_URI are both set; pick one store');
  // web and worker on separate machines, or on ephemeral disks, cannot share a SQLite file
  if (isProduction && !e.MONGODB_URI && e.SERVICE_STORE !== 'sqlite')
    problems.push(
      'MONGODB_URI: required when NODE_ENV=production (web and worker processes share the store); set SERVICE_STORE=sqlite to run on one machine with a persistent disk instead',
    );
  if (e.SERVICE_RUN_DEFAULT_BUDGET_SECONDS > e.SERVICE_RUN_MAX_BUDGET_SECONDS) {
    problems.push('SERVICE_RUN_DEFAULT_BUDGET_SECONDS: must not exceed SERVICE_RUN_MAX_BUDGET_SECONDS');
  }
  if (parseRedisUrl(e.REDIS_URL).cluster && !hasHashTag(e.SERVICE_QUEUE_PREFIX))
    problems.push(
      `SERVICE_QUEUE_PREFIX: on a Redis Cluster it must carry a hash tag, as in {${e.SERVICE_QUEUE_PREFIX}}, so that each script's keys share a slot`,
    );
  if (e.SERVICE_TRANSCRIBE_PROVIDER === 'openai' && !e.SERVICE_TRANSCRIBE_API_KEY)
    problems.push('SERVICE_TRANSCRIBE_API_KEY: required when SERVICE_TRANSCRIBE_PROVIDER=openai');
  // BullMQ doubles the wait before each try: the waits before the last must stay in what a date can hold, and in reason
  const notifyWaitMs = e.SERVICE_NOTIFY_BACKOFF_MS * (2 ** (e.SERVICE_NOTIFY_ATTEMPTS - 1) - 1);
  if (notifyWaitMs > NOTIFY_WAIT_MAX_MS)
    problems.push(
      `SERVICE_NOTIFY_ATTEMPTS, SERVICE_NOTIFY_BACKOFF_MS: ${e.SERVICE_NOTIFY_ATTEMPTS} tries, the first wait ${e.SERVICE_NOTIFY_BACKOFF_MS} ms and each next one doubled, wait ${Math.round(notifyWaitMs / 86_400_000)} days in all before the last; at most 7 days (fewer tries or a shorter first wait)`,
    );
  // half an endpoint starts cleanly and then refuses every agent run as agent-not-configured
  if ((e.SERVICE_AGENT_BASE_URL || e.SERVICE_AGENT_MODEL || e.SERVICE_AGENT_API_KEY) && !(e.SERVICE_AGENT_BASE_URL && e.SERVICE_AGENT_MODEL))
    problems.push(
      'SERVICE_AGENT_BASE_URL, SERVICE_AGENT_MODEL: set both for agent steps (SERVICE_AGENT_API_KEY with them when the endpoint asks for one), or none',
    );
  const oidcSet = [e.SERVICE_OIDC_ISSUER, e.SERVICE_OIDC_CLIENT_ID, e.SERVICE_OIDC_CLIENT_SECRET, e.SERVICE_OIDC_REDIRECT_URL];
  if (oidcSet.some(Boolean) && !oidcSet.every(Boolean))
    problems.push('SERVICE_OIDC_ISSUER, SERVICE_OIDC_CLIENT_ID, SERVICE_OIDC_CLIENT_SECRET, SERVICE_OIDC_REDIRECT_URL: set all four for sign-in, or none');
  if (isProduction && e.SERVICE_OIDC_ISSUER?.startsWith('http:')) problems.push('SERVICE_OIDC_ISSUER: must be https when NODE_ENV=production');
  // the sign-in's cookies are __Host- (Secure): a browser keeps none over http, and every sign-in would fail
  if (isProduction && e.SERVICE_OIDC_REDIRECT_URL?.startsWith('http:')) problems.push('SERVICE_OIDC_REDIRECT_URL: must be https when NODE_ENV=production');
  if (e.SERVICE_SESSION_IDLE_SECONDS > e.SERVICE_SESSION_MAX_SECONDS)
    problems.push('SERVICE_SESSION_IDLE_SECONDS: must not exceed SERVICE_SESSION_MAX_SECONDS');
  return problems;
}

/** The variables of the CLI's client (it reads them itself), which share the service's prefix. */
const CLIENT_VARIABLES = new Set(['SERVICE_URL', 'SERVICE_API_KEY']);
/**
 * What Kubernetes sets in every pod for each Service of its namespace (`<NAME>_SERVICE_HOST`, `<NAME>_PORT_80_TCP_ADDR`,
 * ...): a Service named `service...` gives names with the service's prefix that no operator wrote.
 */
const isKubernetesServiceLink = (name: string, value: string): boolean =>
  /_SERVICE_(HOST|PORT)(_[A-Z0-9_]+)?$/.test(name) ||
  /_PORT_\d+_(TCP|UDP|SCTP)_(PROTO|PORT|ADDR)$/.test(name) ||
  // (`<NAME>_PORT` is an address: SERVICE_WORKER_METRIC_PORT=9100, a setting misspelled, is still refused)
  (/_PORT(_\d+_(TCP|UDP|SCTP))?$/.test(name) && /^(tcp|udp|sctp):\/\//.test(value));

/** How many single-character edits turn `a` into `b` (Levenshtein). */
function editDistance(a: string, b: string): number {
  let row = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    const next = [i];
    for (let j = 1; j <= b.length; j++) next[j] = Math.min(row[j]! + 1, next[j - 1]! + 1, row[j - 1]! + (a[i - 1] === b[j - 1] ? 0 : 1));
    row = next;
  }
  return row[b.length]!;
}

/**
 * The SERVICE_* variables set that are no setting of this service: a name misspelled was taken as its default
 * in silence (SERVICE_SHUTDOWN_GRACE_SECOND=120 ran with 10 s of grace). Each named, with the setting it is
 * likely meant to be.
 */
function unknownVariables(env: Record<string, string | undefined>): string[] {
  const known = Object.keys(schema.shape).filter((k) => k.startsWith('SERVICE_'));
  return Object.keys(env)
    .filter(
      (name) =>
        name.startsWith('SERVICE_') &&
        env[name] !== undefined &&
        !(name in schema.shape) &&
        !CLIENT_VARIABLES.has(name) &&
        !isKubernetesServiceLink(name, env[name]),
    )
    .sort()
    .map((name) => {
      const [nearest] = known.map((k) => [k, editDistance(name, k)] as const).sort((x, y) => x[1] - y[1]);
      const hint = nearest && nearest[1] <= 3 ? `did you mean ${nearest[0]}?` : "the README's configuration table lists them";
      return `${name}: not a setting of this service (${hint})`;
    });
}

export function parseEnv(env: Record<string, string | undefined>, opts: { service?: boolean } = {}): Config {
  const unknown = unknownVariables(env);
  const parsed = schema.safeParse(env);
  if (unknown.length && parsed.success) throw new ConfigError([...unknown, ...problemsTogether(parsed.data, opts.service)]);
  if (!parsed.success) {
    // every bad variable in one message: those that do not read, then what the others say together (read
    // with the bad ones left to their defaults, so a rule that names one of them is left to its own message)
    const bad = [...new Set(parsed.error.issues.map((i) => String(i.path[0])))];
    const rest = schema.safeParse({ ...env, ...Object.fromEntries(bad.map((name) => [name, undefined])) });
    const together = rest.success ? problemsTogether(rest.data, opts.service).filter((p) => !bad.some((name) => p.includes(name))) : [];
    throw new ConfigError([...unknown, ...parsed.error.issues.map((i) => `${String(i.path[0])}: ${i.message}`), ...together]);
  }
  const e = parsed.data;
  const isProduction = e.NODE_ENV === 'production';
  const problems = problemsTogether(e, opts.service);
  if (problems.length) throw new ConfigError(problems);
  return {
    nodeEnv: e.NODE_ENV,
    isProduction,
    port: e.PORT,
    redisUrl: e.REDIS_URL as string,
    redisUrlSet: Boolean(env.REDIS_URL?.trim()),
    mongodbUri: e.MONGODB_URI,
    store: e.MONGODB_URI ? 'mongo' : 'sqlite',
    dataDir: e.SERVICE_DATA_DIR,
    queuePrefix: e.SERVICE_QUEUE_PREFIX,
    apiKeys: e.SERVICE_API_KEYS,
    auth: e.SERVICE_AUTH,
    workspaceRoot: e.SERVICE_WORKSPACE_ROOT,
    auditAllowSensitivePaths: e.SERVICE_AUDIT_ALLOW_SENSITIVE_PATHS,
    auditAllowedRoots: e.SERVICE_AUDIT_ALLOWED_ROOTS,
    audit: {
      reportTtlSeconds: e.SERVICE_AUDIT_REPORT_TTL_SECONDS,
      reportsMax: e.SERVICE_AUDIT_REPORTS_MAX,
      tenantMaxRunning: e.SERVICE_AUDIT_TENANT_MAX_RUNNING,
      phaseTimeoutSeconds: e.SERVICE_AUDIT_PHASE_TIMEOUT_SECONDS,
      registryUrl: e.SERVICE_AUDIT_REGISTRY_URL === 'none' ? null : e.SERVICE_AUDIT_REGISTRY_URL,
      concurrency: e.SERVICE_AUDIT_CONCURRENCY,
      // as the gates': one tenant alone (SERVICE_AUTH=none) has no other to leave a place for
      tenantConcurrency:
        e.SERVICE_AUDIT_TENANT_CONCURRENCY || (e.SERVICE_AUTH === 'none' ? e.SERVICE_AUDIT_CONCURRENCY : Math.max(1, e.SERVICE_AUDIT_CONCURRENCY - 1)),
    },
    adminKeys: e.SERVICE_ADMIN_KEYS,
    secretKey: e.SERVICE_SECRET_KEY,
    evidenceKey: e.SERVICE_EVIDENCE_KEY,
    evidencePreviousKeys: e.SERVICE_EVIDENCE_PREVIOUS_KEYS,
    tenantMaxRunning: e.SERVICE_TENANT_MAX_RUNNING,
    tenantMaxWaiting: e.SERVICE_TENANT_MAX_WAITING,
    tenantOutputMbPerDay: e.SERVICE_TENANT_OUTPUT_MB_PER_DAY,
    runLostReruns: e.SERVICE_RUN_LOST_RERUNS,
    agent: {
      baseUrl: e.SERVICE_AGENT_BASE_URL,
      apiKey: e.SERVICE_AGENT_API_KEY,
      model: e.SERVICE_AGENT_MODEL,
      timeoutSeconds: e.SERVICE_AGENT_TIMEOUT_SECONDS,
      maxRetries: e.SERVICE_AGENT_MAX_RETRIES,
    },
    transcribe: {
      provider: e.SERVICE_TRANSCRIBE_PROVIDER,
      baseUrl: e.SERVICE_TRANSCRIBE_BASE_URL ?? (e.SERVICE_TRANSCRIBE_PROVIDER === 'openai' ? 'https://api.openai.com/v1' : undefined),
      apiKey: e.SERVICE_TRANSCRIBE_API_KEY,
      model: e.SERVICE_TRANSCRIBE_MODEL ?? (e.SERVICE_TRANSCRIBE_PROVIDER === 'openai' ? 'whisper-1' : undefined),
      maxSeconds: e.SERVICE_TRANSCRIBE_MAX_SECONDS,
    },
    webhookReplayWindowSeconds: e.SERVICE_WEBHOOK_REPLAY_WINDOW_SECONDS,
    webhookRateLimitPerMinute: e.SERVICE_WEBHOOK_RATE_LIMIT_PER_MINUTE,
    webhookDeliveriesKeptDays: e.SERVICE_WEBHOOK_DELIVERIES_KEPT_DAYS,
    notify: {
      attempts: e.SERVICE_NOTIFY_ATTEMPTS,
      backoffMs: e.SERVICE_NOTIFY_BACKOFF_MS,
      disableAfter: e.SERVICE_NOTIFY_DISABLE_AFTER,
      timeoutMs: e.SERVICE_NOTIFY_TIMEOUT_SECONDS * 1000,
      tenantConcurrency: e.SERVICE_NOTIFY_TENANT_CONCURRENCY,
      maxEndpoints: e.SERVICE_TENANT_MAX_NOTIFICATION_ENDPOINTS,
      deliveriesKeptDays: e.SERVICE_NOTIFICATION_DELIVERIES_KEPT_DAYS,
    },
    oidc: [e.SERVICE_OIDC_ISSUER, e.SERVICE_OIDC_CLIENT_ID, e.SERVICE_OIDC_CLIENT_SECRET, e.SERVICE_OIDC_REDIRECT_URL].every(Boolean)
      ? {
          issuer: e.SERVICE_OIDC_ISSUER!,
          clientId: e.SERVICE_OIDC_CLIENT_ID!,
          clientSecret: e.SERVICE_OIDC_CLIENT_SECRET!,
          redirectUrl: e.SERVICE_OIDC_REDIRECT_URL!,
          tenantClaim: e.SERVICE_OIDC_TENANT_CLAIM ?? 'org_id',
          tenantMap: Object.fromEntries(e.SERVICE_OIDC_TENANT_MAP.map((p) => [p.slice(0, p.lastIndexOf(':')), p.slice(p.lastIndexOf(':') + 1)])),
          allowedEmailDomains: e.SERVICE_OIDC_ALLOWED_EMAIL_DOMAINS.map((d) => d.toLowerCase()),
        }
      : null,
    sessions: { idleSeconds: e.SERVICE_SESSION_IDLE_SECONDS, maxSeconds: e.SERVICE_SESSION_MAX_SECONDS },
    corsOrigins: e.SERVICE_CORS_ORIGINS,
    apiRateLimit: {
      perTenantPerMinute: e.SERVICE_API_RATE_LIMIT_PER_MINUTE,
      perKeyPerMinute: e.SERVICE_API_KEY_RATE_LIMIT_PER_MINUTE || e.SERVICE_API_RATE_LIMIT_PER_MINUTE,
    },
    logLevel: e.LOG_LEVEL,
    workerMetricsPort: e.SERVICE_WORKER_METRICS_PORT || undefined,
    shutdownGraceSeconds: e.SERVICE_SHUTDOWN_GRACE_SECONDS,
    bodyIdleSeconds: e.SERVICE_BODY_IDLE_SECONDS,
    runBudget: {
      defaultSeconds: e.SERVICE_RUN_DEFAULT_BUDGET_SECONDS,
      maxSeconds: e.SERVICE_RUN_MAX_BUDGET_SECONDS,
      defaultMaxSteps: e.SERVICE_RUN_DEFAULT_MAX_STEPS,
    },
    workerConcurrency: e.SERVICE_WORKER_CONCURRENCY,
    gatesConcurrency: e.SERVICE_GATES_CONCURRENCY,
    // one tenant alone (SERVICE_AUTH=none) has no other to leave a place for
    gatesTenantConcurrency:
      e.SERVICE_GATES_TENANT_CONCURRENCY || (e.SERVICE_AUTH === 'none' ? e.SERVICE_GATES_CONCURRENCY : Math.max(1, e.SERVICE_GATES_CONCURRENCY - 1)),
    httpAllowPrivate: e.SERVICE_HTTP_ALLOW_PRIVATE,
    redisTlsInsecure: e.SERVICE_REDIS_TLS_INSECURE,
    sseHeartbeatSeconds: e.SERVICE_SSE_HEARTBEAT_SECONDS,
    reconcileIntervalSeconds: e.SERVICE_RECONCILE_INTERVAL_SECONDS,
    runsKeptDays: e.SERVICE_RUNS_KEPT_DAYS,
    apiKeysSpentKeptDays: e.SERVICE_API_KEYS_SPENT_KEPT_DAYS,
    stalledIntervalSeconds: e.SERVICE_STALLED_INTERVAL_SECONDS,
    fileTriggerRefreshSeconds: e.SERVICE_FILE_TRIGGER_REFRESH_SECONDS,
    cronMinIntervalSeconds: e.SERVICE_CRON_MIN_INTERVAL_SECONDS,
    sessionMaxTasks: e.SERVICE_SESSION_MAX_TASKS,
    sessionMaxAgents: e.SERVICE_SESSION_MAX_AGENTS,
    tenantMaxStreams: e.SERVICE_TENANT_MAX_STREAMS,
    tenantMaxAutomations: e.SERVICE_TENANT_MAX_AUTOMATIONS,
    tenantMaxApiKeys: e.SERVICE_TENANT_MAX_API_KEYS,
    tenantMaxConnections: e.SERVICE_TENANT_MAX_CONNECTIONS,
    sandbox: {
      mode: e.SERVICE_SANDBOX,
      explicit: e.SERVICE_SANDBOX !== 'auto',
      allowNetwork: e.SERVICE_SANDBOX_ALLOW_NETWORK,
      limits: {
        cpuSeconds: e.SERVICE_SANDBOX_CPU_SECONDS,
        memoryMb: e.SERVICE_SANDBOX_MEMORY_MB,
        processes: e.SERVICE_SANDBOX_PROCESSES,
        fileSizeMb: e.SERVICE_SANDBOX_FILE_SIZE_MB,
      },
    },
    toolsAllowed: e.SERVICE_TOOLS_ALLOWED,
    childEnv: Object.fromEntries(CHILD_ENV_NAMES.filter((n) => env[n] !== undefined).map((n) => [n, env[n] as string])),
  };
}

/** This process's configuration; `service: false` for a local tool that starts no service (see problemsTogether). */
export function loadConfig(opts: { service?: boolean } = {}): Config {
  return parseEnv(process.env, opts);
}

/** A variable of this process's environment, for the CLI's `gates run` (a gate names what it needs). */
export function environmentValue(name: string): string | undefined {
  return process.env[name];
}

/** What the command-line tool's client commands read from the environment. */
export type ClientEnv = {
  /** SERVICE_URL, default http://localhost:8080 */
  url: string | undefined;
  /** SERVICE_API_KEY */
  key: string | undefined;
  /** NO_COLOR set (to anything): never colour */
  noColor: boolean;
  /** the CI job this runs in, when a known CI's variables say so: the base of a default Idempotency-Key */
  ciJob: string | undefined;
};

/** The CI job's identity: GitHub Actions, GitLab CI, CircleCI, Buildkite; a re-run of the job is a new one. */
function ciJobOf(env: Record<string, string | undefined>): string | undefined {
  if (env.GITHUB_ACTIONS === 'true' && env.GITHUB_RUN_ID)
    return `github-${env.GITHUB_REPOSITORY ?? ''}-${env.GITHUB_RUN_ID}-${env.GITHUB_RUN_ATTEMPT ?? '1'}-${env.GITHUB_JOB ?? ''}`;
  if (env.GITLAB_CI === 'true' && env.CI_JOB_ID) return `gitlab-${env.CI_PROJECT_ID ?? ''}-${env.CI_JOB_ID}`;
  if (env.CIRCLECI === 'true' && (env.CIRCLE_WORKFLOW_JOB_ID || env.CIRCLE_BUILD_NUM))
    return `circleci-${env.CIRCLE_WORKFLOW_JOB_ID ?? `${env.CIRCLE_PROJECT_REPONAME ?? ''}-${env.CIRCLE_BUILD_NUM}`}`;
  if (env.BUILDKITE === 'true' && env.BUILDKITE_JOB_ID) return `buildkite-${env.BUILDKITE_JOB_ID}`;
  return undefined;
}

export function loadClientEnv(env: Record<string, string | undefined> = process.env): ClientEnv {
  return {
    url: env.SERVICE_URL?.trim() || undefined,
    key: env.SERVICE_API_KEY?.trim() || undefined,
    noColor: env.NO_COLOR !== undefined && env.NO_COLOR !== '',
    ciJob: ciJobOf(env),
  };
}
