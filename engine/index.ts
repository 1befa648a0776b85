// The engine: what the service does, with no knowledge of HTTP or of BullMQ's workers.
import { apiKeysOf } from './api-keys.js';
import { automationsOf } from './automations.js';
import type { EngineDeps } from './deps.js';
import { executorOf } from './executor.js';
import { runsOf } from './runs.js';

export function createEngine(deps: EngineDeps) {
  const runs = runsOf(deps);
  return {
    automations: automationsOf(deps, runs),
    apiKeys: apiKeysOf(deps),
    templates: deps.templates,
    runs,
    executor: executorOf(deps, runs),
    deps,
  };
}

export type Engine = ReturnType<typeof createEngine>;
export type { EngineDeps } from './deps.js';
