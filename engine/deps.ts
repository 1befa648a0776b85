// What the engine is built from. Entry points open the connections and pass them in; tests pass their own.
import type { AgentEndpoint } from './agent.js';
import type { Clock } from './clock.js';
import type { TenantSlots } from './concurrency.js';
import type { EventLog } from './events.js';
import type { Logger } from './log.js';
import type { Metrics } from './metrics.js';
import type { Queues } from './queues.js';
import type { Redis } from './redis.js';
import type { SecretBox } from './secret-box.js';
import type { Store } from './store/port.js';
import type { TemplateCatalog } from './templates.js';

export type EngineLimits = { defaultBudgetSeconds: number; maxBudgetSeconds: number };

export type EngineSettings = {
  workspaceRoot: string;
  agent: AgentEndpoint | undefined;
  childEnv: Record<string, string>;
  httpAllowPrivate: boolean;
  workerConcurrency: number;
  webhookReplayWindowSeconds: number;
  webhookRateLimitPerMinute: number;
};

export type EngineDeps = {
  store: Store;
  clock: Clock;
  log: Logger;
  limits: EngineLimits;
  templates: TemplateCatalog;
  redis: Redis;
  queues: Queues;
  events: EventLog;
  slots: TenantSlots;
  settings: EngineSettings;
  metrics: Metrics;
  /** seals tenant secrets at rest */
  secretBox: SecretBox;
};
