// The engine: what the service does, with no knowledge of HTTP or of BullMQ's workers.
import { apiKeysOf, apiRateLimitOf, ssoOf, type ApiRateLimitSettings, type SsoSettings } from './auth/index.js';
import type { Platform } from './deps.js';
import { executorOf, runsOf, tenantRootPath, transitionsOf, type RunLimits, type RunSettings, type TenantSlots } from './runs/index.js';
import { automationsOf, fileTriggersOf, firesOf, overlapOf, schedulesOf, type TemplateCatalog } from './automations/index.js';
import { webhooksOf, type WebhookSettings } from './webhooks/index.js';
import { sessionsOf } from './sessions/index.js';
import { ledgerOf, type EvidenceSigner } from './evidence/index.js';
import { evidencePacksOf, gateRunsOf, gatesOnCopy, smartGatesOf } from './gates/index.js';
import type { Sandbox } from './tools/index.js';
import { auditsOf, type AuditSettings } from './audit/index.js';
import { voiceOf, type VoiceSettings } from './voice/index.js';
import { ConnectionMissingError, connectionsOf, notificationsOf, type NotificationSettings } from './connections/index.js';

export type EngineDeps = Platform & {
  /** signs the evidence ledger */
  signer: EvidenceSigner;
  templates: TemplateCatalog;
  slots: TenantSlots;
  sandbox: Sandbox;
  limits: RunLimits;
  settings: RunSettings & WebhookSettings;
  audit: Omit<AuditSettings, 'workspaceRoot' | 'singleTenant'>;
  voice: VoiceSettings;
  apiRateLimit: ApiRateLimitSettings;
  /** outbound notifications to the tenants' endpoints */
  notify: NotificationSettings;
  /** people's sign-in; null: API keys only */
  sso: SsoSettings | null;
};

