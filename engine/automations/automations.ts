// Automations: reusable, triggerable definitions of work, scoped to one tenant.
// Every change is a conditional update in the store: an archived automation cannot change.
import {
  ConflictError,
  NotFoundError,
  sha256Hex,
  ValidationError,
  type FieldError,
  newId,
  percentile,
  type Automation,
  type AutomationDefinition,
  type AutomationPatch,
  type AutomationStatus,
  type Budget,
  type ConnectionNames,
  type Run,
  type RunStatus,
  type RunTrigger,
} from '../platform/index.js';
import { type AutomationMembers, type CappedInsert, type JsonDoc, type KeyClaim, type Page } from '../store/index.js';
import {
  allowlistOf,
  budgetTooLong,
  CLAIM_WAIT_MS,
  fingerprintOf,
  IDEMPOTENCY_CLAIM_SECONDS,
  IDEMPOTENCY_TTL_SECONDS,
  keyInUse,
  keyReused,
  networkOf,
  requireAgentFor,
  retryPolicyOf,
  type RunLimits,
  type RunRequest,
  type ToolPolicy,
} from '../runs/index.js';
import type { Platform } from '../deps.js';
import { instantiateTemplate, type TemplateCatalog } from './templates.js';
import { nextCronFire, validateTriggers } from './triggers.js';

const LIVE: AutomationStatus[] = ['enabled', 'disabled'];

export type AutomationList = { status?: AutomationStatus[]; include_archived?: boolean; limit?: number; cursor?: string };

const RUN_STATUSES_ZERO: Record<RunStatus, number> = { queued: 0, running: 0, succeeded: 0, failed: 0, canceled: 0, timed_out: 0 };

export function runSummaryOf(r: Run) {
  return {
    id: r.id,
    status: r.status,
    trigger: r.trigger,
    summary: r.summary,
    error: r.error,
    created_at: r.created_at,
    started_at: r.started_at,
    finished_at: r.finished_at,
    duration_ms: r.duration_ms,
  };
}

const tooMany = (max: number) =>
  new ConflictError(`this tenant has ${max} automations, the most it may keep (SERVICE_TENANT_MAX_AUTOMATIONS): archive one first`);

/** A template and the caller's values for it: what POST /automations/templates/instantiate takes. */
export type TemplateInstantiation = { template_id: string; variables?: Record<string, unknown>; name?: string; connections?: ConnectionNames };

/**
 * The digest a create's Idempotency-Key is kept under (it lives as a run's does: engine/runs/runs.ts): of the
 * key in the automations' scope, so that the same text sent with a run (whose keys share the store's records)
 * is another key. No header carries a NUL: no client's run key (the key itself), nor a service key (a NUL, then
 * its name), is this text.
 */
const keyDigestOf = (key: string) => sha256Hex(`automations\0${key}`);

export type AutomationHooks = {
  /** after any change of an automation's triggers or status (keeps the cron triggers' set in step) */
  changed(a: Automation, before?: Automation): Promise<void>;
  /** after an automation is created (places its cron triggers) */
  created(a: Automation): Promise<void>;
};

export type AutomationsDeps = Pick<Platform, 'store' | 'clock' | 'log'> & {
  limits: RunLimits;
  templates: TemplateCatalog;
  /** the tool policy, and the agent endpoint when one is configured */
  settings: ToolPolicy & { agent?: unknown };
};

