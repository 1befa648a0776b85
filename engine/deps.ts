// What the engine is built from. Entry points open the connections and pass them in; tests pass their own.
import type { Clock } from './clock.js';
import type { Logger } from './log.js';
import type { Store } from './store/port.js';
import type { TemplateCatalog } from './templates.js';

export type EngineLimits = { defaultBudgetSeconds: number; maxBudgetSeconds: number };

export type EngineDeps = {
  store: Store;
  clock: Clock;
  log: Logger;
  limits: EngineLimits;
  templates: TemplateCatalog;
};
