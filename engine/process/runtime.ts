// Opens everything a process needs, in order, and closes it in reverse. Only the entry points
// (api/main.ts, workers/main.ts, main.ts, cli/main.ts) call this: they are the only openers of connections.
import type { Config } from '../../config/env.js';
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
  probeRedis,
  type Redis,
  createSecretBox,
  loadSecretKey,
  SECRET_KEY_FILE,
} from '../platform/index.js';
import { createTenantSlots } from '../runs/index.js';
import { createEngine, type Engine } from '../index.js';
import { openStore, type Store } from '../store/index.js';
import { createTemplateCatalog } from '../automations/index.js';

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
  /** fans the event log out to this process's SSE clients; one blocking reader per process */
  hub: EventHub;
  close(): Promise<void>;
};

export type RuntimeOptions = { watchTemplates?: boolean; templatesDir?: string; clock?: Clock };

export async function openRuntime(config: Config, log: Logger, opts: RuntimeOptions = {}): Promise<Runtime> {
  await probeRedis(config.redisUrl);
  const closers: (() => Promise<unknown>)[] = [];
  try {
    const redis = createRedis(config.redisUrl, `${config.queuePrefix}:main`);
    redis.on('error', (err) => log.warn({ err: err.message }, 'redis connection error'));
    closers.push(() => redis.quit().catch(() => redis.disconnect()));
    const store = await openStore({ mongodbUri: config.mongodbUri, dataDir: config.dataDir });
    closers.push(() => store.close());
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
    const agent =
      config.agent.baseUrl && config.agent.model ? { baseUrl: config.agent.baseUrl, apiKey: config.agent.apiKey, model: config.agent.model } : undefined;
    const engine = createEngine({
      store,
      clock,
      log,
      templates,
      redis,
      queues,
      events,
      metrics,
      slots: createTenantSlots(redis, config.queuePrefix, config.tenantMaxRunning),
      limits: { defaultBudgetSeconds: config.runBudget.defaultSeconds, maxBudgetSeconds: config.runBudget.maxSeconds },
      settings: {
        workspaceRoot: config.workspaceRoot,
        agent,
        childEnv: config.childEnv,
        httpAllowPrivate: config.httpAllowPrivate,
        workerConcurrency: config.workerConcurrency,
        webhookReplayWindowSeconds: config.webhookReplayWindowSeconds,
        webhookRateLimitPerMinute: config.webhookRateLimitPerMinute,
      },
      secretBox: createSecretBox(secretKey.key),
    });
    await engine.apiKeys.seed(config.apiKeys);
    log.info({ store: store.kind, templates: templates.list().length, queue_prefix: config.queuePrefix }, 'runtime open');
    return { config, log, clock, redis, store, queues, engine, events, metrics, hub, close: () => closeAll(closers) };
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