export function automationsOf(deps: AutomationsDeps, hooks: AutomationHooks) {
  const { store, clock, limits } = deps;

  /** A new automation's budget: the one given, or the default time. */
  function budgetOf(given: Partial<Budget> | undefined, at: string, errors: FieldError[]): Budget {
    const seconds = given?.seconds ?? limits.defaultBudgetSeconds;
    const tooLong = budgetTooLong(limits, seconds, `${at}/seconds`);
    if (tooLong) errors.push(tooLong);
    return given?.max_steps === undefined ? { seconds } : { seconds, max_steps: given.max_steps };
  }

  /** A change of a budget's members (RFC 7396), checked: `max_steps: null` removes the bound. */
  function budgetMembers(given: { seconds?: number; max_steps?: number | null }, at: string, errors: FieldError[]): Record<string, unknown> {
    const tooLong = given.seconds === undefined ? null : budgetTooLong(limits, given.seconds, `${at}/seconds`);
    if (tooLong) errors.push(tooLong);
    return { seconds: given.seconds, max_steps: given.max_steps };
  }

  function check(errors: FieldError[]): void {
    if (errors.length) throw new ValidationError(errors.map((e) => `${e.path}: ${e.message}`).join('; '), errors);
  }

  function checkWork(def: Pick<AutomationDefinition, 'steps' | 'goal' | 'tool_allowlist'>, errors: FieldError[]): void {
    const hasSteps = Array.isArray(def.steps) && def.steps.length > 0;
    const hasGoal = typeof def.goal === 'string' && def.goal.trim() !== '';
    if (!hasSteps && !hasGoal) errors.push({ path: '/body', message: 'give the work to do: non-empty steps, or a goal for the agent' });
    if (hasSteps && def.tool_allowlist) {
      const allowed = new Set(def.tool_allowlist);
      def.steps!.forEach((s, i) => {
        if (!allowed.has(s.tool)) errors.push({ path: `/body/steps/${i}/tool`, message: `"${s.tool}" is not in tool_allowlist` });
      });
    }
  }

  async function mustGet(tenantId: string, id: string): Promise<Automation> {
    const found = await store.automations.get(tenantId, id);
    if (!found) throw new NotFoundError(`no automation ${id}`);
    return found;
  }

  /** Waits for a hook told of `a`; a failure there is logged, and the periodic reconcile repairs it. */
  async function told(a: Automation, hook: Promise<void>): Promise<Automation> {
    await hook.catch((err: unknown) =>
      deps.log.warn({ automation_id: a.id, err: (err as Error).message }, 'automation hooks failed; the reconciler will repair'),
    );
    return a;
  }
  const changed = (a: Automation, before?: Automation) => told(a, hooks.changed(a, before));

  /** A conditional update that says why it did not apply: gone (404) or archived (409). */
  async function change(tenantId: string, id: string, changes: Partial<Automation>, before?: Automation, members?: AutomationMembers): Promise<Automation> {
    const updated = await store.automations.update(tenantId, id, { ...changes, updated_at: clock.now().toISOString() }, LIVE, members);
    if (updated) return changed(updated, before);
    const current = await mustGet(tenantId, id);
    throw new ConflictError(`automation ${id} is ${current.status} and cannot change`, { status: current.status });
  }

  /** A new automation from a definition, checked (400, 403, 422): nothing is stored here. */
  function draft(tenantId: string, def: AutomationDefinition, template: Automation['template'] = null): Automation {
    const errors: FieldError[] = [];
    const triggers = def.triggers ?? [{ type: 'manual' as const }];
    errors.push(...validateTriggers(triggers, '/body/triggers', { cronMinIntervalSeconds: limits.cronMinIntervalSeconds }));
    const budget = budgetOf(def.budget, '/body/budget', errors);
    checkWork(def, errors);
    check(errors);
    requireAgentFor(deps.settings, def.steps, 'this automation');
    const now = clock.now().toISOString();
    return {
      id: newId('aut'),
      tenant_id: tenantId,
      name: def.name,
      description: def.description ?? null,
      status: def.status ?? 'enabled',
      triggers,
      tool_allowlist: allowlistOf(deps.settings, def.tool_allowlist, def.steps?.length ? def.steps : null, '/body/tool_allowlist'),
      network: networkOf(deps.settings, def.network),
      ...(def.connections && Object.keys(def.connections).length ? { connections: def.connections } : {}),
      budget,
      retry: retryPolicyOf(def.retry),
      overlap: def.overlap ?? 'allow',
      steps: def.steps && def.steps.length ? def.steps : null,
      goal: def.goal?.trim() ? def.goal : null,
      inputs: def.inputs ?? {},
      template,
      created_at: now,
      updated_at: now,
    };
  }

  /** A new automation from a built-in template and the caller's variables, checked as `draft`. */
  function draftFromTemplate(tenantId: string, req: TemplateInstantiation): Automation {
    const template = deps.templates.get(req.template_id);
    if (!template) {
      throw new ValidationError(`no template ${req.template_id}`, [
        { path: '/body/template_id', message: `unknown template; GET /api/v1/automations/templates lists them` },
      ]);
    }
    const { definition, variables } = instantiateTemplate(template, req.variables ?? {});
    // a budget the template fixes (not a variable's value, which the caller chose) is held to the deployment's
    // most: the caller cannot name it, and a lower SERVICE_RUN_MAX_BUDGET_SECONDS made the template a dead end
    const fixed = template.automation.budget?.seconds;
    const budget = typeof fixed === 'number' && fixed > limits.maxBudgetSeconds ? { budget: { ...definition.budget, seconds: limits.maxBudgetSeconds } } : {};
    const named = { ...definition, ...budget, ...(req.name ? { name: req.name } : {}), ...(req.connections ? { connections: req.connections } : {}) };
    return draft(tenantId, named, { id: template.id, variables });
  }

  /**
   * Every automation is work for each file event, trigger refresh and reconcile of the process: a tenant keeps
   * at most so many, checked by the insert itself, which holds when creates race.
   */
  const cap = () => (limits.tenantMaxAutomations === undefined ? undefined : { maxLive: limits.tenantMaxAutomations });

  /** What the insert of a new automation did: refused over the cap (409), or stored, and then told. */
  async function inserted(automation: Automation, done: CappedInsert): Promise<Automation> {
    if (done === 'over-cap') throw tooMany(limits.tenantMaxAutomations!);
    deps.log.info({ tenant_id: automation.tenant_id, automation_id: automation.id, template_id: automation.template?.id }, 'automation created');
    return told(automation, hooks.created(automation));
  }

  const insert = async (automation: Automation) => inserted(automation, await store.automations.insert(automation, cap()));

  return {
    async create(tenantId: string, def: AutomationDefinition, template: Automation['template'] = null): Promise<Automation> {
      return insert(draft(tenantId, def, template));
    },

    /** Creates an automation from a built-in template and the caller's variables. */
    async createFromTemplate(tenantId: string, req: TemplateInstantiation): Promise<Automation> {
      return insert(draftFromTemplate(tenantId, req));
    },

    /**
     * Creates an automation from a definition or a template (`template_id`), once per Idempotency-Key of the
     * tenant: the same key with the same body (by content, its fields in any order) answers the automation the
     * first request made, as it is now, even when that body would now be refused (the tenant at its cap, say);
     * with another body it is refused (422). A request refused (400, 409 over the cap, 422) keeps no key. Keys
     * live a day. A request that finds its key held by one whose automation is not stored yet (MongoDB) waits
     * for it, up to 5 s, then is a 409 to retry.
     */
    async createIdempotent(
      tenantId: string,
      key: string | undefined,
      body: AutomationDefinition | TemplateInstantiation,
    ): Promise<{ automation: Automation; replayed: boolean }> {
      const make = () => ('template_id' in body ? draftFromTemplate(tenantId, body) : draft(tenantId, body));
      if (!key) return { automation: await insert(make()), replayed: false };
      const keyDigest = keyDigestOf(key);
      const hash = fingerprintOf(body);
      const ago = (seconds: number, from = clock.now().toISOString()) => new Date(Date.parse(from) - seconds * 1000).toISOString();
      const until = Date.now() + CLAIM_WAIT_MS;
      let held = await store.idempotencyKeys.get(tenantId, keyDigest, ago(IDEMPOTENCY_TTL_SECONDS));
      for (;;) {
        if (held) {
          const earlier = await store.automations.get(tenantId, held.run_id);
          if (earlier) {
            if (held.fingerprint !== hash) throw keyReused();
            return { automation: earlier, replayed: true };
          }
          // its request is still storing it; or died doing so, and the key is taken over below
          if (held.created_at > ago(IDEMPOTENCY_CLAIM_SECONDS)) {
            if (held.fingerprint !== hash) throw keyReused();
            if (Date.now() >= until) throw keyInUse();
            await new Promise((r) => setTimeout(r, 20));
            held = await store.idempotencyKeys.get(tenantId, keyDigest, ago(IDEMPOTENCY_TTL_SECONDS));
            continue;
          }
        }
        // a new key: the automation is made (and checked) only now, so a retry answers what the first made
        const automation = make();
        const claim: KeyClaim = {
          record: { tenant_id: tenantId, key_digest: keyDigest, fingerprint: hash, run_id: automation.id, created_at: automation.created_at },
          since: ago(IDEMPOTENCY_TTL_SECONDS, automation.created_at),
          pendingSince: ago(IDEMPOTENCY_CLAIM_SECONDS, automation.created_at),
        };
        const done = await store.automations.insertWithKey(automation, claim, cap());
        if (typeof done === 'string') return { automation: await inserted(automation, done), replayed: false };
        held = done; // taken by another request meanwhile: its automation is the answer
      }
    },

    get: mustGet,

    /** A page of the tenant's automations as the JSON texts of their representations (the route answers them as they are). */
    async listJson(tenantId: string, q: AutomationList = {}): Promise<Page<JsonDoc>> {
      const statuses = q.status?.length ? q.status : q.include_archived ? [...LIVE, 'archived' as const] : undefined;
      return store.automations.listJson(tenantId, { statuses, limit: q.limit ?? 20, cursor: q.cursor });
    },

    async update(tenantId: string, id: string, patch: AutomationPatch): Promise<Automation> {
      const current = await mustGet(tenantId, id);
      const errors: FieldError[] = [];
      if (patch.triggers) errors.push(...validateTriggers(patch.triggers, '/body/triggers', { cronMinIntervalSeconds: limits.cronMinIntervalSeconds }));
      const changes: Partial<Automation> = {};
      if (patch.name !== undefined) changes.name = patch.name;
      if (patch.description !== undefined) changes.description = patch.description;
      if (patch.triggers !== undefined) changes.triggers = patch.triggers;
      if (patch.tool_allowlist !== undefined) changes.tool_allowlist = allowlistOf(deps.settings, patch.tool_allowlist, null, '/body/tool_allowlist');
      if (patch.network !== undefined) changes.network = networkOf(deps.settings, patch.network);
      // merged into what is stored by the write itself: two changes of different members at once both land
      const members: AutomationMembers = {};
      if (patch.connections !== undefined) members.connections = patch.connections;
      if (patch.budget !== undefined) members.budget = budgetMembers(patch.budget, '/body/budget', errors);
      if (patch.retry !== undefined) changes.retry = retryPolicyOf(patch.retry);
      if (patch.overlap !== undefined) changes.overlap = patch.overlap;
      if (changes.tool_allowlist && current.steps)
        checkWork({ steps: current.steps, goal: current.goal ?? undefined, tool_allowlist: changes.tool_allowlist }, errors);
      check(errors);
      return change(tenantId, id, changes, current, members);
    },

    enable: (tenantId: string, id: string) => change(tenantId, id, { status: 'enabled' }),
    disable: (tenantId: string, id: string) => change(tenantId, id, { status: 'disabled' }),

    /** Refuses to re-run a run of an automation that has been disabled (409) or archived (409: it stopped firing) since. */
    async assertMayRerun(run: Run): Promise<void> {
      if (!run.automation_id) return;
      const a = await store.automations.get(run.tenant_id, run.automation_id);
      if (!a || a.status === 'archived')
        throw new ConflictError(`run ${run.id} is of automation ${run.automation_id}, which is archived: its runs are not re-run`, { status: 'archived' });
      if (a.status === 'disabled')
        throw new ConflictError(`run ${run.id} is of automation ${a.id}, which is disabled; enable it to re-run its runs`, { status: a.status });
    },

    /**
     * A run of an automation disabled or archived since it was queued does not start (a fire never runs past a
     * disable): it is canceled at its start, as a retry's next attempt is. A start guard of the run engine's.
     */
    async mayStart(run: Run): Promise<null | { refuse: string }> {
      // an attempt a deploy interrupted goes on: the run had started while its automation was enabled, and a
      // disable stops no run already running
      if (!run.automation_id || run.attempts.at(-1)?.outcome === 'interrupted') return null;
      const a = await store.automations.get(run.tenant_id, run.automation_id);
      const when = run.attempt > 1 ? `before the run's attempt ${run.attempt} started` : 'before the run started';
      if (!a || a.status === 'archived') return { refuse: `automation ${run.automation_id} was archived ${when}` };
      if (a.status === 'disabled') return { refuse: `automation ${a.id} was disabled ${when}` };
      return null;
    },

    /** The run request an automation makes; the caller starts it (so Idempotency-Key can wrap it). */
    async runRequest(tenantId: string, id: string, opts: { inputs?: Record<string, unknown>; trigger: RunTrigger; request_id?: string }): Promise<RunRequest> {
      const a = await mustGet(tenantId, id);
      if (a.status === 'archived') throw new NotFoundError(`no automation ${id}`);
      if (a.status === 'disabled') throw new ConflictError(`automation ${id} is disabled; enable it to run it`, { status: a.status });
      return {
        kind: 'automation',
        goal: a.goal,
        steps: a.steps,
        tool_allowlist: a.tool_allowlist,
        network: a.network,
        connections: a.connections,
        budget_seconds: a.budget.seconds,
        max_steps: a.budget.max_steps,
        retry: a.retry,
        overlap: a.overlap ?? 'allow',
        inputs: { ...a.inputs, ...opts.inputs },
        automation_id: a.id,
        trigger: opts.trigger,
        request_id: opts.request_id,
      };
    },

    async status(tenantId: string, id: string) {
      const a = await mustGet(tenantId, id);
      const stats = await store.runs.automationStats(tenantId, id, 100);
      const counts = { ...RUN_STATUSES_ZERO, ...stats.counts };
      const finished = counts.succeeded + counts.failed + counts.canceled + counts.timed_out;
      const now = clock.now();
      const fires =
        a.status === 'enabled'
          ? a.triggers.flatMap((t) => (t.type === 'cron' ? [nextCronFire(t.schedule, t.timezone, now)] : [])).filter((d): d is Date => d !== null)
          : [];
      return {
        automation_id: id,
        status: a.status,
        last_run: stats.last ? runSummaryOf(stats.last) : null,
        counts,
        success_rate: finished ? Math.round((counts.succeeded / finished) * 1000) / 1000 : null,
        duration_ms: stats.durations_ms.length
          ? { p50: percentile(stats.durations_ms, 50), p95: percentile(stats.durations_ms, 95), sample: stats.durations_ms.length }
          : null,
        next_fire_at: fires.length ? new Date(Math.min(...fires.map((d) => d.getTime()))).toISOString() : null,
      };
    },

    async history(tenantId: string, id: string, q: { limit?: number; cursor?: string }) {
      await mustGet(tenantId, id);
      const page = await store.runs.list(tenantId, { automation_id: id, limit: q.limit ?? 20, cursor: q.cursor });
      return { data: page.items.map(runSummaryOf), next_cursor: page.next_cursor };
    },

    /** Soft delete; archiving an archived automation is a no-op, so DELETE is idempotent. */
    async archive(tenantId: string, id: string): Promise<Automation> {
      const now = clock.now().toISOString();
      const archived = await store.automations.update(tenantId, id, { status: 'archived', updated_at: now }, LIVE);
      if (archived) {
        deps.log.info({ tenant_id: tenantId, automation_id: id }, 'automation archived');
        return changed(archived);
      }
      return mustGet(tenantId, id);
    },
  };
}

export type Automations = ReturnType<typeof automationsOf>;
