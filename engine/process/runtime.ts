// Opens everything a process needs, in order, and closes it in reverse. Only the entry points
// (api/main.ts, workers/main.ts, main.ts, cli/main.ts) call this: they are the only openers of connections.
import fs from 'node:fs/promises';
import path from 'node:path';
import { ConfigError, type Config } from '../../config/env.js';
import { TEMPLATES_DIR } from '../../config/paths.js';
import {
  systemClock,
  type Clock,
  createEventLog,
  EventHub,
  type EventLog,
  type Metrics,
  createMetrics,
  type Logger,
  createQueues,
  type Queues,
  createRedis,
  isCluster,
  connectionNames,
  probeRedis,
  redisSettingsOf,
  type Redis,
  createSecretBox,
  loadKeyBytes,
  loadSecretKey,
  SECRET_KEY_FILE,
} from '../platform/index.js';
import { createTenantSlots } from '../runs/index.js';
import { createEngine, type Engine } from '../index.js';
import { openStore, type Store } from '../store/index.js';
import { createTemplateCatalog } from '../automations/index.js';
import { openSandbox, type Sandbox } from '../tools/index.js';
import { EVIDENCE_KEY_FILE, publicKeyFromText, signerOf } from '../evidence/index.js';
import { findLocalPrograms, localTranscriber, openAiTranscriber, type VoiceSettings } from '../voice/index.js';

export type Runtime = {
  config: Config;
  log: Logger;
  clock: Clock;
  redis: Redis;
  store: Store;
  queues: Queues;
  engine: Engine;
  events: EventLog;
  metrics: Metrics;
  /** where tool processes run: what /readyz reports */
  sandbox: Sandbox;
  /** fans the event log out to this process's SSE clients; one blocking reader per process */
  hub: EventHub;
  close(): Promise<void>;
};

export type RuntimeOptions = {
  watchTemplates?: boolean;
  /**
   * This process answers the API: it syncs the bootstrap keys with its SERVICE_API_KEYS (a worker, which
   * takes no requests and may be given no keys, must not revoke them)
   */
  servesApi?: boolean;
  templatesDir?: string;
  clock?: Clock;
  /** the transcription provider's time limits (tests make them short) */
  transcribe?: { timeoutMs?: number; maxRetryDelayMs?: number };
};

const TRANSCRIBE_VARIABLES =
  'SERVICE_TRANSCRIBE_PROVIDER=openai with SERVICE_TRANSCRIBE_API_KEY (and optionally SERVICE_TRANSCRIBE_BASE_URL, SERVICE_TRANSCRIBE_MODEL), or SERVICE_TRANSCRIBE_PROVIDER=local with pocketsphinx installed';

/** The transcriber the config names, or why there is none (logged once at start). */
function voiceSettingsOf(config: Config, opts: RuntimeOptions, sandbox: Sandbox, log: Logger): VoiceSettings {
  const t = config.transcribe;
  const base = { maxSeconds: t.maxSeconds };
  if (t.provider === 'openai' && t.baseUrl && t.apiKey && t.model)
    return { ...base, unavailable: '', transcriber: openAiTranscriber({ baseUrl: t.baseUrl, apiKey: t.apiKey, model: t.model, ...opts.transcribe }) };
  if (t.provider === 'local') {
    const found = findLocalPrograms(config.childEnv.PATH);
    if ('programs' in found)
      return {
        ...base,
        unavailable: '',
        transcriber: localTranscriber({ programs: found.programs, sandbox, env: config.childEnv, timeoutMs: opts.transcribe?.timeoutMs }),
      };
    log.warn({ provider: 'local' }, `voice transcription is unavailable: ${found.missing}`);
    return { ...base, transcriber: null, unavailable: `the local transcription provider cannot run: ${found.missing}` };
  }
  return { ...base, transcriber: null, unavailable: `voice transcription is not configured; set ${TRANSCRIBE_VARIABLES}` };
}

/**
 * The data dir must never be reachable from a workspace (its secret key opens every tenant's secrets):
 * both are resolved, links included, before they are compared. Answers the workspace root's real path,
 * the one every workspace is resolved to: names relative to a root reached through a link would
 * otherwise start with `..`.
 */
