// The engine: what the service does, with no knowledge of HTTP or of BullMQ's workers.
import { apiKeysOf } from './api-keys.js';
import { automationsOf } from './automations.js';
import type { EngineDeps } from './deps.js';

export function createEngine(deps: EngineDeps) {
  return {
    automations: automationsOf(deps),
    apiKeys: apiKeysOf(deps),
    templates: deps.templates,
  };
}

export type Engine = ReturnType<typeof createEngine>;
export type { EngineDeps } from './deps.js';
