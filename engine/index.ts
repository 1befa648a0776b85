// The engine: what the service does, with no knowledge of HTTP or of BullMQ's workers.
import { apiKeysOf } from './auth/index.js';
import type { Platform } from './deps.js';
import { executorOf, runsOf, tenantRootPath, transitionsOf, type RunLimits, type RunSettings, type TenantSlots } from './runs/index.js';
import { automationsOf, fileTriggersOf, firesOf, schedulesOf, type TemplateCatalog } from './automations/index.js';
import { webhooksOf, type WebhookSettings } from './webhooks/index.js';
import { sessionsOf } from './sessions/index.js';
import { ledgerOf, type EvidenceSigner } from './evidence/index.js';
import type { Sandbox } from './tools/index.js';

export type EngineDeps = Platform & {
  /** signs the evidence ledger */
  signer: EvidenceSigner;
  templates: TemplateCatalog;
  slots: TenantSlots;
  sandbox: Sandbox;
  limits: RunLimits;
  settings: RunSettings & WebhookSettings;
};

export function createEngine(deps: EngineDeps) {
  const transitions = transitionsOf(deps);
  const runs = runsOf(deps, transitions);
  const sessions = sessionsOf({ ...deps, runs });
  const executor = executorOf(deps, runs, transitions, sessions.actionsFor);
  const schedules = schedulesOf(deps);
  const automations = automationsOf(deps, { changed: (a, before) => schedules.sync(a, before) });
  const { fire, fireCron } = firesOf({ ...deps, automations, schedules, runs });

  return {
    evidence: ledgerOf(deps),
    automations,
    apiKeys: apiKeysOf(deps),
    templates: deps.templates,
    runs,
    sessions,
    schedules,
    executor,
    webhooks: webhooksOf(deps, fire),
    fire,
    fireCron,
    /** file_change triggers: one watcher on the workspace root; a matching change fires the automation */
    watchFiles: (opts: { refreshMs: number; ignore: string[] }) =>
      fileTriggersOf(
        { ...deps, workspaceRoot: deps.settings.workspaceRoot, tenantRootOf: (t) => tenantRootPath(deps.settings, t) },
        { ...opts, fire: (a, trigger) => fire(a.tenant_id, a.id, trigger) },
      ),
  };
}

export type Engine = ReturnType<typeof createEngine>;