async function checkDataDirOutsideWorkspaces(config: Config): Promise<string> {
  // a folder that cannot be made (a file is there, no permission) is the setting's fault: said as such, in one line
  for (const [name, dir] of [
    ['SERVICE_DATA_DIR', config.dataDir],
    ['SERVICE_WORKSPACE_ROOT', config.workspaceRoot],
  ] as const)
    await fs.mkdir(dir, { recursive: true }).catch((err: NodeJS.ErrnoException) => {
      throw new ConfigError([`${name}: ${dir} cannot be used as a folder (${err.code ?? err.message})`]);
    });
  const [data, root] = await Promise.all([fs.realpath(config.dataDir), fs.realpath(config.workspaceRoot)]);
  if (data === root || data.startsWith(root + path.sep)) {
    throw new ConfigError([`SERVICE_DATA_DIR: ${data} is inside SERVICE_WORKSPACE_ROOT (${root}), where tools could read it; put one outside the other`]);
  }
  return root;
}

/**
 * The data folder (the store, the keys) and the tenants' workspaces are the service's alone: no other user of
 * the machine may go in. A step writes its workspace as the user the service runs as (root, when it does): a
 * file it made set-user-id would otherwise be another local user's way to that user.
 */
async function keepPrivate(dirs: string[], log: Logger): Promise<void> {
  for (const dir of dirs)
    await fs
      .chmod(dir, 0o700)
      .catch((err: NodeJS.ErrnoException) => log.warn({ dir, err: err.code ?? err.message }, 'could not make a folder private to the service (mode 700)'));
}

/** The sandbox of this process, and the start-up rules around it. */
function openProcessSandbox(config: Config, log: Logger, hidden: string[]): Sandbox {
  let sandbox: Sandbox;
  try {
    sandbox = openSandbox({ mode: config.sandbox.mode, limits: config.sandbox.limits, prefix: config.queuePrefix, pathVar: config.childEnv.PATH, log, hidden });
  } catch (err) {
    throw new ConfigError([`SERVICE_SANDBOX: ${(err as Error).message}`]);
  }
  // whatever the tools allowed: a workspace's gates and audits run its own commands too (a gates.yaml's `run:`),
  // and without shell in SERVICE_TOOLS_ALLOWED a production service ran them as its own user, in silence
  if (sandbox.kind === 'none') {
    if (config.isProduction && !config.sandbox.explicit) {
      throw new ConfigError([
        "SERVICE_SANDBOX: bwrap is not installed, and tenants' commands (shell steps, a workspace's gates and audits) would run as the service's user; install bubblewrap, or set SERVICE_SANDBOX=none to run them unsandboxed",
      ]);
    }
    log.warn(
      { sandbox: 'none' },
      'tool processes run without a sandbox: a shell step can read what the service can (set SERVICE_SANDBOX=bwrap after installing bubblewrap)',
    );
  }
  return sandbox;
}