export function createEngine(given: EngineDeps) {
  // every event any capability appends is also offered to the tenant's notification endpoints
  const notifications = notificationsOf(given, given.notify);
  const deps: EngineDeps = { ...given, events: notifications.wrap(given.events) };
  const transitions = transitionsOf(deps);
  // a run's end told again (its process died between its event and its deliveries) is offered to the endpoints again
  transitions.offerEndAgainTo((event) => notifications.notify(event));
  const connections = connectionsOf(deps, { httpAllowPrivate: deps.settings.httpAllowPrivate, maxConnections: deps.limits.tenantMaxConnections });
  const runs = runsOf(deps, transitions);
  const sessions = sessionsOf({ ...deps, runs });
  const evidence = ledgerOf(deps);
  // a run that ran gates leaves its end in the ledger too: a pack names the runs behind its results
  runs.onRunFinished(async (run) => {
    const ranGates = run.gates === true || Boolean(run.plan?.some((s) => s.tool === 'gates')) || (!run.plan && run.tool_allowlist.includes('gates'));
    if (!ranGates) return;
    await evidence.append(run.tenant_id, [
      {
        kind: 'run.finished',
        subject: { workspace: runs.workspaceOf(run), run_id: run.id },
        payload: {
          run_id: run.id,
          kind: run.kind,
          status: run.status,
          attempt: run.attempt,
          trigger: run.trigger,
          automation_id: run.automation_id,
          summary: run.summary,
          error: run.error,
          started_at: run.started_at,
          finished_at: run.finished_at,
          ...(run.result?.gates ? { gates: run.result.gates.results.map((g) => ({ gate_id: g.gate_id, conclusion: g.conclusion })) } : {}),
        },
      },
    ]);
  });
  const gates = gateRunsOf({ ...deps, ledger: evidence, settings: deps.settings });
  const smartGates = smartGatesOf({ ...deps, gates });
  const audits = auditsOf({
    ...deps,
    ledger: evidence,
    settings: { ...deps.audit, workspaceRoot: deps.settings.workspaceRoot, singleTenant: deps.settings.singleTenant },
    // the health phase's view of the gates: computed once, no watcher left behind in a worker
    gateHealth: async (tenantId, workspace) => {
      const snap = await smartGates.snapshot(tenantId, workspace, { watch: false });
      return snap.gates.length
        ? snap.gates.map((g) => ({ gate_id: g.id, required: g.required, state: g.state, reason: snap.blocking.find((b) => b.gate_id === g.id)?.reason ?? '' }))
        : null;
    },
  });
  const executor = executorOf(deps, runs, transitions, {
    sessionActions: sessions.actionsFor,
    // the action tools act through the connection the run names for a provider, or an action's own, or the tenant's only one
    connectionActions: (run) => ({
      async check(providers) {
        for (const p of providers) {
          // each step's as act() below picks it: the step's own, else the one the run names for the provider,
          // else the tenant's only one; with no step of the provider (an agent's calls), the run's
          const steps = (run.plan ?? []).filter((s) => s.tool === p);
          const actsThrough = (s?: (typeof steps)[number]) => (typeof s?.args?.connection === 'string' ? s.args.connection : run.connections?.[p]);
          const names = new Set(steps.length ? steps.map(actsThrough) : [actsThrough()]);
          for (const name of names) {
            try {
              await connections.resolve(run.tenant_id, p, name);
            } catch (err) {
              if (err instanceof ConnectionMissingError) return { code: err.code, message: `this run acts on the ${p} provider: ${err.message}` };
              throw err;
            }
          }
        }
        return null;
      },
      git: (named) => connections.git(run.tenant_id, named ?? run.connections?.codehost),
      act: (provider, action, args, signal) =>
        connections.act(run.tenant_id, provider, typeof args.connection === 'string' ? args.connection : run.connections?.[provider], action, args, signal),
    }),
    copyGates: (run, copy, readOnlyBinds, signal) =>
      gatesOnCopy(
        { sandbox: deps.sandbox, childEnv: deps.settings.childEnv, concurrency: deps.settings.gatesConcurrency },
        { dir: copy, setFrom: run.workspace, workspaceName: runs.workspaceOf(run), network: run.network, readOnlyBinds, signal },
      ),
    // a vibe run works on a scratch copy, which gate runs (on the tenant's workspaces) cannot see
    gateActions: (run) =>
      run.kind === 'vibe'
        ? undefined
        : {
            run: async ({ only, dir }, signal) => {
              const started = await gates.start(run.tenant_id, {
                workspace: runs.workspaceOf(dir ? { tenant_id: run.tenant_id, workspace: dir } : run),
                only,
                // the attempt that waits for it: a gate run of an attempt that ended (its worker died) runs no more
                trigger: { type: 'run', run_id: run.id, session_id: run.session_id, attempt: run.attempt },
              });
              return gates.wait(run.tenant_id, started.id, signal);
            },
          },
    // the same path as the audit routes: a flow of phases, the report in Redis, its summary in the ledger
    auditActions: (run) =>
      run.kind === 'vibe'
        ? undefined
        : {
            run: async ({ phases, layers }, signal) => {
              const started = await audits.start(run.tenant_id, {
                workspace: runs.workspaceOf(run),
                phases,
                layers,
                // the attempt that waits for it, as for a gate run: a lost attempt's audit runs no more phases
                trigger: { type: 'run', run_id: run.id, session_id: run.session_id, attempt: run.attempt },
                waitForRedis: true,
              });
              return audits.wait(run.tenant_id, started.report_id, { timeoutMs: Number.POSITIVE_INFINITY, signal });
            },
          },
  });
  const schedules = schedulesOf(deps);
  const automations = automationsOf(deps, { changed: (a, before) => schedules.sync(a, before), created: (a) => schedules.placeNew(a) });
  runs.guardRerun(automations.assertMayRerun);
  runs.guardStart(automations.mayStart);
  // after the automation's own guard: a run of a disabled automation is refused before it takes the key
  const overlap = overlapOf({ ...deps, cancel: (tenantId, id, why) => runs.cancel(tenantId, id, why) });
  runs.guardStart(overlap.mayStart, overlap.mayHold);
  runs.onRunFinished(overlap.ended, { repeatable: true });
  const { fire, fireCron } = firesOf({ ...deps, automations, schedules, runs, overlap });

  return {
    evidence,
    gates,
    smartGates,
    audits,
    evidencePacks: evidencePacksOf({ ...deps, ledger: evidence, gates }),
    automations,
    /** automations' overlap policies: a run a fire made under `replace` cancels the others (overlap.fired) */
    overlap,
    apiKeys: apiKeysOf(deps),
    /** provider credentials, sealed; the action tools act through them */
    connections,
    /** outbound notifications: endpoints, deliveries and their jobs */
    notifications,
    /** requests a minute per tenant and per key, shared by every web process */
    apiRateLimit: apiRateLimitOf(deps, deps.apiRateLimit),
    /** OpenID Connect sign-in and cookie sessions, when configured */
    sso: deps.sso ? ssoOf(deps, deps.sso) : null,
    templates: deps.templates,
    runs,
    sessions,
    schedules,
    executor,
    webhooks: webhooksOf(deps, fire),
    fire,
    fireCron,
    /** voice transcription: nothing stored */
    voice: voiceOf(deps, deps.voice),
    /** file_change triggers: one watcher on the tenant roots that have some; a matching change fires the automation */
    watchFiles: (opts: { refreshMs: number }) =>
      fileTriggersOf({ ...deps, tenantRootOf: (t) => tenantRootPath(deps.settings, t) }, { ...opts, fire: (a, trigger) => fire(a.tenant_id, a.id, trigger) }),
  };
}

export type Engine = ReturnType<typeof createEngine>;
