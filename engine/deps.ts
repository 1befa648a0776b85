// What capabilities are built from: the platform's connections and services, and the store. Entry
// points open them and pass them in; tests pass their own. Each capability picks what it uses.
import type { Clock, EventLog, Logger, Metrics, Queues, Redis, SecretBox } from './platform/index.js';
import type { Store } from './store/index.js';

export type Platform = {
  store: Store;
  clock: Clock;
  log: Logger;
  redis: Redis;
  queues: Queues;
  events: EventLog;
  metrics: Metrics;
  /** seals tenant secrets at rest */
  secretBox: SecretBox;
};