export async function openRuntime(config: Config, log: Logger, opts: RuntimeOptions = {}): Promise<Runtime> {
  const workspaceRoot = await checkDataDirOutsideWorkspaces(config);
  await keepPrivate([config.dataDir, workspaceRoot], log);
  await probeRedis(config.redisUrl, undefined, { insecure: config.redisTlsInsecure });
  // the data dir and the workspaces are no step's to see, even under a folder every step sees (/usr/src/app)
  const sandbox = openProcessSandbox(config, log, [await fs.realpath(config.dataDir), workspaceRoot]);
  const closers: (() => Promise<unknown>)[] = [async () => sandbox.close()];
  try {
    const redis = createRedis(config.redisUrl, `${config.queuePrefix}:main`, {}, { insecure: config.redisTlsInsecure });
    redis.on('error', (err) => log.warn({ err: err.message }, 'redis connection error'));
    closers.push(() => redis.quit().catch(() => redis.disconnect()));
    // one INFO at start: a node of a cluster reached by one URL would meet MOVED on most keys (the nodes
    // must be listed), and an eviction policy other than noeviction can lose jobs
    const info = await redis.info();
    if (!isCluster(redis) && /^cluster_enabled:1/m.test(info))
      throw new ConfigError([
        "REDIS_URL: the server is a node of a Redis Cluster; list the cluster's nodes (redis://host1:port1,host2:port2,...) and give SERVICE_QUEUE_PREFIX a hash tag ({svc})",
      ]);
    const settings = redisSettingsOf(info);
    if (settings.warning) log.warn({ maxmemory_policy: settings.maxmemory_policy }, settings.warning);
    const store = await openStore({
      mongodbUri: config.mongodbUri,
      dataDir: config.dataDir,
      onCheckpointerFailure: (err) => log.warn({ err: err.message }, 'the SQLite checkpointer thread stopped; the store checkpoints in its commits again'),
    });
    closers.push(() => store.close());
    // one store, one deployment: a process of another queue prefix sees none of the jobs and claims of this
    // one's, and its reconciler would end every running run of it worker-lost
    const recorded = await store.deployment.claimQueuePrefix(config.queuePrefix);
    if (recorded !== config.queuePrefix) {
      // a deployment moved to a new prefix (a Redis Cluster's hash tag, a new Redis) once no run is running:
      // what waits in the store (queued runs, deliveries, notifications) its reconcilers queue again under it
      // and no worker of the old prefix is still connected (its reconciler and this one's would take each
      // other's runs for lost from then on)
      const old = createQueues(redis, recorded);
      const workers = await Promise.all(old.all().map((q) => q.getWorkersCount())).finally(() => old.close());
      // and no process of it at all: a web process has no worker to count, and one left serving would put runs in
      // queues no one reads and stream event logs no one writes (every process names its connection `<prefix>:main`;
      // a Redis that refuses CLIENT LIST leaves the workers' count alone to tell)
      const processes = (await connectionNames(redis).catch(() => [])).filter((name) => name === `${recorded}:main`).length;
      const running = await store.runs.listStale('running', '9999-12-31T23:59:59.999Z', 1);
      if (running.length || workers.some((n) => n > 0) || processes)
        throw new ConfigError([
          `SERVICE_QUEUE_PREFIX: this store belongs to the deployment of prefix "${recorded}", not "${config.queuePrefix}", and ${running.length ? 'runs of it are running' : workers.some((n) => n > 0) ? 'workers of it are running' : `${processes} process${processes > 1 ? 'es' : ''} of it ${processes > 1 ? 'are' : 'is'} connected`} (they would take each other's runs for lost, or serve queues no one reads); stop that deployment's processes once no run runs, then start with the new prefix (the store moves to it), or use another SERVICE_DATA_DIR or MONGODB_URI`,
        ]);
      await store.deployment.moveQueuePrefix(config.queuePrefix);
      log.warn(
        { from: recorded, to: config.queuePrefix },
        'the store moved to a new queue prefix (no run was running): what waits in it is queued again under this one',
      );
    }
    const queues = createQueues(redis, config.queuePrefix);
    closers.push(() => queues.close());
    const templates = createTemplateCatalog({ dir: opts.templatesDir ?? TEMPLATES_DIR, log: log.child({ component: 'templates' }) });
    await templates.load();
    if (opts.watchTemplates) await templates.watch();
    closers.push(() => templates.close());
    const clock = opts.clock ?? systemClock;
    const events = createEventLog(redis, config.queuePrefix, clock);
    const hub = new EventHub(redis, events);
    const metrics = createMetrics({ countRuns: () => store.runs.countByKindAndStatus(), queues });
    closers.push(() => hub.close());
    const secretKey = loadSecretKey(config);
    if (secretKey.source === 'generated')
      log.warn({ file: `${config.dataDir}/${SECRET_KEY_FILE}` }, 'generated a secret key for webhook secrets; set SERVICE_SECRET_KEY in production');
    const evidenceKey = loadKeyBytes({
      value: config.evidenceKey,
      variable: 'SERVICE_EVIDENCE_KEY',
      file: EVIDENCE_KEY_FILE,
      dataDir: config.dataDir,
      isProduction: config.isProduction,
    });
    if (evidenceKey.source === 'generated')
      log.warn({ file: `${config.dataDir}/${EVIDENCE_KEY_FILE}` }, 'generated a key that signs the evidence ledger; set SERVICE_EVIDENCE_KEY in production');
    const agent = config.agent.baseUrl && config.agent.model ? { ...config.agent, baseUrl: config.agent.baseUrl, model: config.agent.model } : undefined;
    const engine = createEngine({
      store,
      clock,
      log,
      templates,
      redis,
      queues,
      events,
      metrics,
      slots: createTenantSlots(redis, config.queuePrefix, config.tenantMaxRunning, config.tenantMaxWaiting),
      sandbox,
      limits: {
        defaultBudgetSeconds: config.runBudget.defaultSeconds,
        defaultAgentMaxSteps: config.runBudget.defaultMaxSteps,
        maxBudgetSeconds: config.runBudget.maxSeconds,
        cronMinIntervalSeconds: config.cronMinIntervalSeconds,
        tenantMaxAutomations: config.tenantMaxAutomations,
        tenantMaxApiKeys: config.tenantMaxApiKeys,
        apiKeysSpentKeptDays: config.apiKeysSpentKeptDays,
        tenantMaxConnections: config.tenantMaxConnections,
        tenantOutputBytesPerDay: config.tenantOutputMbPerDay * 1024 * 1024,
        runLostReruns: config.runLostReruns,
      },
      settings: {
        workspaceRoot,
        singleTenant: config.auth === 'none',
        toolsAllowed: config.toolsAllowed,
        allowNetwork: config.sandbox.allowNetwork,
        agent,
        childEnv: config.childEnv,
        httpAllowPrivate: config.httpAllowPrivate,
        workerConcurrency: config.workerConcurrency,
        gatesConcurrency: config.gatesConcurrency,
        gatesTenantConcurrency: config.gatesTenantConcurrency,
        sessionMaxTasks: config.sessionMaxTasks,
        sessionMaxAgents: config.sessionMaxAgents,
        runsKeptDays: config.runsKeptDays,
        webhookReplayWindowSeconds: config.webhookReplayWindowSeconds,
        webhookRateLimitPerMinute: config.webhookRateLimitPerMinute,
        webhookDeliveriesKeptDays: config.webhookDeliveriesKeptDays,
      },
      audit: {
        dataDir: config.dataDir,
        isProduction: config.isProduction,
        allowSensitivePaths: config.auditAllowSensitivePaths,
        allowedRoots: config.auditAllowedRoots,
        reportTtlSeconds: config.audit.reportTtlSeconds,
        reportsMax: config.audit.reportsMax,
        tenantMaxRunning: config.audit.tenantMaxRunning,
        phaseTimeoutSeconds: config.audit.phaseTimeoutSeconds,
        tenantConcurrency: config.audit.tenantConcurrency,
        registryUrl: config.audit.registryUrl,
      },
      secretBox: createSecretBox(secretKey.key),
      // each checked by parseEnv
      signer: signerOf(
        evidenceKey.key,
        config.evidencePreviousKeys.map((text) => publicKeyFromText(text)!),
      ),
      voice: voiceSettingsOf(config, opts, sandbox, log),
      apiRateLimit: config.apiRateLimit,
      notify: { ...config.notify, httpAllowPrivate: config.httpAllowPrivate },
      sso: config.oidc ? { ...config.oidc, ...config.sessions, allowInsecureIssuer: !config.isProduction } : null,
    });
    closers.push(() => engine.gates.close());
    closers.push(() => engine.audits.close());
    closers.push(() => engine.smartGates.close());
    if (opts.servesApi) await engine.apiKeys.seed(config.apiKeys);
    log.info({ store: store.kind, templates: templates.list().length, queue_prefix: config.queuePrefix }, 'runtime open');
    log.info({ sandbox: sandbox.kind, process_limit: sandbox.processLimit }, 'tool sandbox');
    return { config, log, clock, redis, store, queues, engine, events, metrics, sandbox, hub, close: () => closeAll(closers) };
  } catch (err) {
    await closeAll(closers);
    throw err;
  }
}

async function closeAll(closers: (() => Promise<unknown>)[]): Promise<void> {
  for (const close of closers.reverse()) {
    try {
      await close();
    } catch {
      // closing is best effort: one failure must not keep the rest open
    }
  }
  closers.length = 0;
}
