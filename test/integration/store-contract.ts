// One contract for every store adapter. Each adapter's test file calls storeContract with a factory.
import { createHash } from 'node:crypto';
import { expect } from 'chai';
import { idBefore, newId } from '../../engine/platform/ids.js';
import type {
  AgentRecord,
  ApiKeyRecord,
  NotificationDelivery,
  NotificationEndpoint,
  Automation,
  ConnectionRecord,
  Run,
  Session,
  TaskRecord,
  WebhookDelivery,
  WebhookSecretRecord,
} from '../../engine/platform/records.js';
import { SUMMARY_QUESTION_MAX, type AutomationQuery, type Page, type Store } from '../../engine/store/port.js';

export function automationFixture(tenantId: string, over: Partial<Automation> = {}): Automation {
  const now = new Date().toISOString();
  return {
    id: newId('aut'),
    tenant_id: tenantId,
    name: 'fixture',
    description: null,
    status: 'enabled',
    triggers: [{ type: 'manual' }],
    tool_allowlist: ['shell'],
    budget: { seconds: 60 },
    retry: null,
    network: false,
    steps: [{ tool: 'shell', args: { command: 'true' } }],
    goal: null,
    inputs: { nested: { deep: [1, 2, { x: null }] } },
    template: null,
    created_at: now,
    updated_at: now,
    ...over,
  };
}

export function runFixture(tenantId: string, over: Partial<Run> = {}): Run {
  return {
    id: newId('run'),
    tenant_id: tenantId,
    kind: 'automation',
    status: 'queued',
    session_id: newId('ses'),
    automation_id: null,
    trigger: { type: 'api' },
    goal: null,
    plan: [],
    tool_allowlist: ['shell'],
    workspace: '/tmp',
    network: false,
    sandbox: null,
    budget: { seconds: 60 },
    retry: null,
    attempt: 1,
    attempts: [],
    rerun_of: null,
    usage: { steps: 0, model_turns: 0, seconds: 0 },
    inputs: {},
    summary: null,
    error: null,
    result: null,
    request_id: null,
    created_at: new Date().toISOString(),
    started_at: null,
    finished_at: null,
    duration_ms: null,
    ...over,
  };
}

export function deliveryFixture(tenantId: string, over: Partial<WebhookDelivery> = {}): WebhookDelivery {
  return {
    id: newId('whd'),
    tenant_id: tenantId,
    kind: 'codehost',
    status: 'received',
    event: 'push',
    action: null,
    provider_delivery_id: null,
    headers: { 'x-github-event': 'push' },
    content_type: 'application/json',
    body: '{"a":1}',
    body_size: 7,
    body_sha256: 'ab'.repeat(32),
    event_payload: { a: 1, nested: { list: [1, null] } },
    rejection: null,
    runs: [],
    attempts: 0,
    error: null,
    received_at: new Date().toISOString(),
    processed_at: null,
    ...over,
  };
}

export function taskFixture(over: Partial<TaskRecord> = {}): TaskRecord {
  const now = new Date().toISOString();
  return {
    id: newId('tsk'),
    tenant_id: 't1',
    session_id: 'ses_t',
    title: null,
    goal: null,
    steps: [{ tool: 'shell', args: { command: 'true' } }],
    agent_id: null,
    depends_on: [],
    trigger_rule: 'all_success',
    status: 'pending',
    attempts: 0,
    max_attempts: 2,
    position: 1,
    run_ids: [],
    output: null,
    created_at: now,
    updated_at: now,
    ...over,
  };
}

export function agentFixture(tenantId: string, over: Partial<AgentRecord> = {}): AgentRecord {
  const now = new Date().toISOString();
  return {
    id: newId('agt'),
    tenant_id: tenantId,
    session_id: 'ses_a',
    name: 'fixture',
    role: null,
    instructions: 'do it',
    tool_allowlist: ['read_file'],
    budget: { seconds: 60 },
    model: null,
    created_at: now,
    updated_at: now,
    ...over,
  };
}

export function endpointFixture(tenantId: string, over: Partial<NotificationEndpoint> = {}): NotificationEndpoint {
  const now = new Date().toISOString();
  return {
    id: newId('nep'),
    tenant_id: tenantId,
    url: 'https://hooks.example.com/a',
    description: null,
    event_types: ['run.finished'],
    status: 'enabled',
    disabled_reason: null,
    consecutive_failures: 0,
    sealed_secret: { v: 1, iv: 'aXY=', tag: 'dGFn', ct: 'Y3Q=' },
    created_at: now,
    updated_at: now,
    ...over,
  };
}

export function connectionFixture(tenantId: string, over: Partial<ConnectionRecord> = {}): ConnectionRecord {
  const now = new Date().toISOString();
  const id = newId('con');
  return {
    id,
    tenant_id: tenantId,
    provider: 'codehost',
    name: `github-${id}`,
    base_url: null,
    settings: {},
    sealed: { v: 1, iv: 'aXY=', tag: 'dGFn', ct: 'Y3Q=' },
    created_at: now,
    updated_at: now,
    last_used_at: null,
    last_test: null,
    ...over,
  };
}

/**
 * What `racing` answers, read by `read` again and again until it has: what a reader can see while writes
 * race. Each read waits for the event loop's next turn, so writes that go there (SQLite's commits) go on.
 */
async function readingWhile<T>(racing: Promise<T>, read: () => Promise<void>): Promise<T> {
  let settled = false;
  const done = racing.finally(() => {
    settled = true;
  });
  done.catch(() => undefined);
  do {
    await read();
    await new Promise((resolve) => setImmediate(resolve));
  } while (!settled);
  return done;
}

/** One capped kind of record, as the racing-cap tests use it. */
type Capped<T extends { id: string; tenant_id: string }> = {
  /** how a test names one: 'an automation' */
  what: string;
  make(tenantId: string): T;
  insert(store: Store, record: T, max: number): Promise<'inserted' | 'over-cap'>;
  get(store: Store, record: T): Promise<T | null>;
  /** what the cap counts of a tenant's */
  count(store: Store, tenantId: string): Promise<number>;
  /** the ids of a tenant's that a reader would act on */
  seen(store: Store, tenantId: string): Promise<string[]>;
  /** the same id with another body */
  again(record: T): T;
};

/** What a cap must hold while inserts race, the same for every capped kind of record and every adapter. */
function racingCap<T extends { id: string; tenant_id: string }>(storeOf: () => Store, c: Capped<T>): void {
  it(`holds the cap when inserts of ${c.what} race: of five at once, one below it, one is stored`, async () => {
    const store = storeOf();
    for (let i = 0; i < 2; i++) await c.insert(store, c.make('t1'), 3);
    const raced = Array.from({ length: 5 }, () => c.make('t1'));
    const outcomes = await Promise.all(raced.map((r) => c.insert(store, r, 3)));
    expect(outcomes.filter((o) => o === 'inserted')).to.have.length(1);
    expect(await c.count(store, 't1')).to.equal(3);
    const stored = await Promise.all(raced.map((r) => c.get(store, r)));
    expect(stored.map((r) => (r ? 'inserted' : 'over-cap'))).to.deep.equal(outcomes);
  });

  it(`never shows ${c.what} it refuses, not while inserts race: read during the race, the tenant stays within the cap`, async () => {
    const store = storeOf();
    for (let i = 0; i < 2; i++) await c.insert(store, c.make('t1'), 3);
    const raced = Array.from({ length: 6 }, () => c.make('t1'));
    const seen = new Set<string>();
    let most = 0;
    const outcomes = await readingWhile(Promise.all(raced.map((r) => c.insert(store, r, 3))), async () => {
      const [count, ids] = await Promise.all([c.count(store, 't1'), c.seen(store, 't1')]);
      most = Math.max(most, count, ids.length);
      for (const id of ids) seen.add(id);
    });
    expect(outcomes.filter((o) => o === 'inserted')).to.have.length(1);
    expect(most).to.be.at.most(3);
    expect(raced.filter((r, i) => outcomes[i] === 'over-cap' && seen.has(r.id)).map((r) => r.id)).to.deep.equal([]);
  });

  it(`stores every one of racing inserts of ${c.what} that all fit under the cap: none is refused while there is room`, async () => {
    const store = storeOf();
    const outcomes = await Promise.all(Array.from({ length: 8 }, () => c.insert(store, c.make('t1'), 8)));
    expect(outcomes).to.deep.equal(Array(8).fill('inserted'));
    expect(await c.insert(store, c.make('t1'), 8)).to.equal('over-cap');
  });

  it(`fails an insert of ${c.what} under a cap whose id is taken, keeps what it clashed with, and lets the tenant’s next one through`, async () => {
    const store = storeOf();
    const first = c.make('t1');
    expect(await c.insert(store, first, 5)).to.equal('inserted');
    let failed: unknown = null;
    await c.insert(store, c.again(first), 5).catch((err: unknown) => (failed = err));
    expect(failed, 'the insert of a taken id fails').to.be.instanceOf(Error);
    expect(await c.get(store, first)).to.deep.equal(first);
    expect(await c.insert(store, c.make('t1'), 5), 'the failed one held nothing back').to.equal('inserted');
    expect(await c.count(store, 't1')).to.equal(2);
  });
}

/** A ledger entry of `kind` about `subject`, chained to `prev` (hashes and signature stand-ins: the store checks neither). */
/** A running gate run of a workspace, with no results yet (the contract's gate-run tests). */
export function gateRunFixture(tenantId: string, workspace: string) {
  return {
    id: newId('grn'),
    tenant_id: tenantId,
    workspace,
    status: 'running' as const,
    source: 'gates.yaml',
    gates: ['test', 'lint'],
    trigger: { type: 'api' as const },
    subject: { workspace, commit: null, tree: null, dirty: null },
    results: [],
    ledger: null,
    created_at: new Date().toISOString(),
    finished_at: null,
  };
}

/** A gate's result at `at`, of a workspace outside a repository. */
export function gateResultFixture(gate: string, workspace: string, at: string, conclusion: 'success' | 'failure') {
  return {
    gate_id: gate,
    name: gate,
    required: true,
    conclusion,
    summary: '',
    exit_code: conclusion === 'success' ? 0 : 1,
    duration_ms: 1,
    output_tail: '',
    annotations: [],
    subject: { workspace, commit: null, tree: null, dirty: null },
    input_digest: 'sha256:i',
    definition_digest: 'sha256:d',
    tool_versions: {},
    artifacts: [],
    started_at: at,
    finished_at: at,
  };
}

export function ledgerEntryFixture(tenantId: string, seq: number, prev: string, kind: string, subject: Record<string, string>) {
  return {
    tenant_id: tenantId,
    seq,
    at: '2026-01-01T00:00:00.000Z',
    kind,
    subject,
    payload_digest: `sha256:${seq}`,
    prev_hash: prev,
    hash: `h${seq}`,
    key_id: 'k',
    sig: 's',
  };
}

export function storeContract(name: string, open: () => Promise<Store>): void {
  describe(`store contract: ${name}`, () => {
    let store: Store;
    beforeEach(async () => {
      store = await open();
    });
    afterEach(async () => {
      await store.close();
    });

    it('answers ping', async () => {
      await store.ping();
    });

    it('round-trips an automation exactly', async () => {
      const a = automationFixture('t1');
      await store.automations.insert(a);
      expect(await store.automations.get('t1', a.id)).to.deep.equal(a);
    });

    it('never shows one tenant another tenant’s automation', async () => {
      const a = automationFixture('t1');
      await store.automations.insert(a);
      expect(await store.automations.get('t2', a.id)).to.equal(null);
      expect((await store.automations.list('t2', { limit: 10 })).items).to.deep.equal([]);
      expect(await store.automations.update('t2', a.id, { name: 'stolen' }, ['enabled'])).to.equal(null);
      expect((await store.automations.get('t1', a.id))!.name).to.equal('fixture');
    });

    it('updates only while the status is expected', async () => {
      const a = automationFixture('t1');
      await store.automations.insert(a);
      const disabled = await store.automations.update('t1', a.id, { status: 'disabled' }, ['enabled']);
      expect(disabled!.status).to.equal('disabled');
      expect(await store.automations.update('t1', a.id, { status: 'archived' }, ['enabled'])).to.equal(null);
      expect((await store.automations.get('t1', a.id))!.status).to.equal('disabled');
      const renamed = await store.automations.update('t1', a.id, { name: 'renamed' }, ['enabled', 'disabled']);
      expect(renamed).to.deep.include({ id: a.id, tenant_id: 't1', name: 'renamed', status: 'disabled', created_at: a.created_at });
      expect(await store.automations.countLive('t1'), 'a disabled automation counts').to.equal(1);
      await store.automations.update('t1', a.id, { status: 'archived' }, ['disabled']);
      expect(await store.automations.countLive('t1'), 'an archived one does not').to.equal(0);
      await store.automations.insert(automationFixture('t1', { status: 'archived' }));
      await store.automations.insert(automationFixture('t1', { status: 'enabled' }));
      expect(await store.automations.countLive('t1')).to.equal(1);
    });

    it('merges members of the budget and connections into what is stored, in the update itself: changes of two members at once both land', async () => {
      const a = automationFixture('t1', { budget: { seconds: 100, max_steps: 10 }, connections: { codehost: 'gh', chat: 'sl' } });
      await store.automations.insert(a);
      // asked together, each with one member: neither writes back what it read of the other
      const [one, two] = await Promise.all([
        store.automations.update('t1', a.id, { updated_at: 'one' }, ['enabled'], { budget: { seconds: 200 } }),
        store.automations.update('t1', a.id, { updated_at: 'two' }, ['enabled'], { budget: { max_steps: 20 }, connections: { chat: 'other', pager: 'pd' } }),
      ]);
      expect(one && two).to.not.equal(null);
      const stored = await store.automations.get('t1', a.id);
      expect(stored!.budget).to.deep.equal({ seconds: 200, max_steps: 20 });
      expect(stored!.connections).to.deep.equal({ codehost: 'gh', chat: 'other', pager: 'pd' });
      // null removes a member; a member left out keeps its value
      const removed = await store.automations.update('t1', a.id, {}, ['enabled'], {
        budget: { max_steps: null },
        connections: { codehost: null, email: undefined },
      });
      expect(removed!.budget).to.deep.equal({ seconds: 200 });
      expect(removed!.connections).to.deep.equal({ chat: 'other', pager: 'pd' });
      expect(await store.automations.get('t1', a.id)).to.deep.equal(removed);
      // only while the status is expected, and only in its tenant
      expect(await store.automations.update('t1', a.id, {}, ['disabled'], { budget: { seconds: 1 } })).to.equal(null);
      expect(await store.automations.update('t2', a.id, {}, ['enabled'], { budget: { seconds: 1 } })).to.equal(null);
      expect((await store.automations.get('t1', a.id))!.budget).to.deep.equal({ seconds: 200 });
    });

    it('inserts an automation under a cap on the tenant’s live ones, archived ones aside, and stores nothing over it', async () => {
      const cap = { maxLive: 2 };
      expect(await store.automations.insert(automationFixture('t1'), cap)).to.equal('inserted');
      expect(await store.automations.insert(automationFixture('t1', { status: 'archived' }), cap), 'an archived one is not held').to.equal('inserted');
      expect(await store.automations.insert(automationFixture('t1', { status: 'disabled' }), cap)).to.equal('inserted');
      const over = automationFixture('t1');
      expect(await store.automations.insert(over, cap)).to.equal('over-cap');
      expect(await store.automations.get('t1', over.id)).to.equal(null);
      expect(await store.automations.countLive('t1')).to.equal(2);
      expect(await store.automations.insert(automationFixture('t2'), cap), 'another tenant has its own count').to.equal('inserted');
      expect(await store.automations.insert(automationFixture('t1')), 'without a cap').to.equal('inserted');
    });

    racingCap(() => store, {
      what: 'an automation',
      make: automationFixture,
      insert: (st, a, max) => st.automations.insert(a, { maxLive: max }),
      get: (st, a) => st.automations.get(a.tenant_id, a.id),
      // what the cap counts, and what a webhook, a file event or the cron reconcile would fire
      count: (st, tenantId) => st.automations.countLive(tenantId),
      seen: async (st, tenantId) => (await st.automations.listEnabledWithTrigger('manual', tenantId)).map((a) => a.id),
      again: (a) => ({ ...a, name: 'again' }),
    });

    it('takes a create’s Idempotency-Key with its automation: of inserts at once with one key one is stored, the others answer its record; one over the cap keeps no key', async () => {
      const at = (s: number) => new Date(Date.UTC(2026, 10, 29, 12, 0, s)).toISOString();
      const day = '2026-11-28T12:00:00.000Z';
      const made = (tenant = 't1') => automationFixture(tenant, { created_at: at(0), updated_at: at(0) });
      const key = (a: Automation, digest: string, s: number) => ({
        record: { tenant_id: a.tenant_id, key_digest: digest, fingerprint: 'fp', run_id: a.id, created_at: at(s) },
        since: day,
        pendingSince: at(s - 30),
      });
      const raced = Array.from({ length: 5 }, () => made());
      const outcomes = await Promise.all(raced.map((a) => store.automations.insertWithKey(a, key(a, 'ka', 0), { maxLive: 10 })));
      expect(outcomes.filter((o) => o === 'inserted')).to.have.length(1);
      const winner = raced[outcomes.indexOf('inserted')]!;
      for (const o of outcomes) if (o !== 'inserted') expect(o).to.deep.equal(key(winner, 'ka', 0).record);
      const stored = await Promise.all(raced.map((a) => store.automations.get('t1', a.id)));
      expect(stored.filter(Boolean).map((a) => a!.id)).to.deep.equal([winner.id]);
      expect(await store.automations.countLive('t1')).to.equal(1);
      expect((await store.idempotencyKeys.get('t1', 'ka', day))?.run_id).to.equal(winner.id);
      // another tenant's key of the same digest is its own
      const theirs = made('t2');
      expect(await store.automations.insertWithKey(theirs, key(theirs, 'ka', 1))).to.equal('inserted');
      // an automation that is stored holds its key for the day, however old its record: nothing else is stored
      const late = made();
      expect(await store.automations.insertWithKey(late, key(late, 'ka', 100))).to.deep.include({ run_id: winner.id });
      expect(await store.automations.get('t1', late.id)).to.equal(null);
      // refused over the cap: neither the automation nor its key is kept, and the key is free for the next
      const over = made();
      expect(await store.automations.insertWithKey(over, key(over, 'kb', 2), { maxLive: 1 })).to.equal('over-cap');
      expect(await store.automations.get('t1', over.id)).to.equal(null);
      expect(await store.idempotencyKeys.get('t1', 'kb', day)).to.equal(null);
      const room = made();
      expect(await store.automations.insertWithKey(room, key(room, 'kb', 3), { maxLive: 2 })).to.equal('inserted');
      expect((await store.idempotencyKeys.get('t1', 'kb', day))?.run_id).to.equal(room.id);
      // a record whose automation is not stored (its request still storing it, or dead) holds the key for the
      // claim's lifetime, then is taken over
      expect(await store.idempotencyKeys.claim({ ...key(room, 'kc', 0).record, run_id: 'aut_never_stored' }, day, at(-30))).to.equal(null);
      const waiting = made();
      expect(await store.automations.insertWithKey(waiting, key(waiting, 'kc', 10))).to.deep.include({ run_id: 'aut_never_stored' });
      expect(await store.automations.get('t1', waiting.id)).to.equal(null);
      expect(await store.automations.insertWithKey(waiting, key(waiting, 'kc', 31))).to.equal('inserted');
      expect((await store.idempotencyKeys.get('t1', 'kc', day))?.run_id).to.equal(waiting.id);
    });

    it('lists newest first with cursor pages, hiding archived unless asked', async () => {
      const made: Automation[] = [];
      for (let i = 0; i < 5; i++) {
        const a = automationFixture('t1', { name: `a${i}`, status: i === 2 ? 'archived' : i === 3 ? 'disabled' : 'enabled' });
        await store.automations.insert(a);
        made.push(a);
      }
      const first = await store.automations.list('t1', { limit: 2 });
      expect(first.items.map((a) => a.name)).to.deep.equal(['a4', 'a3']);
      expect(first.next_cursor).to.be.a('string');
      const second = await store.automations.list('t1', { limit: 2, cursor: first.next_cursor! });
      expect(second.items.map((a) => a.name)).to.deep.equal(['a1', 'a0']);
      expect(second.next_cursor).to.equal(null);
      expect(await store.automations.countLive('t1'), 'archived ones aside').to.equal(4);
      expect(await store.automations.countLive('t2')).to.equal(0);
      const archived = await store.automations.list('t1', { limit: 10, statuses: ['archived'] });
      expect(archived.items.map((a) => a.name)).to.deep.equal(['a2']);
      const all = await store.automations.list('t1', { limit: 10, statuses: ['enabled', 'disabled', 'archived'] });
      expect(all.items).to.have.length(5);
      const disabled = await store.automations.list('t1', { limit: 10, statuses: ['disabled'] });
      expect(disabled.items.map((a) => a.name)).to.deep.equal(['a3']);
      const none = await store.automations.list('t1', { limit: 10, statuses: [] });
      expect(
        none.items.map((a) => a.name),
        'no statuses given: every one but archived',
      ).to.deep.equal(['a4', 'a3', 'a1', 'a0']);
      // the same pages as JSON texts: each the automation's representation, with its id and the same cursors
      const pages: [AutomationQuery, Page<Automation>][] = [
        [{ limit: 2 }, first],
        [{ limit: 2, cursor: first.next_cursor! }, second],
        [{ limit: 10, statuses: ['disabled'] }, disabled],
      ];
      for (const [q, page] of pages) {
        const texts = await store.automations.listJson('t1', q);
        expect(texts.next_cursor).to.equal(page.next_cursor);
        expect(texts.items.map((d) => d.id)).to.deep.equal(page.items.map((a) => a.id));
        expect(texts.items.map((d) => JSON.parse(d.json) as unknown)).to.deep.equal(page.items);
      }
      expect((await store.automations.listJson('t2', { limit: 10 })).items).to.deep.equal([]);
    });

    it('refuses a cursor it did not issue', async () => {
      let error: unknown;
      try {
        await store.automations.list('t1', { limit: 2, cursor: 'not-a-cursor' });
      } catch (err) {
        error = err;
      }
      expect(error).to.have.property('code', 'validation-failed');
    });

    it('refuses a cursor of another list (taken as a place, it gave page 1 again), and takes one issued before cursors named their list', async () => {
      for (let i = 0; i < 3; i++) {
        await store.automations.insert(automationFixture('t-cur', { name: `c${i}` }));
        await store.runs.insert(runFixture('t-cur'));
      }
      const runs = await store.runs.list('t-cur', { limit: 1 });
      let error: unknown;
      try {
        await store.automations.list('t-cur', { limit: 1, cursor: runs.next_cursor! });
      } catch (err) {
        error = err;
      }
      expect(error).to.have.property('code', 'validation-failed');
      expect((error as Error).message).to.match(/another list/);
      const first = await store.automations.list('t-cur', { limit: 1 });
      // a cursor of the form issued until 2026-11-30: the last id alone
      const old = Buffer.from(JSON.stringify({ after: first.items[0]!.id })).toString('base64url');
      expect((await store.automations.list('t-cur', { limit: 1, cursor: old })).items.map((a) => a.name)).to.deep.equal(['c1']);
      expect((await store.automations.list('t-cur', { limit: 1, cursor: first.next_cursor! })).items.map((a) => a.name)).to.deep.equal(['c1']);
    });

    it('lists enabled automations of every tenant that have a trigger of a type', async () => {
      const cron = automationFixture('t1', { triggers: [{ type: 'manual' }, { type: 'cron', schedule: '* * * * *', timezone: 'UTC' }] });
      const other = automationFixture('t2', { triggers: [{ type: 'cron', schedule: '0 * * * *', timezone: 'UTC' }] });
      const disabled = automationFixture('t1', { status: 'disabled', triggers: [{ type: 'cron', schedule: '* * * * *', timezone: 'UTC' }] });
      const manual = automationFixture('t1');
      for (const a of [cron, other, disabled, manual]) await store.automations.insert(a);
      const found = await store.automations.listEnabledWithTrigger('cron');
      expect(found.map((a) => a.id).sort()).to.deep.equal([cron.id, other.id].sort());
      expect((await store.automations.listEnabledWithTrigger('cron', 't2')).map((a) => a.id)).to.deep.equal([other.id]);
      // as their triggers and status change
      await store.automations.update('t1', manual.id, { triggers: [{ type: 'cron', schedule: '5 * * * *', timezone: 'UTC' }] }, ['enabled']);
      await store.automations.update('t1', cron.id, { triggers: [{ type: 'manual' }] }, ['enabled']);
      await store.automations.update('t1', disabled.id, { status: 'enabled' }, ['disabled']);
      await store.automations.update('t2', other.id, { status: 'archived' }, ['enabled']);
      expect((await store.automations.listEnabledWithTrigger('cron')).map((a) => a.id).sort()).to.deep.equal([manual.id, disabled.id].sort());
      expect((await store.automations.listEnabledWithTrigger('manual', 't1')).map((a) => a.id)).to.deep.equal([cron.id]);
      expect(await store.automations.listEnabledWithTrigger('cron', 't2')).to.deep.equal([]);
    });

    it('round-trips a run and moves it only from the expected status and attempt', async () => {
      const r = runFixture('t1', { plan: [{ tool: 'shell', args: { command: 'x' } }] });
      await store.runs.insert(r);
      expect(await store.runs.get('t1', r.id)).to.deep.equal(r);
      expect(await store.runs.get('t2', r.id)).to.equal(null);
      const started = await store.runs.update('t1', r.id, { status: 'running', started_at: new Date().toISOString() }, { status: ['queued'], attempt: 1 });
      expect(started!.status).to.equal('running');
      // a replayed transition does not apply twice, nor one made for another attempt
      expect(await store.runs.update('t1', r.id, { status: 'running' }, { status: ['queued'] })).to.equal(null);
      expect(await store.runs.update('t1', r.id, { status: 'failed' }, { status: ['running'], attempt: 2 })).to.equal(null);
      expect(await store.runs.update('t2', r.id, { status: 'failed' }, { status: ['running'] })).to.equal(null);
      // an end guarded by `uncanceled` applies only while no cancel was asked of the run
      expect(await store.runs.update('t1', r.id, { summary: 'checked' }, { status: ['running'], uncanceled: true })).to.deep.include({ summary: 'checked' });
      await store.runs.update('t1', r.id, { cancel_requested_at: new Date().toISOString() }, { status: ['running'] });
      expect(await store.runs.update('t1', r.id, { status: 'succeeded' }, { status: ['running'], uncanceled: true })).to.equal(null);
      const done = await store.runs.update(
        't1',
        r.id,
        { status: 'succeeded', finished_at: new Date().toISOString(), duration_ms: 42 },
        { status: ['running'] },
      );
      expect(done).to.deep.include({ status: 'succeeded', duration_ms: 42, kind: 'automation' });
      expect(done!.plan).to.deep.equal(r.plan);
    });

    it('prunes runs made and ended before a time, with their steps, turns and own session, and counts them out; never a session task’s', async () => {
      const day = 86_400_000;
      // an id made `ago` ms before now (newId never goes back in time): its time leads, as newId's does
      const madeAgo = (ago: number) => `${idBefore('run', Date.now() - ago).slice(0, -16)}${newId('run').slice(-16)}`;
      const endedAgo = (ago: number) => new Date(Date.now() - ago).toISOString();
      const own = (over: Partial<Run>) => runFixture('t-prune', { kind: 'autonomy', session_id: newId('ses'), ...over });
      const old = own({ id: madeAgo(10 * day), status: 'succeeded', finished_at: endedAgo(10 * day), automation_id: 'aut_prune' });
      const oldQueued = own({ id: madeAgo(10 * day), status: 'queued' });
      // made long ago, ended lately (it waited in line, or its session was paused): kept its days after its end
      const lateEnd = own({ id: madeAgo(10 * day), status: 'failed', finished_at: endedAgo(day) });
      const recent = own({ id: madeAgo(0), status: 'failed', finished_at: endedAgo(0) });
      const shared = newId('ses');
      // a task's: a task waiting for an answer continues its conversation from it
      const ofTask = runFixture('t-prune', {
        id: madeAgo(9 * day),
        kind: 'session_task',
        status: 'succeeded',
        finished_at: endedAgo(9 * day),
        session_id: shared,
      });
      for (const r of [old, oldQueued, lateEnd, recent, ofTask]) await store.runs.insert(r);
      const now = new Date().toISOString();
      for (const [id, kind] of [
        [old.session_id, 'autonomy'],
        [shared, 'multi_agent'],
      ] as const)
        await store.sessions.insert({
          id: id!,
          tenant_id: 't-prune',
          title: 't',
          goal: null,
          kind,
          status: 'idle',
          outcome: null,
          metadata: {},
          created_at: now,
          updated_at: now,
        });
      await store.runs.putSteps('t-prune', old.id, 1, [{ index: 0, tool: 'shell', args: {}, status: 'succeeded' } as never]);
      expect((await store.runs.automationStats('t-prune', 'aut_prune', 10)).counts).to.deep.equal({ succeeded: 1 });

      const [madeBefore, endedBefore] = [idBefore('run', Date.now() - 7 * day), endedAgo(7 * day)];
      expect(await store.runs.prune(madeBefore, endedBefore, 10)).to.equal(1);
      expect(await store.runs.prune(madeBefore, endedBefore, 10)).to.equal(0);
      expect(await store.runs.get('t-prune', old.id)).to.equal(null);
      expect(await store.runs.steps('t-prune', old.id, 1)).to.deep.equal([]);
      for (const kept of [oldQueued, lateEnd, recent, ofTask]) expect((await store.runs.get('t-prune', kept.id))?.status, kept.status).to.equal(kept.status);
      // an autonomy run's own session goes with it; a session of tasks stays
      expect(await store.sessions.get('t-prune', old.session_id!)).to.equal(null);
      expect(await store.sessions.get('t-prune', shared)).to.not.equal(null);
      expect((await store.runs.automationStats('t-prune', 'aut_prune', 10)).counts).to.deep.equal({});
    });

    it('deletes archived multi-agent sessions whose work ended before a time with everything they hold, oldest first; no other session', async () => {
      const day = 86_400_000;
      const ago = (ms: number) => new Date(Date.now() - ms).toISOString();
      const made = async (over: Partial<Session>, runStatus: Run['status'] = 'succeeded') => {
        const s: Session = {
          id: newId('ses'),
          tenant_id: 't-arch',
          title: 't',
          goal: null,
          kind: over.kind ?? 'multi_agent',
          status: 'idle',
          outcome: null,
          metadata: {},
          created_at: ago(30 * day),
          updated_at: ago(30 * day),
        };
        await store.sessions.insert(s);
        delete over.kind;
        const agent = agentFixture('t-arch', { session_id: s.id });
        await store.agents.insert(agent);
        const task = taskFixture({ tenant_id: 't-arch', session_id: s.id, status: 'succeeded' });
        expect(await store.tasks.insertMany([task])).to.equal('inserted');
        const message = await store.messages.append({
          id: newId('msg'),
          tenant_id: 't-arch',
          session_id: s.id,
          role: 'user',
          from: null,
          to: null,
          kind: 'text',
          parts: [{ type: 'text', text: 'hi' }],
          task_id: null,
          run_id: null,
          in_reply_to: null,
          created_at: s.created_at,
        });
        const run = runFixture('t-arch', {
          kind: 'session_task',
          session_id: s.id,
          status: runStatus,
          finished_at: runStatus === 'running' ? null : ago(29 * day),
        });
        await store.runs.insert(run);
        await store.runs.putSteps('t-arch', run.id, 1, [{ index: 0, tool: 'shell', args: {}, status: 'succeeded' } as never]);
        await store.runs.appendTurn('t-arch', run.id, 1, { index: 0, at: s.created_at } as never);
        if (over.status) expect(await store.sessions.update('t-arch', s.id, over, ['idle'])).to.not.equal(null);
        return { s: { ...s, ...over }, agent, task, message: message!, run };
      };
      const ended = [
        await made({ status: 'archived', outcome: 'succeeded', updated_at: ago(9 * day) }),
        await made({ status: 'archived', outcome: 'canceled', updated_at: ago(8 * day) }),
      ];
      // more rows than a prune deletes at a time: 450 more runs with a step each, and 450 more tasks
      const big = ended[0]!.s;
      const moreRuns = Array.from({ length: 450 }, () =>
        runFixture('t-arch', { kind: 'session_task', session_id: big.id, status: 'failed', finished_at: ago(9 * day) }),
      );
      for (const r of moreRuns) await store.runs.insert(r);
      await Promise.all(moreRuns.map((r) => store.runs.putSteps('t-arch', r.id, 1, [{ index: 0, tool: 'shell', args: {}, status: 'failed' } as never])));
      await store.sessions.update('t-arch', big.id, { status: 'idle' }, ['archived']);
      expect(
        await store.tasks.insertMany(Array.from({ length: 450 }, () => taskFixture({ tenant_id: 't-arch', session_id: big.id, status: 'succeeded' }))),
      ).to.be.oneOf(['inserted', 'reopened']);
      await store.sessions.update('t-arch', big.id, { status: 'archived', outcome: 'succeeded', updated_at: ago(9 * day) }, ['idle']);
      const kept = [
        // archived lately; archived with work still ending; one whose run still runs; not archived; another kind
        await made({ status: 'archived', outcome: 'failed', updated_at: ago(6 * day) }),
        await made({ status: 'archived', updated_at: ago(9 * day) }),
        await made({ status: 'archived', outcome: 'canceled', updated_at: ago(9 * day) }, 'running'),
        await made({ status: 'idle', outcome: 'succeeded', updated_at: ago(9 * day) }),
        await made({ kind: 'autonomy', status: 'archived', outcome: 'succeeded', updated_at: ago(9 * day) }),
      ];
      const succeededTaskRuns = async () =>
        (await store.runs.countByKindAndStatus()).find((c) => c.kind === 'session_task' && c.status === 'succeeded')?.count ?? 0;
      const runsBefore = await succeededTaskRuns();
      const weekAgo = ago(7 * day);
      expect(await store.sessions.pruneArchived(weekAgo, 1)).to.equal(1);
      expect(await store.sessions.get('t-arch', ended[0]!.s.id)).to.equal(null);
      expect(await store.sessions.get('t-arch', ended[1]!.s.id)).to.not.equal(null);
      expect(await store.sessions.pruneArchived(weekAgo, 10)).to.equal(1);
      expect(await store.sessions.pruneArchived(weekAgo, 10)).to.equal(0);
      for (const { s, agent, task, message, run } of ended) {
        expect(await store.sessions.get('t-arch', s.id)).to.equal(null);
        expect(await store.agents.get('t-arch', s.id, agent.id)).to.equal(null);
        expect(await store.tasks.get('t-arch', s.id, task.id)).to.equal(null);
        expect(await store.tasks.counts('t-arch', s.id)).to.deep.equal({});
        expect(await store.messages.get('t-arch', s.id, message.id)).to.equal(null);
        expect(await store.runs.get('t-arch', run.id)).to.equal(null);
        expect(await store.runs.steps('t-arch', run.id, 1)).to.deep.equal([]);
        expect(await store.runs.turns('t-arch', run.id, 1)).to.deep.equal([]);
      }
      expect(await store.runs.list('t-arch', { session_id: big.id, limit: 10 })).to.deep.include({ items: [] });
      expect(await store.runs.steps('t-arch', moreRuns.at(-1)!.id, 1)).to.deep.equal([]);
      expect(await store.tasks.list('t-arch', big.id)).to.deep.equal([]);
      for (const { s, agent, task, message, run } of kept) {
        expect((await store.sessions.get('t-arch', s.id))!.status).to.equal(s.status);
        expect(await store.agents.get('t-arch', s.id, agent.id)).to.not.equal(null);
        expect(await store.tasks.get('t-arch', s.id, task.id)).to.not.equal(null);
        expect(await store.messages.get('t-arch', s.id, message.id)).to.not.equal(null);
        expect(await store.runs.get('t-arch', run.id)).to.not.equal(null);
        expect(await store.runs.steps('t-arch', run.id, 1)).to.have.length(1);
      }
      // the counts SQLite keeps count the deleted runs out (MongoDB counts the runs, at most every 10 s)
      if (store.kind === 'sqlite') expect(await succeededTaskRuns()).to.equal(runsBefore - 2);
    });

    it('keeps step records and agent turns per attempt, apart from the run, and only for its tenant', async () => {
      const r = runFixture('t1', { status: 'running' });
      await store.runs.insert(r);
      const step = (index: number, status: 'running' | 'succeeded') => ({
        index,
        name: null,
        tool: 'shell',
        args: { command: `echo ${index}` },
        status,
        source: 'plan' as const,
        started_at: new Date().toISOString(),
        finished_at: null,
        duration_ms: null,
        output: { deep: { list: [1, null] } },
        error: null,
      });
      await store.runs.putSteps('t1', r.id, 1, [step(0, 'running')]);
      await store.runs.update('t1', r.id, { summary: 'x' }, { status: ['running'] }, [step(0, 'succeeded'), step(1, 'running')]);
      expect((await store.runs.steps('t1', r.id, 1)).map((s) => [s.index, s.status])).to.deep.equal([
        [0, 'succeeded'],
        [1, 'running'],
      ]);
      expect(await store.runs.steps('t1', r.id, 2)).to.deep.equal([]);
      expect(await store.runs.steps('t2', r.id, 1)).to.deep.equal([]);
      // a step write that rides on an update that does not apply is not written either
      await store.runs.update('t1', r.id, { summary: 'y' }, { status: ['queued'] }, [step(2, 'running')]);
      expect(await store.runs.steps('t1', r.id, 1)).to.have.length(2);
      const turn = (index: number) => ({ index, at: new Date().toISOString(), content: `turn ${index}`, tool_calls: [] });
      await store.runs.appendTurn('t1', r.id, 1, turn(0));
      await store.runs.appendTurn('t1', r.id, 1, turn(1));
      expect((await store.runs.turns('t1', r.id, 1)).map((t) => t.content)).to.deep.equal(['turn 0', 'turn 1']);
      expect(await store.runs.turns('t2', r.id, 1)).to.deep.equal([]);
    });

    it('lists a tenant’s runs newest first, by automation, session, kind and status, in pages', async () => {
      const runs: Run[] = [];
      for (let i = 0; i < 5; i++) {
        const r = runFixture('t1', { automation_id: 'aut_x', session_id: 'ses_x', summary: `r${i}`, status: i % 2 ? 'failed' : 'succeeded' });
        await store.runs.insert(r);
        runs.push(r);
      }
      await store.runs.insert(runFixture('t1', { kind: 'autonomy', summary: 'other' }));
      await store.runs.insert(runFixture('t2', { automation_id: 'aut_x', session_id: 'ses_x' }));
      const first = await store.runs.list('t1', { automation_id: 'aut_x', limit: 3 });
      expect(first.items.map((r) => r.summary)).to.deep.equal(['r4', 'r3', 'r2']);
      const second = await store.runs.list('t1', { automation_id: 'aut_x', limit: 3, cursor: first.next_cursor! });
      expect(second.items.map((r) => r.summary)).to.deep.equal(['r1', 'r0']);
      expect(second.next_cursor).to.equal(null);
      expect((await store.runs.list('t1', { session_id: 'ses_x', limit: 10 })).items).to.have.length(5);
      expect((await store.runs.list('t1', { limit: 10 })).items).to.have.length(6);
      expect((await store.runs.list('t1', { status: 'failed', limit: 10 })).items.map((r) => r.summary)).to.deep.equal(['r3', 'r1']);
      expect((await store.runs.list('t1', { kind: 'autonomy', limit: 10 })).items.map((r) => r.summary)).to.deep.equal(['other']);
      expect((await store.runs.list('t2', { limit: 10 })).items).to.have.length(1);
    });

    it('reads the status and end of a tenant’s runs by id, without another tenant’s', async () => {
      const ended = runFixture('t1', { status: 'succeeded', finished_at: new Date().toISOString() });
      const queued = runFixture('t1');
      const theirs = runFixture('t2');
      for (const r of [ended, queued, theirs]) await store.runs.insert(r);
      const rows = await store.runs.statusOf('t1', [ended.id, queued.id, theirs.id, 'run_missing']);
      expect(rows.sort((x, y) => x.id.localeCompare(y.id))).to.deep.equal(
        [
          { id: ended.id, status: 'succeeded', finished_at: ended.finished_at },
          { id: queued.id, status: 'queued', finished_at: null },
        ].sort((x, y) => x.id.localeCompare(y.id)),
      );
      expect(await store.runs.statusOf('t1', [])).to.deep.equal([]);
    });

    it('computes automation stats, recent durations and stale runs', async () => {
      const old = new Date(Date.now() - 60_000).toISOString();
      const at = (ms: number) => new Date(Date.now() - ms).toISOString();
      const ran = (ms: number, duration: number) => ({ started_at: at(ms + duration), finished_at: at(ms), duration_ms: duration });
      await store.runs.insert(runFixture('t1', { automation_id: 'aut_s', status: 'succeeded', ...ran(3000, 100) }));
      await store.runs.insert(runFixture('t1', { automation_id: 'aut_s', status: 'failed', ...ran(2000, 300) }));
      await store.runs.insert(runFixture('t1', { automation_id: 'aut_s', status: 'succeeded', ...ran(1000, 200) }));
      const stale = runFixture('t1', { automation_id: 'aut_s', status: 'queued', created_at: old });
      await store.runs.insert(stale);
      const stats = await store.runs.automationStats('t1', 'aut_s', 10);
      expect(stats.counts).to.deep.equal({ succeeded: 2, failed: 1, queued: 1 });
      expect(stats.durations_ms).to.deep.equal([200, 300, 100]);
      expect(stats.last!.id).to.equal(stale.id);
      expect(await store.runs.recentDurations('t1', 'automation', 2)).to.deep.equal([200, 300]);
      expect(await store.runs.recentDurations('t2', 'automation', 2)).to.deep.equal([]);
      const found = await store.runs.listStale('queued', new Date(Date.now() - 30_000).toISOString(), 10);
      expect(found.map((r) => r.id)).to.deep.equal([stale.id]);
      // pages on from the last run of the page before, oldest first, ties by id: every stale run is reached
      const same = runFixture('t2', { status: 'queued', created_at: old });
      const later = runFixture('t1', { status: 'queued', created_at: new Date(Date.parse(old) + 1).toISOString() });
      await Promise.all([store.runs.insert(same), store.runs.insert(later)]);
      const cutoff = new Date(Date.now() - 30_000).toISOString();
      const firstPage = await store.runs.listStale('queued', cutoff, 2);
      expect(firstPage.map((r) => r.id)).to.deep.equal([stale.id, same.id].sort());
      const rest = await store.runs.listStale('queued', cutoff, 2, { created_at: firstPage[1]!.created_at, id: firstPage[1]!.id });
      expect(rest.map((r) => r.id)).to.deep.equal([later.id]);
      const counts = await store.runs.countByKindAndStatus();
      expect(counts.sort((x, y) => x.status.localeCompare(y.status))).to.deep.equal([
        { kind: 'automation', status: 'failed', count: 1 },
        { kind: 'automation', status: 'queued', count: 3 },
        { kind: 'automation', status: 'succeeded', count: 2 },
      ]);
    });

    it('counts in recent durations only runs that started and ran to their end or their budget', async () => {
      const at = (ms: number) => new Date(Date.now() - ms).toISOString();
      const ended = (status: Run['status'], ms: number, duration: number, started = true) =>
        runFixture('t1', { kind: 'vibe', status, started_at: started ? at(ms + duration) : null, finished_at: at(ms), duration_ms: duration });
      for (const r of [
        ended('succeeded', 6000, 1000),
        ended('failed', 5000, 2000),
        ended('timed_out', 4000, 3000),
        // canceled before it started: 0 ms, no start
        ended('canceled', 3000, 0, false),
        // canceled while running: stopped when someone asked, not when its work ended
        ended('canceled', 2000, 500),
        // no path writes an end of this kind without a start; one that did would not count either
        ended('failed', 1000, 50, false),
      ])
        await store.runs.insert(r);
      await store.runs.insert(runFixture('t1', { kind: 'vibe', status: 'running', started_at: at(500) }));
      expect(await store.runs.recentDurations('t1', 'vibe', 10)).to.deep.equal([3000, 2000, 1000]);
      expect(await store.runs.recentDurations('t1', 'vibe', 2)).to.deep.equal([3000, 2000]);
    });

    it('keeps an idempotency key per tenant for its day, replaces it, and forgets the oldest first', async () => {
      const rec = (tenant: string, key: string, runId: string, at: string) => ({
        tenant_id: tenant,
        key_digest: key,
        fingerprint: `fp-${runId}`,
        run_id: runId,
        created_at: at,
      });
      const claim = (r: ReturnType<typeof rec>) => store.idempotencyKeys.claim(r, '2000-01-01T00:00:00.000Z', '2000-01-01T00:00:00.000Z');
      expect(await claim(rec('t1', 'k1', 'run_1', '2026-11-20T10:00:00.000Z'))).to.equal(null);
      expect(await claim(rec('t1', 'k2', 'run_2', '2026-11-21T10:00:00.000Z'))).to.equal(null);
      expect(await claim(rec('t2', 'k1', 'run_3', '2026-11-21T11:00:00.000Z'))).to.equal(null);
      expect(await store.idempotencyKeys.get('t1', 'k1', '2026-11-19T00:00:00.000Z')).to.deep.equal(rec('t1', 'k1', 'run_1', '2026-11-20T10:00:00.000Z'));
      // kept before `since`: past its day
      expect(await store.idempotencyKeys.get('t1', 'k1', '2026-11-20T10:00:00.000Z')).to.equal(null);
      expect(await store.idempotencyKeys.get('t3', 'k1', '2026-11-19T00:00:00.000Z')).to.equal(null);
      expect((await store.idempotencyKeys.get('t2', 'k1', '2026-11-19T00:00:00.000Z'))?.run_id).to.equal('run_3');
      // the key used again after its day: the new run replaces the old
      expect(
        await store.idempotencyKeys.claim(rec('t1', 'k1', 'run_4', '2026-11-22T10:00:00.000Z'), '2026-11-21T10:00:00.000Z', '2026-11-22T09:59:30.000Z'),
      ).to.equal(null);
      expect((await store.idempotencyKeys.get('t1', 'k1', '2026-11-21T12:00:00.000Z'))?.run_id).to.equal('run_4');
      expect(await store.idempotencyKeys.prune('2026-11-21T12:00:00.000Z', 1)).to.equal(1);
      expect(await store.idempotencyKeys.get('t1', 'k2', '2026-11-19T00:00:00.000Z')).to.equal(null);
      expect((await store.idempotencyKeys.get('t2', 'k1', '2026-11-19T00:00:00.000Z'))?.run_id).to.equal('run_3');
      expect(await store.idempotencyKeys.prune('2026-11-21T12:00:00.000Z', 10)).to.equal(1);
      expect(await store.idempotencyKeys.prune('2026-11-21T12:00:00.000Z', 10)).to.equal(0);
      expect((await store.idempotencyKeys.get('t1', 'k1', '2026-11-19T00:00:00.000Z'))?.run_id).to.equal('run_4');
    });

    it('lets one request claim a key: held while its run is stored or still being stored, then taken over', async () => {
      const at = (s: number) => new Date(Date.UTC(2026, 10, 25, 12, 0, s)).toISOString();
      const rec = (runId: string, created: string, tenant = 't1') => ({
        tenant_id: tenant,
        key_digest: 'kc',
        fingerprint: 'fp',
        run_id: runId,
        created_at: created,
      });
      const day = '2026-11-24T12:00:00.000Z';
      // five requests at once: one holds the key, the others are told which
      const ids = ['run_a', 'run_b', 'run_c', 'run_d', 'run_e'];
      const answers = await Promise.all(ids.map((id) => store.idempotencyKeys.claim(rec(id, at(0)), day, at(-30))));
      expect(answers.filter((a) => a === null)).to.have.length(1);
      const holder = ids[answers.indexOf(null)]!;
      for (const a of answers) if (a) expect(a).to.deep.equal(rec(holder, at(0)));
      // another tenant's key of the same digest is its own
      expect(await store.idempotencyKeys.claim(rec('run_z', at(1), 't2'), day, at(-29))).to.equal(null);
      // within the claim's lifetime the holder may still be storing its run: held
      expect((await store.idempotencyKeys.claim(rec('run_f', at(10)), day, at(-20)))?.run_id).to.equal(holder);
      // its run never stored and the lifetime over: the request died, the key is taken over
      expect(await store.idempotencyKeys.claim(rec('run_f', at(31)), day, at(1))).to.equal(null);
      // a run that is stored holds its key for the day, however old its claim
      const stored = runFixture('t1');
      expect(await store.idempotencyKeys.claim(rec(stored.id, at(70)), day, at(40))).to.equal(null);
      await store.runs.insert(stored);
      expect((await store.idempotencyKeys.claim(rec('run_g', at(100)), day, at(70)))?.run_id).to.equal(stored.id);
      // let go only by the request that holds it
      await store.idempotencyKeys.release('t1', 'kc', 'run_g');
      await store.idempotencyKeys.release('t2', 'kc', stored.id);
      expect((await store.idempotencyKeys.get('t1', 'kc', day))?.run_id).to.equal(stored.id);
      await store.idempotencyKeys.release('t1', 'kc', stored.id);
      expect(await store.idempotencyKeys.get('t1', 'kc', day)).to.equal(null);
      expect((await store.idempotencyKeys.get('t2', 'kc', day))?.run_id).to.equal('run_z');
      // a new run takes its key as it is stored: both, or neither when another request's record holds the key
      const mine = runFixture('t2');
      const refused = await store.runs.insert(mine, { record: rec(mine.id, at(10), 't2'), since: day, pendingSince: at(-20) });
      expect(refused?.run_id).to.equal('run_z');
      expect(await store.runs.get('t2', mine.id)).to.equal(null);
      expect(await store.runs.insert(mine, { record: rec(mine.id, at(40), 't2'), since: day, pendingSince: at(10) })).to.equal(null);
      expect((await store.runs.get('t2', mine.id))?.id).to.equal(mine.id);
      expect((await store.idempotencyKeys.get('t2', 'kc', day))?.run_id).to.equal(mine.id);
    });

    it('records the queue prefix of the deployment it belongs to: the first claimed, whatever is claimed after', async () => {
      const first = await store.deployment.claimQueuePrefix('svc-one');
      expect(await store.deployment.claimQueuePrefix('svc-two')).to.equal(first);
      expect(await store.deployment.claimQueuePrefix(first)).to.equal(first);
    });

    it('stores api keys by hash, once, and finds them by hash', async () => {
      const k: ApiKeyRecord = { id: newId('key'), tenant_id: 't1', hash: 'ab'.repeat(32), label: null, source: 'cli', created_at: new Date().toISOString() };
      expect(await store.apiKeys.insert(k)).to.equal(true);
      expect(await store.apiKeys.insert({ ...k, id: newId('key') })).to.equal(false);
      expect(await store.apiKeys.findByHash(k.hash)).to.deep.equal(k);
      expect(await store.apiKeys.findByHash('cd'.repeat(32))).to.equal(null);
      expect(await store.apiKeys.list('t1')).to.deep.equal([k]);
      expect(await store.apiKeys.list('t2')).to.deep.equal([]);
    });

    it('refuses a key made with a key revoked by the time it is written, capped or not; a live maker’s, a person’s and another tenant’s same id are taken', async () => {
      const key = (tenant: string, createdBy: string | null, revoked = false): ApiKeyRecord => ({
        id: newId('key'),
        tenant_id: tenant,
        hash: createHash('sha256').update(`${tenant}-${Math.random()}`).digest('hex'),
        label: null,
        source: 'api',
        created_at: new Date().toISOString(),
        revoked_at: revoked ? new Date().toISOString() : null,
        created_by: createdBy,
      });
      const live = key('t-maker', null);
      const revoked = key('t-maker', null, true);
      for (const k of [live, revoked]) expect(await store.apiKeys.insert(k)).to.equal(true);
      expect(await store.apiKeys.insert(key('t-maker', `key:${live.id}`))).to.equal(true);
      expect(await store.apiKeys.insert(key('t-maker', 'person:someone'))).to.equal(true);
      const refused = [key('t-maker', `key:${revoked.id}`), key('t-maker', `key:${revoked.id}`)];
      expect(await store.apiKeys.insert(refused[0]!)).to.equal('maker-revoked');
      expect(await store.apiKeys.insert(refused[1]!, { maxLive: 100, now: new Date().toISOString() })).to.equal('maker-revoked');
      // not kept, or kept revoked: it never opens anything
      for (const k of refused) expect((await store.apiKeys.findByHash(k.hash))?.revoked_at ?? 'revoked').to.be.a('string');
      // a maker of that id in another tenant is not this key's maker
      expect(await store.apiKeys.insert(key('t-other', `key:${revoked.id}`))).to.equal(true);
    });

    it('pages a tenant’s keys newest first, gets one of its own, and holds a capped insert to the keys neither revoked nor expired, concurrent ones too', async () => {
      const key = (tenant: string, n: number, revoked = false): ApiKeyRecord => ({
        id: newId('key'),
        tenant_id: tenant,
        hash: createHash('sha256').update(`${tenant}-${n}-${Math.random()}`).digest('hex'),
        label: `k${n}`,
        source: 'api',
        created_at: new Date().toISOString(),
        revoked_at: revoked ? new Date().toISOString() : null,
      });
      const made: ApiKeyRecord[] = [];
      for (let n = 0; n < 5; n++) {
        made.push(key('t-page', n, n === 0));
        expect(await store.apiKeys.insert(made.at(-1)!)).to.equal(true);
      }
      const first = await store.apiKeys.page('t-page', { limit: 3 });
      expect(first.items.map((k) => k.label)).to.deep.equal(['k4', 'k3', 'k2']);
      const second = await store.apiKeys.page('t-page', { limit: 3, cursor: first.next_cursor! });
      expect({ labels: second.items.map((k) => k.label), next: second.next_cursor }).to.deep.equal({ labels: ['k1', 'k0'], next: null });
      expect((await store.apiKeys.get('t-page', made[2]!.id))?.label).to.equal('k2');
      expect(await store.apiKeys.get('t-other', made[2]!.id)).to.equal(null);
      // an operator's key is not counted
      expect(await store.apiKeys.insert({ ...key('t-page', 9), source: 'cli' })).to.equal(true);
      // one expired is not counted either
      const now = new Date().toISOString();
      expect(await store.apiKeys.insert({ ...key('t-page', 8), expires_at: new Date(Date.parse(now) - 1000).toISOString() })).to.equal(true);
      // four not revoked (k0 is): a cap of 5 takes one more, of the twenty asked at once
      const asked = await Promise.all(Array.from({ length: 20 }, (_, i) => store.apiKeys.insert(key('t-page', 10 + i), { maxLive: 5, now })));
      expect(asked.filter((r) => r === true)).to.have.length(1);
      expect(asked.filter((r) => r === 'over-cap')).to.have.length(19);
      expect(await store.apiKeys.list('t-page')).to.have.length(8);
      // a key that expires later counts until it has
      const later = { ...key('t-later', 1), expires_at: new Date(Date.parse(now) + 60_000).toISOString() };
      expect(await store.apiKeys.insert(later)).to.equal(true);
      expect(await store.apiKeys.insert(key('t-later', 2), { maxLive: 1, now })).to.equal('over-cap');
      expect(await store.apiKeys.insert(key('t-later', 3), { maxLive: 1, now: new Date(Date.parse(now) + 120_000).toISOString() })).to.equal(true);
    });

    it('deletes keys spent before a time, oldest first, but never a bootstrap key nor one that made a key still stored', async () => {
      const at = (days: number) => new Date(Date.now() - days * 86_400_000).toISOString();
      const key = (tenant: string, o: Partial<ApiKeyRecord> = {}): ApiKeyRecord => ({
        id: newId('key'),
        tenant_id: tenant,
        hash: createHash('sha256').update(`${tenant}-${Math.random()}`).digest('hex'),
        label: null,
        source: 'api',
        created_at: at(400),
        revoked_at: null,
        expires_at: null,
        created_by: null,
        ...o,
      });
      const tenant = `t-prune-${Date.now()}`;
      const revokedLongAgo = key(tenant, { revoked_at: at(200) });
      const expiredLongAgo = key(tenant, { expires_at: at(150) });
      // revoked recently, though it expired long ago: spent when it expired
      const spentFirstByExpiry = key(tenant, { expires_at: at(300), revoked_at: at(1) });
      const revokedRecently = key(tenant, { revoked_at: at(10) });
      const live = key(tenant, { expires_at: at(-30) });
      const bootstrap = key(tenant, { source: 'bootstrap', revoked_at: at(200) });
      // a chain: a parent spent long ago that made a child spent long ago, which made a live grandchild
      const parent = key(tenant, { revoked_at: at(250) });
      const child = key(tenant, { revoked_at: at(250), created_by: `key:${parent.id}` });
      const grandchild = key(tenant, { created_by: `key:${child.id}` });
      // another tenant's key of the same id as a maker is not what this one made
      const elsewhere = key(`${tenant}-b`, { revoked_at: at(100) });
      const stranger = key(`${tenant}-c`, { created_by: `key:${elsewhere.id}` });
      // the made before their makers (a key made with a revoked key is refused as it is written)
      for (const k of [grandchild, child, parent, revokedLongAgo, expiredLongAgo, spentFirstByExpiry, revokedRecently, live, bootstrap, elsewhere, stranger])
        expect(await store.apiKeys.insert(k), k.id).to.equal(true);
      const ids = async (t: string) => (await store.apiKeys.list(t)).map((k) => k.id).sort();
      // at most the limit, oldest spent first
      expect(await store.apiKeys.pruneSpent(at(90), 1)).to.equal(1);
      expect(await ids(tenant)).to.not.include(spentFirstByExpiry.id);
      expect(await store.apiKeys.pruneSpent(at(90), 100)).to.equal(3);
      expect(await ids(tenant)).to.deep.equal([parent.id, child.id, grandchild.id, revokedRecently.id, live.id, bootstrap.id].sort());
      expect(await ids(`${tenant}-b`)).to.deep.equal([]);
      // the grandchild revoked long ago since: the chain goes, a link a pass, from the bottom
      await store.apiKeys.update(tenant, grandchild.id, { revoked_at: at(120), revoked_reason: 'revoked' });
      expect(await store.apiKeys.pruneSpent(at(90), 100)).to.equal(1);
      expect(await store.apiKeys.pruneSpent(at(90), 100)).to.equal(1);
      expect(await store.apiKeys.pruneSpent(at(90), 100)).to.equal(1);
      expect(await store.apiKeys.pruneSpent(at(90), 100)).to.equal(0);
      expect(await ids(tenant)).to.deep.equal([revokedRecently.id, live.id, bootstrap.id].sort());
    });

    it('changes a key only for its tenant, and lists the bootstrap keys of every tenant', async () => {
      const at = new Date().toISOString();
      const k: ApiKeyRecord = { id: newId('key'), tenant_id: 't3', hash: 'ef'.repeat(32), label: 'ci', source: 'api', created_at: at, expires_at: null };
      const boot: ApiKeyRecord = { id: newId('key'), tenant_id: 't4', hash: '12'.repeat(32), label: null, source: 'bootstrap', created_at: at };
      await store.apiKeys.insert(k);
      await store.apiKeys.insert(boot);
      expect(await store.apiKeys.update('t4', k.id, { revoked_at: at }), 'another tenant').to.equal(null);
      expect(await store.apiKeys.update('t3', k.id, { revoked_at: at, revoked_reason: 'revoked' })).to.deep.equal({
        ...k,
        revoked_at: at,
        revoked_reason: 'revoked',
      });
      expect(await store.apiKeys.findByHash(k.hash)).to.deep.include({ revoked_at: at, label: 'ci' });
      expect(await store.apiKeys.update('t3', k.id, { last_used_at: at })).to.deep.include({ revoked_at: at, last_used_at: at });
      expect((await store.apiKeys.listBootstrap()).map((x) => x.id))
        .to.include(boot.id)
        .and.not.include(k.id);
    });

    it('keeps one secret record per tenant and kind, replaces it, lists and deletes it per tenant', async () => {
      const now = new Date().toISOString();
      const rec: WebhookSecretRecord = {
        tenant_id: 't1',
        kind: 'pager',
        sealed: [{ v: 1, iv: 'aXY=', tag: 'dGFn', ct: 'Y3Q=' }],
        created_at: now,
        updated_at: now,
      };
      await store.webhookSecrets.put(rec);
      const rotated = { ...rec, sealed: [...rec.sealed, { v: 1 as const, iv: 'aXYy', tag: 'dGFnMg==', ct: 'Y3Qy' }] };
      await store.webhookSecrets.put(rotated);
      await store.webhookSecrets.put({ ...rec, kind: 'chat' });
      expect(await store.webhookSecrets.list('t1')).to.deep.equal([{ ...rec, kind: 'chat' }, rotated]);
      expect(await store.webhookSecrets.list('t2')).to.deep.equal([]);
      expect(await store.webhookSecrets.delete('t2', 'pager')).to.equal(false);
      expect(await store.webhookSecrets.delete('t1', 'pager')).to.equal(true);
      expect((await store.webhookSecrets.list('t1')).map((r) => r.kind)).to.deep.equal(['chat']);
    });

    it('keeps connections per tenant with one name each, lists them by provider, renames only to a free name, deletes per tenant', async () => {
      const now = new Date().toISOString();
      const con = (tenant: string, over: Partial<ConnectionRecord> = {}): ConnectionRecord => connectionFixture(tenant, { name: 'github', ...over });
      const a = con('t1');
      const b = con('t1', { provider: 'email', name: 'smtp', base_url: 'smtp://mail.example.com:587', settings: { username: 'u', from: 'bot@example.com' } });
      expect(await store.connections.insert(a)).to.equal(true);
      expect(await store.connections.insert(b)).to.equal(true);
      expect(await store.connections.insert(con('t1')), 'the same name again').to.equal(false);
      expect(await store.connections.insert(con('t2')), 'another tenant may use the name').to.equal(true);
      expect(await store.connections.get('t1', a.id)).to.deep.equal(a);
      expect(await store.connections.get('t2', a.id)).to.equal(null);
      expect((await store.connections.list('t1')).map((c) => c.id)).to.deep.equal([a.id, b.id]);
      expect((await store.connections.list('t1', 'email')).map((c) => c.id)).to.deep.equal([b.id]);
      expect(await store.connections.update('t2', a.id, { name: 'x' }), 'another tenant').to.equal(null);
      expect(await store.connections.update('t1', a.id, { name: 'smtp' })).to.equal('name-taken');
      const test = { ok: true, identity: 'octocat', capabilities: ['repo'], error: null, checked_at: now };
      expect(await store.connections.update('t1', a.id, { name: 'gh', last_used_at: now, last_test: test })).to.deep.equal({
        ...a,
        name: 'gh',
        last_used_at: now,
        last_test: test,
      });
      // a write on condition (a test's verdict): only while the credential and address are the ones tried
      const resealed = { v: 1 as const, iv: 'aXYy', tag: 'dGFn', ct: 'Y3Qy' };
      expect(await store.connections.update('t1', a.id, { sealed: resealed })).to.include({ name: 'gh' });
      expect(await store.connections.update('t1', a.id, { last_test: null }, a), 'the credential changed since').to.equal(null);
      expect(await store.connections.update('t1', a.id, { last_test: null }, { ...a, sealed: resealed, base_url: 'https://ghe.example.com' })).to.equal(null);
      expect((await store.connections.get('t1', a.id))!.last_test, 'nothing written on a failed condition').to.deep.equal(test);
      expect(await store.connections.update('t1', a.id, { last_test: null }, { ...a, sealed: resealed })).to.include({ last_test: null });
      // and the settings tried (an email login's username)
      const withTest = (await store.connections.update('t1', b.id, { last_test: test })) as ConnectionRecord;
      expect(await store.connections.update('t1', b.id, { settings: { username: 'other', from: 'bot@example.com' } })).to.include({ name: 'smtp' });
      expect(await store.connections.update('t1', b.id, { last_test: { ...test, identity: 'u' } }, withTest), 'the settings changed since').to.equal(null);
      expect((await store.connections.get('t1', b.id))!.last_test).to.deep.equal(test);
      expect(await store.connections.insert(con('t1')), 'the old name is free again').to.equal(true);
      expect(await store.connections.delete('t2', a.id)).to.equal(false);
      expect(await store.connections.delete('t1', a.id)).to.equal(true);
      expect(await store.connections.get('t1', a.id)).to.equal(null);
    });

    it('pages a tenant’s connections oldest first by provider, finds one by name, and takes only a named count', async () => {
      const made = [
        connectionFixture('t1'),
        connectionFixture('t1', { provider: 'chat' }),
        connectionFixture('t1'),
        connectionFixture('t1', { provider: 'chat' }),
        connectionFixture('t1'),
      ];
      for (const c of made) expect(await store.connections.insert(c)).to.equal(true);
      await store.connections.insert(connectionFixture('t2'));
      const first = await store.connections.page('t1', { limit: 2 });
      expect(first.items.map((c) => c.id)).to.deep.equal([made[0]!.id, made[1]!.id]);
      const second = await store.connections.page('t1', { limit: 2, cursor: first.next_cursor! });
      expect(second.items.map((c) => c.id)).to.deep.equal([made[2]!.id, made[3]!.id]);
      const last = await store.connections.page('t1', { limit: 2, cursor: second.next_cursor! });
      expect(last).to.deep.equal({ items: [made[4]], next_cursor: null });
      const chat = await store.connections.page('t1', { provider: 'chat', limit: 1 });
      expect(chat.items.map((c) => c.id)).to.deep.equal([made[1]!.id]);
      expect((await store.connections.page('t1', { provider: 'chat', limit: 1, cursor: chat.next_cursor! })).items.map((c) => c.id)).to.deep.equal([
        made[3]!.id,
      ]);
      expect((await store.connections.list('t1', 'codehost', 2)).map((c) => c.id)).to.deep.equal([made[0]!.id, made[2]!.id]);
      expect(await store.connections.getByName('t1', made[1]!.name)).to.deep.equal(made[1]);
      expect(await store.connections.getByName('t2', made[1]!.name), 'another tenant’s').to.equal(null);
    });

    it('inserts a connection under a cap on the tenant’s connections and stores nothing over it; a taken name is still false', async () => {
      const cap = { maxHeld: 2 };
      const a = connectionFixture('t1');
      expect(await store.connections.insert(a, cap)).to.equal(true);
      expect(await store.connections.insert(connectionFixture('t1', { name: a.name }), cap), 'a taken name').to.equal(false);
      expect(await store.connections.insert(connectionFixture('t1', { provider: 'email' }), cap)).to.equal(true);
      const over = connectionFixture('t1');
      expect(await store.connections.insert(over, cap)).to.equal('over-cap');
      expect(await store.connections.get('t1', over.id)).to.equal(null);
      expect(await store.connections.insert(connectionFixture('t2'), cap), 'another tenant has its own count').to.equal(true);
      expect(await store.connections.delete('t1', a.id)).to.equal(true);
      expect(await store.connections.insert(connectionFixture('t1'), cap), 'a removed one is not held').to.equal(true);
    });

    racingCap(() => store, {
      what: 'a connection',
      make: (tenantId) => connectionFixture(tenantId),
      insert: async (st, c, max) => ((await st.connections.insert(c, { maxHeld: max })) === 'over-cap' ? 'over-cap' : 'inserted'),
      get: (st, c) => st.connections.get(c.tenant_id, c.id),
      count: async (st, tenantId) => (await st.connections.list(tenantId)).length,
      seen: async (st, tenantId) => (await st.connections.list(tenantId)).map((c) => c.id),
      again: (c) => ({ ...c, name: `${c.name}-again` }),
    });

    it('keeps notification endpoints per tenant, counts failures atomically, and pages an endpoint’s deliveries newest first', async () => {
      const now = new Date().toISOString();
      const e: NotificationEndpoint = {
        id: newId('nep'),
        tenant_id: 't1',
        url: 'https://hooks.example.com/a',
        description: null,
        event_types: ['run.finished', 'gate.*'],
        status: 'enabled',
        disabled_reason: null,
        consecutive_failures: 0,
        sealed_secret: { v: 1, iv: 'aXY=', tag: 'dGFn', ct: 'Y3Q=' },
        created_at: now,
        updated_at: now,
      };
      await store.notificationEndpoints.insert(e);
      expect(await store.notificationEndpoints.get('t1', e.id)).to.deep.equal(e);
      expect(await store.notificationEndpoints.get('t2', e.id)).to.equal(null);
      expect(await store.notificationEndpoints.list('t2')).to.deep.equal([]);
      await Promise.all([store.notificationEndpoints.addFailure('t1', e.id, now), store.notificationEndpoints.addFailure('t1', e.id, now)]);
      expect((await store.notificationEndpoints.get('t1', e.id))!.consecutive_failures).to.equal(2);
      expect(await store.notificationEndpoints.addFailure('t2', e.id, now)).to.equal(null);
      // a success starts the count again, whatever was read before it; another tenant's reset reaches nothing
      await store.notificationEndpoints.resetFailures('t2', e.id);
      expect((await store.notificationEndpoints.get('t1', e.id))!.consecutive_failures).to.equal(2);
      await store.notificationEndpoints.resetFailures('t1', e.id);
      await store.notificationEndpoints.resetFailures('t1', e.id);
      expect((await store.notificationEndpoints.get('t1', e.id))!.consecutive_failures).to.equal(0);
      await Promise.all([store.notificationEndpoints.addFailure('t1', e.id, now), store.notificationEndpoints.addFailure('t1', e.id, now)]);
      const [won, lost] = await Promise.all([
        store.notificationEndpoints.disable('t1', e.id, 'x', now),
        store.notificationEndpoints.disable('t1', e.id, 'y', now),
      ]);
      expect([won, lost].filter(Boolean), 'one of two disables wins').to.have.length(1);
      expect(await store.notificationEndpoints.get('t1', e.id)).to.deep.include({ status: 'disabled', consecutive_failures: 2 });
      expect(await store.notificationEndpoints.disable('t2', e.id, 'z', now)).to.equal(null);
      // a rotation applies only to the secret it read: of two that race, one is made; another tenant's reaches nothing
      const rotation = (ct: string) => ({
        sealed_secret: { v: 1 as const, iv: 'aXYy', tag: 'dGFn', ct },
        secret_rotated_at: now,
        previous_sealed_secret: e.sealed_secret,
        previous_secret_expires_at: now,
        updated_at: now,
      });
      expect(await store.notificationEndpoints.rotateSecret('t2', e.id, e.sealed_secret, rotation('bm8='))).to.equal(null);
      const rotations = await Promise.all([
        store.notificationEndpoints.rotateSecret('t1', e.id, e.sealed_secret, rotation('b25l')),
        store.notificationEndpoints.rotateSecret('t1', e.id, e.sealed_secret, rotation('dHdv')),
      ]);
      expect(rotations.filter(Boolean), 'one of two rotations is made').to.have.length(1);
      const rotated = (await store.notificationEndpoints.get('t1', e.id))!;
      expect(rotated.sealed_secret.ct).to.equal(rotations.find(Boolean)!.sealed_secret.ct);
      expect(rotated).to.deep.include({ previous_sealed_secret: e.sealed_secret, secret_rotated_at: now, previous_secret_expires_at: now, status: 'disabled' });
      const delivery = (i: number): NotificationDelivery => ({
        id: newId('ntf'),
        tenant_id: 't1',
        endpoint_id: e.id,
        event_type: 'run.finished',
        payload: { type: 'run.finished', data: { i } },
        status: 'pending',
        attempts: [],
        replays: 0,
        created_at: now,
        updated_at: now,
      });
      const ds = [delivery(0), delivery(1), delivery(2)];
      for (const d of ds) await store.notificationDeliveries.insert(d);
      // one of the same id again (an event offered again) writes nothing and throws nothing
      await store.notificationDeliveries.insert({ ...ds[0]!, payload: { type: 'run.finished', data: { i: 99 } } });
      expect((await store.notificationDeliveries.get('t1', ds[0]!.id))!.payload).to.deep.equal(ds[0]!.payload);
      const first = await store.notificationDeliveries.list('t1', e.id, { limit: 2 });
      expect(first.items.map((d) => d.id)).to.deep.equal([ds[2]!.id, ds[1]!.id]);
      const second = await store.notificationDeliveries.list('t1', e.id, { limit: 2, cursor: first.next_cursor! });
      expect(second.items.map((d) => d.id)).to.deep.equal([ds[0]!.id]);
      expect(second.next_cursor).to.equal(null);
      expect((await store.notificationDeliveries.list('t2', e.id, { limit: 5 })).items).to.deep.equal([]);
      const attempt = { at: now, status_code: 503, error: 'HTTP 503', duration_ms: 4 };
      expect(await store.notificationDeliveries.update('t1', ds[0]!.id, { status: 'failed', attempts: [attempt] })).to.deep.include({
        status: 'failed',
        attempts: [attempt],
      });
      expect(await store.notificationDeliveries.update('t2', ds[0]!.id, { status: 'succeeded' })).to.equal(null);
      // pending and untouched since before a time, of every tenant
      const later = new Date(Date.parse(now) + 1000).toISOString();
      const stale = (await store.notificationDeliveries.listStalePending(later, 10)).map((d) => d.id);
      expect(stale).to.include(ds[1]!.id).and.include(ds[2]!.id).and.not.include(ds[0]!.id);
      expect((await store.notificationDeliveries.listStalePending(now, 10)).map((d) => d.id)).not.to.include(ds[1]!.id);
      // page by page, by (updated_at, id): deliveries of one time are neither skipped nor read twice
      const firstPage = await store.notificationDeliveries.listStalePending(later, 1);
      const rest = await store.notificationDeliveries.listStalePending(later, 10, firstPage[0]);
      expect([...firstPage, ...rest].map((d) => d.id).filter((id) => id === ds[1]!.id || id === ds[2]!.id)).to.deep.equal([ds[1]!.id, ds[2]!.id]);
      expect(await store.notificationDeliveries.listStalePending(later, 10, rest.at(-1))).to.deep.equal([]);
      // a replay's write holds only while the delivery is as it was read
      const replay = { status: 'pending' as const, replays: 1 };
      expect(await store.notificationDeliveries.update('t1', ds[0]!.id, replay, { replays: 1, status: ['failed'] })).to.equal(null);
      expect(await store.notificationDeliveries.update('t1', ds[0]!.id, replay, { replays: 0, status: ['succeeded'] })).to.equal(null);
      expect(await store.notificationDeliveries.update('t1', ds[0]!.id, replay, { replays: 0, status: ['succeeded', 'failed'] })).to.deep.include(replay);
      expect(await store.notificationDeliveries.update('t1', ds[0]!.id, replay, { replays: 0, status: ['succeeded', 'failed'] })).to.equal(null);
      // one delivery deleted, of its own tenant only
      expect(await store.notificationDeliveries.delete('t2', ds[2]!.id)).to.equal(false);
      expect(await store.notificationDeliveries.delete('t1', ds[2]!.id)).to.equal(true);
      expect(await store.notificationDeliveries.get('t1', ds[2]!.id)).to.equal(null);
      expect(await store.notificationDeliveries.delete('t1', ds[2]!.id)).to.equal(false);
      expect(await store.notificationEndpoints.delete('t2', e.id)).to.equal(false);
      expect(await store.notificationEndpoints.delete('t1', e.id)).to.equal(true);
    });

    it('deletes an endpoint’s deliveries with it, and prunes ended deliveries of every tenant last changed before a time, a page at a time', async () => {
      const old = '2026-01-01T00:00:00.000Z';
      const recent = '2026-03-01T00:00:00.000Z';
      const delivery = (e: NotificationEndpoint, over: Partial<NotificationDelivery>): NotificationDelivery => ({
        id: newId('ntf'),
        tenant_id: e.tenant_id,
        endpoint_id: e.id,
        event_type: 'run.finished',
        payload: { type: 'run.finished', data: { secret: 'payload' } },
        status: 'succeeded',
        attempts: [],
        replays: 0,
        created_at: old,
        updated_at: old,
        ...over,
      });
      const kept = endpointFixture('t1');
      const removed = endpointFixture('t1');
      for (const e of [kept, removed]) await store.notificationEndpoints.insert(e);
      const ofRemoved = [delivery(removed, { status: 'pending' }), delivery(removed, { updated_at: recent })];
      for (const d of ofRemoved) await store.notificationDeliveries.insert(d);
      expect(await store.notificationEndpoints.delete('t2', removed.id), 'another tenant’s').to.equal(false);
      expect((await store.notificationDeliveries.list('t1', removed.id, { limit: 10 })).items).to.have.length(2);
      expect(await store.notificationEndpoints.delete('t1', removed.id)).to.equal(true);
      for (const d of ofRemoved) expect(await store.notificationDeliveries.get('t1', d.id), 'a removed endpoint’s delivery').to.equal(null);
      expect((await store.notificationDeliveries.list('t1', removed.id, { limit: 10 })).items).to.deep.equal([]);

      const other = endpointFixture('t2');
      await store.notificationEndpoints.insert(other);
      const expired = [delivery(kept, { status: 'succeeded' }), delivery(kept, { status: 'failed' }), delivery(other, { status: 'failed' })];
      const pending = delivery(kept, { status: 'pending' });
      const fresh = delivery(kept, { status: 'succeeded', updated_at: recent });
      for (const d of [...expired, pending, fresh]) await store.notificationDeliveries.insert(d);
      const before = '2026-02-01T00:00:00.000Z';
      expect(await store.notificationDeliveries.prune(before, 2), 'a page').to.equal(2);
      expect(await store.notificationDeliveries.prune(before, 2), 'the rest').to.equal(1);
      expect(await store.notificationDeliveries.prune(before, 2)).to.equal(0);
      for (const d of expired) expect(await store.notificationDeliveries.get(d.tenant_id, d.id), d.status).to.equal(null);
      expect(await store.notificationDeliveries.get('t1', pending.id), 'a pending one, however old').to.deep.equal(pending);
      expect(await store.notificationDeliveries.get('t1', fresh.id), 'one changed since').to.deep.equal(fresh);
    });

    it('inserts a notification endpoint under a cap on the tenant’s endpoints, disabled ones too, and stores nothing over it', async () => {
      const cap = { maxHeld: 2 };
      expect(await store.notificationEndpoints.insert(endpointFixture('t1'), cap)).to.equal('inserted');
      expect(await store.notificationEndpoints.insert(endpointFixture('t1', { status: 'disabled' }), cap)).to.equal('inserted');
      const over = endpointFixture('t1');
      expect(await store.notificationEndpoints.insert(over, cap), 'a disabled one is held').to.equal('over-cap');
      expect(await store.notificationEndpoints.get('t1', over.id)).to.equal(null);
      expect(await store.notificationEndpoints.list('t1')).to.have.length(2);
      expect(await store.notificationEndpoints.insert(endpointFixture('t2'), cap), 'another tenant has its own count').to.equal('inserted');
      expect(await store.notificationEndpoints.insert(endpointFixture('t1')), 'without a cap').to.equal('inserted');
      for (const e of (await store.notificationEndpoints.list('t1')).slice(0, 2)) await store.notificationEndpoints.delete('t1', e.id);
      expect(await store.notificationEndpoints.insert(endpointFixture('t1'), cap), 'a removed one is not held').to.equal('inserted');
    });

    racingCap(() => store, {
      what: 'a notification endpoint',
      make: endpointFixture,
      insert: (st, e, max) => st.notificationEndpoints.insert(e, { maxHeld: max }),
      get: (st, e) => st.notificationEndpoints.get(e.tenant_id, e.id),
      // what the cap counts, and what an event's deliveries are made for
      count: async (st, tenantId) => (await st.notificationEndpoints.list(tenantId)).length,
      seen: async (st, tenantId) => (await st.notificationEndpoints.list(tenantId)).map((e) => e.id),
      again: (e) => ({ ...e, url: 'https://hooks.example.com/again' }),
    });

    it('stores a delivery once per provider id and kind, per tenant, and answers the first for a repeat', async () => {
      const first = deliveryFixture('t1', { provider_delivery_id: 'gh-1' });
      expect(await store.deliveries.insert(first)).to.equal(null);
      expect(await store.deliveries.get('t1', first.id)).to.deep.equal(first);
      expect(await store.deliveries.get('t2', first.id)).to.equal(null);
      expect(await store.deliveries.insert(deliveryFixture('t1', { provider_delivery_id: 'gh-1' }))).to.deep.equal(first);
      expect(await store.deliveries.insert(deliveryFixture('t1', { provider_delivery_id: 'gh-1', kind: 'pager' }))).to.equal(null);
      expect(await store.deliveries.insert(deliveryFixture('t2', { provider_delivery_id: 'gh-1' }))).to.equal(null);
      // without a provider id nothing collides
      expect(await store.deliveries.insert(deliveryFixture('t1'))).to.equal(null);
      expect(await store.deliveries.insert(deliveryFixture('t1'))).to.equal(null);
    });

    it('lists deliveries newest first by kind and status with cursors, updates them conditionally, finds stale ones', async () => {
      const old = new Date(Date.now() - 60_000).toISOString();
      const ds = [
        deliveryFixture('t1', { received_at: old }),
        deliveryFixture('t1', { kind: 'pager' }),
        deliveryFixture('t1', { status: 'rejected', body: null }),
        deliveryFixture('t1'),
        deliveryFixture('t2'),
      ];
      for (const d of ds) await store.deliveries.insert(d);
      const all = await store.deliveries.list('t1', { limit: 10 });
      expect(all.items.map((d) => d.id)).to.deep.equal([ds[3]!.id, ds[2]!.id, ds[1]!.id, ds[0]!.id]);
      // summaries: everything but the body and the event (up to 1 MB each), which get answers
      const { body: _body, event_payload: _event, ...summary } = ds[3]!;
      expect(all.items[0]).to.deep.equal(summary);
      for (const d of all.items) expect(d).to.not.have.any.keys('body', 'event_payload');
      expect(await store.deliveries.get('t1', ds[3]!.id)).to.deep.equal(ds[3]);
      const codehost = await store.deliveries.list('t1', { kind: 'codehost', status: 'received', limit: 1 });
      expect(codehost.items.map((d) => d.id)).to.deep.equal([ds[3]!.id]);
      const next = await store.deliveries.list('t1', { kind: 'codehost', status: 'received', limit: 1, cursor: codehost.next_cursor! });
      expect(next.items.map((d) => d.id)).to.deep.equal([ds[0]!.id]);
      expect(next.next_cursor).to.equal(null);
      expect((await store.deliveries.list('t1', { status: 'rejected', limit: 10 })).items).to.have.length(1);
      // attempts and runs added atomically: writes asked at once all count, none written over
      const replayed = deliveryFixture('t5', { status: 'processed', attempts: 1, runs: [{ automation_id: 'aut_a', run_id: 'run_0' }] });
      await store.deliveries.insert(replayed);
      const claims = await Promise.all([1, 2, 3].map(() => store.deliveries.addAttempt('t5', replayed.id, ['processed', 'failed'])));
      expect(claims.map((c) => c!.attempts).sort()).to.deep.equal([2, 3, 4]);
      await Promise.all(
        [1, 2, 3].map((i) =>
          store.deliveries.addRuns('t5', replayed.id, [{ automation_id: 'aut_a', run_id: `run_${i}` }], { status: 'processed', error: null }, [
            'processed',
            'failed',
          ]),
        ),
      );
      const both = (await store.deliveries.get('t5', replayed.id))!;
      expect(both.runs.map((r) => r.run_id).sort()).to.deep.equal(['run_0', 'run_1', 'run_2', 'run_3']);
      expect(await store.deliveries.addAttempt('t5', replayed.id, ['received'])).to.equal(null);
      // an attempt given back (a replay that started nothing) only while it is still the latest
      expect(await store.deliveries.releaseAttempt('t5', replayed.id, 3)).to.equal(false);
      expect(await store.deliveries.releaseAttempt('t6', replayed.id, 4)).to.equal(false);
      expect(await store.deliveries.releaseAttempt('t5', replayed.id, 4)).to.equal(true);
      expect((await store.deliveries.get('t5', replayed.id))!).to.deep.include({ attempts: 3, status: 'processed' });
      expect((await store.deliveries.get('t5', replayed.id))!.runs).to.have.length(4);
      expect(await store.deliveries.addAttempt('t6', replayed.id, ['processed'])).to.equal(null);
      // by the body's digest: an accepted delivery of the tenant and kind, never a rejected one or another tenant's
      const digest = 'cd'.repeat(32);
      const rejected = deliveryFixture('t3', { status: 'rejected', body_sha256: digest });
      const accepted = deliveryFixture('t3', { body_sha256: digest });
      await store.deliveries.insert(rejected);
      expect(await store.deliveries.findByBody('t3', 'codehost', digest)).to.equal(null);
      await store.deliveries.insert(accepted);
      expect((await store.deliveries.findByBody('t3', 'codehost', digest))!.id).to.equal(accepted.id);
      expect(await store.deliveries.findByBody('t3', 'pager', digest)).to.equal(null);
      expect(await store.deliveries.findByBody('t4', 'codehost', digest)).to.equal(null);
      // by the digest of what was signed, kept with every delivery that has something signed once
      const signed = 'ef'.repeat(32);
      expect(await store.deliveries.findBySigned('t3', 'generic', signed)).to.equal(null);
      const genericOne = deliveryFixture('t3', { kind: 'generic', provider_delivery_id: 'd-1', signed_sha256: signed });
      await store.deliveries.insert(genericOne);
      expect(await store.deliveries.findBySigned('t3', 'generic', signed)).to.deep.include({ id: genericOne.id, signed_sha256: signed });
      expect(await store.deliveries.findBySigned('t3', 'codehost', signed)).to.equal(null);
      expect(await store.deliveries.findBySigned('t4', 'generic', signed)).to.equal(null);
      expect(await store.deliveries.findBySigned('t3', 'generic', digest)).to.equal(null);
      const done = await store.deliveries.update('t1', ds[0]!.id, { status: 'processed', runs: [{ automation_id: 'aut_x', run_id: 'run_y' }], attempts: 1 }, [
        'received',
      ]);
      expect(done).to.deep.include({ status: 'processed', attempts: 1, event: 'push' });
      expect(await store.deliveries.update('t1', ds[0]!.id, { status: 'failed' }, ['received'])).to.equal(null);
      expect(await store.deliveries.update('t2', ds[3]!.id, { status: 'failed' }, ['received'])).to.equal(null);
      expect((await store.deliveries.get('t1', ds[0]!.id))!.runs).to.deep.equal([{ automation_id: 'aut_x', run_id: 'run_y' }]);
      await store.deliveries.update('t1', ds[1]!.id, {}, ['received']);
      const stale = await store.deliveries.listStale('received', new Date(Date.now() - 1000).toISOString(), 10);
      expect(stale.map((d) => d.id)).to.deep.equal([]);
      const older = deliveryFixture('t2', { received_at: old });
      await store.deliveries.insert(older);
      expect((await store.deliveries.listStale('received', new Date(Date.now() - 30_000).toISOString(), 10)).map((d) => d.id)).to.deep.equal([older.id]);
      // page by page, by (received_at, id): deliveries received at one time are neither skipped nor read twice
      const twins = [deliveryFixture('t2', { received_at: old }), deliveryFixture('t1', { received_at: old })];
      for (const d of twins) await store.deliveries.insert(d);
      const cutoff = new Date(Date.now() - 30_000).toISOString();
      const firstPage = await store.deliveries.listStale('received', cutoff, 2);
      const rest = await store.deliveries.listStale('received', cutoff, 2, firstPage.at(-1));
      expect([...firstPage, ...rest].map((d) => d.id)).to.deep.equal([older.id, ...twins.map((d) => d.id)].sort());
      expect(await store.deliveries.listStale('received', cutoff, 2, rest.at(-1))).to.deep.equal([]);
      // rejected ones received before a time are deleted, oldest first, a page at a time; nothing else is
      const oldRejected = [1, 2, 3].map((i) => deliveryFixture('t5', { status: 'rejected', received_at: new Date(Date.now() - 3_600_000 + i).toISOString() }));
      const newRejected = deliveryFixture('t5', { status: 'rejected' });
      const oldReceived = deliveryFixture('t5', { received_at: new Date(Date.now() - 3_600_000).toISOString() });
      for (const d of [...oldRejected, newRejected, oldReceived]) await store.deliveries.insert(d);
      const minuteAgo = new Date(Date.now() - 60_000).toISOString();
      expect(await store.deliveries.pruneRejected(minuteAgo, 2)).to.equal(2);
      expect(await store.deliveries.get('t5', oldRejected[0]!.id)).to.equal(null);
      expect(await store.deliveries.get('t5', oldRejected[2]!.id)).to.not.equal(null);
      expect(await store.deliveries.pruneRejected(minuteAgo, 2)).to.equal(1);
      expect(await store.deliveries.pruneRejected(minuteAgo, 2)).to.equal(0);
      expect((await store.deliveries.get('t5', newRejected.id))!.status).to.equal('rejected');
      expect((await store.deliveries.get('t5', oldReceived.id))!.status).to.equal('received');
    });

    it('deletes the body and event of processed and failed deliveries received before a time, oldest first, and keeps their records', async () => {
      const hourAgo = (i: number) => new Date(Date.now() - 3_600_000 + i).toISOString();
      const ended = [
        deliveryFixture('t6', {
          status: 'processed',
          received_at: hourAgo(1),
          provider_delivery_id: 'gh-1',
          runs: [{ automation_id: 'aut_1', run_id: 'run_1' }],
        }),
        deliveryFixture('t7', { status: 'failed', received_at: hourAgo(2) }),
        deliveryFixture('t6', { status: 'processed', received_at: hourAgo(3), signed_sha256: 'cd'.repeat(32) }),
      ];
      const recent = deliveryFixture('t6', { status: 'processed' });
      const waiting = deliveryFixture('t6', { status: 'received', received_at: hourAgo(0) });
      for (const d of [...ended, recent, waiting]) await store.deliveries.insert(d);
      const minuteAgo = new Date(Date.now() - 60_000).toISOString();
      const now = new Date().toISOString();
      expect(await store.deliveries.prunePayloads(minuteAgo, now, 2)).to.equal(2);
      expect((await store.deliveries.get('t6', ended[2]!.id))!.body).to.equal('{"a":1}');
      expect(await store.deliveries.prunePayloads(minuteAgo, now, 2)).to.equal(1);
      expect(await store.deliveries.prunePayloads(minuteAgo, now, 2)).to.equal(0);
      const pruned = (await store.deliveries.get('t6', ended[0]!.id))!;
      expect(pruned).to.deep.equal({ ...ended[0]!, body: null, event_payload: null, payload_pruned_at: now });
      // no replay claims an attempt of it any more
      expect(await store.deliveries.addAttempt('t6', ended[0]!.id, ['processed', 'failed'])).to.equal(null);
      expect((await store.deliveries.get('t6', ended[0]!.id))!.attempts).to.equal(ended[0]!.attempts);
      // the record is still found by what identifies a replay
      expect(await store.deliveries.findByBody('t7', 'codehost', ended[1]!.body_sha256!)).to.deep.include({ id: ended[1]!.id });
      expect((await store.deliveries.findBySigned('t6', 'codehost', 'cd'.repeat(32)))!.id).to.equal(ended[2]!.id);
      expect((await store.deliveries.get('t7', ended[1]!.id))!).to.deep.include({ status: 'failed', body: null, event_payload: null, payload_pruned_at: now });
      // a list's summaries say so too
      const listed = (await store.deliveries.list('t6', { limit: 10 })).items;
      expect(listed.find((d) => d.id === ended[0]!.id)).to.deep.include({ payload_pruned_at: now });
      // a recent one and one still being processed keep theirs
      expect((await store.deliveries.get('t6', recent.id))!).to.deep.equal(recent);
      expect((await store.deliveries.get('t6', waiting.id))!).to.deep.equal(waiting);
    });

    it('lists enabled automations with a trigger type for one tenant', async () => {
      const hook = automationFixture('t1', { triggers: [{ type: 'webhook', provider: 'codehost' }] });
      await store.automations.insert(hook);
      await store.automations.insert(automationFixture('t2', { triggers: [{ type: 'webhook', provider: 'codehost' }] }));
      await store.automations.insert(automationFixture('t1', { status: 'disabled', triggers: [{ type: 'webhook', provider: 'codehost' }] }));
      await store.automations.insert(automationFixture('t1'));
      expect((await store.automations.listEnabledWithTrigger('webhook', 't1')).map((a) => a.id)).to.deep.equal([hook.id]);
      expect(await store.automations.listEnabledWithTrigger('webhook')).to.have.length(2);
    });

    it('keeps sessions per tenant, lists them by status and kind without archived ones, and updates them conditionally', async () => {
      const now = new Date().toISOString();
      const session = (tenant: string, over: Partial<Session> = {}): Session => ({
        id: newId('ses'),
        tenant_id: tenant,
        title: 't',
        goal: null,
        kind: 'multi_agent',
        status: 'idle',
        outcome: null,
        metadata: { nested: { list: [1, null] } },
        created_at: now,
        updated_at: now,
        ...over,
      });
      const a = session('t1');
      const b = session('t1', { kind: 'autonomy', status: 'running' });
      const gone = session('t1', { status: 'archived' });
      for (const x of [a, b, gone, session('t2')]) await store.sessions.insert(x);
      expect(await store.sessions.get('t1', a.id)).to.deep.equal(a);
      expect(await store.sessions.get('t2', a.id)).to.equal(null);
      expect((await store.sessions.list('t1', { limit: 10 })).items.map((x) => x.id)).to.deep.equal([b.id, a.id]);
      expect((await store.sessions.list('t1', { kind: 'autonomy', limit: 10 })).items.map((x) => x.id)).to.deep.equal([b.id]);
      expect((await store.sessions.list('t1', { status: 'archived', limit: 10 })).items.map((x) => x.id)).to.deep.equal([gone.id]);
      const first = await store.sessions.list('t1', { limit: 1 });
      expect((await store.sessions.list('t1', { limit: 1, cursor: first.next_cursor! })).items.map((x) => x.id)).to.deep.equal([a.id]);
      expect(await store.sessions.update('t1', a.id, { status: 'paused' }, ['running'])).to.equal(null);
      expect((await store.sessions.update('t1', a.id, { status: 'paused', title: 'new' }, ['idle', 'running']))!).to.deep.include({
        status: 'paused',
        title: 'new',
        kind: 'multi_agent',
      });
      expect(await store.sessions.update('t2', a.id, { status: 'idle' }, ['paused'])).to.equal(null);
      // conditional on the outcome too, when one is named (null included): the second of two recounts that read the same writes nothing
      expect(await store.sessions.update('t1', a.id, { outcome: 'succeeded' }, ['paused'], 'failed')).to.equal(null);
      expect((await store.sessions.update('t1', a.id, { outcome: 'succeeded' }, ['paused'], null))!.outcome).to.equal('succeeded');
      expect(await store.sessions.update('t1', a.id, { outcome: 'succeeded' }, ['paused'], null)).to.equal(null);
      expect((await store.sessions.update('t1', a.id, { outcome: null }, ['paused']))!.outcome).to.equal(null);
      // the reconciler's stale sessions, oldest first, ties by id, a page at a time: a tenant's sessions that
      // wait for good hide no other tenant's behind them
      const old = '2020-01-01T00:00:00.000Z';
      const hog = Array.from({ length: 3 }, () => session('hog', { status: 'waiting', updated_at: old }));
      const victim = session('victim', { status: 'waiting', updated_at: '2020-01-01T00:00:01.000Z' });
      const notStale = session('victim', { status: 'waiting' });
      for (const x of [...hog, victim, notStale, session('victim', { status: 'waiting', kind: 'autonomy', updated_at: old })]) await store.sessions.insert(x);
      const cutoff = '2021-01-01T00:00:00.000Z';
      const firstPage = await store.sessions.listStale('waiting', cutoff, 2);
      expect(firstPage.map((x) => x.id)).to.deep.equal(
        hog
          .map((x) => x.id)
          .sort()
          .slice(0, 2),
      );
      const second = await store.sessions.listStale('waiting', cutoff, 2, firstPage.at(-1)!);
      expect(second.map((x) => x.id)).to.deep.equal([hog.map((x) => x.id).sort()[2], victim.id]);
      expect(await store.sessions.listStale('waiting', cutoff, 2, second.at(-1)!)).to.deep.equal([]);
    });

    it('keeps a session’s agents in the order they were added, per tenant', async () => {
      const agent = (name: string, tenant = 't1'): AgentRecord => agentFixture(tenant, { name });
      const [x, y] = [agent('x'), agent('y')];
      for (const a of [x, y, agent('z', 't2')]) await store.agents.insert(a);
      expect((await store.agents.list('t1', 'ses_a')).map((a) => a.name)).to.deep.equal(['x', 'y']);
      expect(await store.agents.get('t1', 'ses_a', y.id)).to.deep.equal(y);
      expect(await store.agents.get('t2', 'ses_a', y.id)).to.equal(null);
      expect(await store.agents.get('t1', 'ses_other', y.id)).to.equal(null);
      // edited in place, and only in its own tenant and session
      const edited = await store.agents.update('t1', 'ses_a', y.id, {
        instructions: 'do it better',
        budget: { seconds: 90, max_steps: 3 },
        updated_at: 'later',
      });
      expect(edited).to.deep.equal({ ...y, instructions: 'do it better', budget: { seconds: 90, max_steps: 3 }, updated_at: 'later' });
      expect(await store.agents.get('t1', 'ses_a', y.id)).to.deep.equal(edited);
      // a budget's members merged by the update itself: two changes of different members at once both land
      await Promise.all([
        store.agents.update('t1', 'ses_a', y.id, {}, { budget: { seconds: 120 } }),
        store.agents.update('t1', 'ses_a', y.id, {}, { budget: { max_steps: null } }),
      ]);
      expect((await store.agents.get('t1', 'ses_a', y.id))!.budget).to.deep.equal({ seconds: 120 });
      await store.agents.update('t1', 'ses_a', y.id, { budget: { seconds: 90, max_steps: 3 } });
      expect(await store.agents.update('t2', 'ses_a', y.id, { name: 'stolen' })).to.equal(null);
      expect(await store.agents.update('t1', 'ses_other', y.id, { name: 'stolen' })).to.equal(null);
      expect((await store.agents.get('t1', 'ses_a', y.id))!.name).to.equal('y');
      // nothing is written in an archived session: not a new agent, not an edit (another tenant's session of that id is not it)
      const now2 = new Date().toISOString();
      const base = { title: 't', goal: null, kind: 'multi_agent' as const, outcome: null, metadata: {}, created_at: now2, updated_at: now2 };
      await store.sessions.insert({ ...base, id: 'ses_a', tenant_id: 't1', status: 'archived' });
      await store.sessions.insert({ ...base, id: 'ses_a', tenant_id: 't2', status: 'idle' }).catch(() => undefined);
      expect(await store.agents.insert(agent('late'))).to.equal('archived');
      expect(await store.agents.update('t1', 'ses_a', y.id, { name: 'late' })).to.equal(null);
      expect((await store.agents.list('t1', 'ses_a')).map((a) => a.name)).to.deep.equal(['x', 'y']);
      expect(await store.agents.insert(agent('other', 't2'))).to.equal('inserted');
      // under a cap on the agents a session holds: one more is refused, and nothing is stored
      expect(await store.agents.insert({ ...agent('capped', 't2'), session_id: 'ses_cap' }, { maxHeld: 1 })).to.equal('inserted');
      expect(await store.agents.insert({ ...agent('over', 't2'), session_id: 'ses_cap' }, { maxHeld: 1 })).to.equal('over-cap');
      expect((await store.agents.list('t2', 'ses_cap')).map((a) => a.name)).to.deep.equal(['capped']);
    });

    // the cap is a session's: every agent of the race is of one session of the tenant
    racingCap(() => store, {
      what: 'an agent',
      make: (tenantId) => agentFixture(tenantId, { session_id: 'ses_race' }),
      insert: async (st, a, max) => {
        const inserted = await st.agents.insert(a, { maxHeld: max });
        if (inserted === 'archived') throw new Error('no session of the race is archived');
        return inserted;
      },
      get: (st, a) => st.agents.get(a.tenant_id, a.session_id, a.id),
      // what the cap counts, and what a task is given to
      count: async (st, tenantId) => (await st.agents.list(tenantId, 'ses_race')).length,
      seen: async (st, tenantId) => (await st.agents.list(tenantId, 'ses_race')).map((a) => a.id),
      again: (a) => ({ ...a, name: 'again' }),
    });

    it('numbers a session’s messages 1, 2, 3 even when written at once, and pages them by seq per tenant', async () => {
      const message = (i: number, session = 'ses_m', tenant = 't1') => ({
        id: newId('msg'),
        tenant_id: tenant,
        session_id: session,
        role: 'user' as const,
        from: null,
        to: null,
        kind: 'text',
        parts: [{ type: 'text' as const, text: `m${i}` }],
        task_id: null,
        run_id: null,
        in_reply_to: null,
        created_at: new Date().toISOString(),
      });
      const written = await Promise.all([1, 2, 3, 4, 5].map((i) => store.messages.append(message(i))));
      expect(written.map((m) => m!.seq).sort()).to.deep.equal([1, 2, 3, 4, 5]);
      expect((await store.messages.append(message(9, 'ses_other')))!.seq).to.equal(1);
      // none in an archived session
      const at = new Date().toISOString();
      await store.sessions.insert({
        id: 'ses_shut',
        tenant_id: 't1',
        title: 't',
        goal: null,
        kind: 'multi_agent',
        status: 'archived',
        outcome: null,
        metadata: {},
        created_at: at,
        updated_at: at,
      });
      expect(await store.messages.append(message(1, 'ses_shut'))).to.equal(null);
      expect(await store.messages.lastSeq('t1', 'ses_shut')).to.equal(0);
      expect((await store.messages.append(message(1, 'ses_shut', 't2')))!.seq, 'another tenant’s session of that id').to.equal(1);
      const page = await store.messages.list('t1', 'ses_m', { limit: 2 });
      expect(page.map((m) => m.seq)).to.deep.equal([1, 2]);
      expect((await store.messages.list('t1', 'ses_m', { afterSeq: 2, limit: 10 })).map((m) => m.seq)).to.deep.equal([3, 4, 5]);
      expect(await store.messages.list('t2', 'ses_m', { limit: 10 })).to.deep.equal([]);
      expect(await store.messages.lastSeq('t1', 'ses_m')).to.equal(5);
      expect(await store.messages.lastSeq('t2', 'ses_m')).to.equal(0);
      expect(await store.messages.lastSeq('t1', 'ses_none')).to.equal(0);
      // one by id: only in its own session and tenant
      expect(await store.messages.get('t1', 'ses_m', written[2]!.id)).to.deep.include({ id: written[2]!.id, seq: written[2]!.seq });
      expect(await store.messages.get('t1', 'ses_other', written[2]!.id)).to.equal(null);
      expect(await store.messages.get('t2', 'ses_m', written[2]!.id)).to.equal(null);
      expect(await store.messages.get('t1', 'ses_m', 'msg_none')).to.equal(null);
    });

    it('keeps a session’s tasks by their own ids, inserts a batch all or none, lists in creation order and updates conditionally', async () => {
      const at = (ms: number) => new Date(Date.UTC(2026, 0, 1) + ms).toISOString();
      const task = (id: string, over: Partial<TaskRecord> = {}): TaskRecord => taskFixture({ id, title: id, created_at: at(0), updated_at: at(0), ...over });
      expect(await store.tasks.insertMany([task('a'), task('b', { depends_on: ['a'], created_at: at(1) })])).to.equal('inserted');
      // the same ids in another session or tenant are other tasks
      await store.tasks.insertMany([task('a', { session_id: 'ses_u' }), task('a', { tenant_id: 't2' })]);
      // a batch with a taken id writes nothing, and says so
      expect(await store.tasks.insertMany([task('c', { created_at: at(2) }), task('a')])).to.equal('id-taken');
      expect((await store.tasks.list('t1', 'ses_t')).map((t) => t.id)).to.deep.equal(['a', 'b']);
      expect(await store.tasks.get('t2', 'ses_t', 'b')).to.equal(null);
      expect((await store.tasks.get('t1', 'ses_t', 'b'))!.depends_on).to.deep.equal(['a']);
      // some tasks of a session by id, in creation order: never another session's or tenant's, unknown ids left out
      expect((await store.tasks.getMany('t1', 'ses_t', ['b', 'zz', 'a'])).map((t) => `${t.tenant_id}/${t.session_id}/${t.id}`)).to.deep.equal([
        't1/ses_t/a',
        't1/ses_t/b',
      ]);
      expect((await store.tasks.getMany('t2', 'ses_t', ['a', 'b'])).map((t) => t.id)).to.deep.equal(['a']);
      expect(await store.tasks.getMany('t1', 'ses_t', [])).to.deep.equal([]);
      expect(await store.tasks.update('t1', 'ses_t', 'a', { status: 'running' }, ['queued'])).to.equal(null);
      const done = await store.tasks.update('t1', 'ses_t', 'a', { status: 'succeeded', output: { ok: true }, run_ids: ['run_x'], updated_at: at(5) }, [
        'pending',
      ]);
      expect(done).to.deep.include({ status: 'succeeded', id: 'a', session_id: 'ses_t' });
      expect(await store.tasks.counts('t1', 'ses_t')).to.deep.equal({ succeeded: 1, pending: 1 });
      // a change that keeps the status moves no count
      await store.tasks.update('t1', 'ses_t', 'a', { output: { ok: 'again' } }, ['succeeded']);
      expect(await store.tasks.counts('t1', 'ses_t')).to.deep.equal({ succeeded: 1, pending: 1 });
      expect(await store.tasks.counts('t3', 'ses_t')).to.deep.equal({});
      expect((await store.tasks.listStale('pending', at(10), 10)).map((t) => `${t.tenant_id}/${t.session_id}/${t.id}`).sort()).to.deep.equal([
        't1/ses_t/b',
        't1/ses_u/a',
        't2/ses_t/a',
      ]);
      // page by page: the first page's last task leads to the rest, none twice
      const first = await store.tasks.listStale('pending', at(10), 2);
      const rest = await store.tasks.listStale('pending', at(10), 2, first.at(-1));
      expect([...first, ...rest].map((t) => `${t.tenant_id}/${t.session_id}/${t.id}`).sort()).to.deep.equal(['t1/ses_t/b', 't1/ses_u/a', 't2/ses_t/a']);
      expect(rest).to.have.length(1);
    });

    it('lists a session’s tasks in one status, and all of them without their outputs, in creation order', async () => {
      const at = (ms: number) => new Date(Date.UTC(2026, 0, 1) + ms).toISOString();
      const task = (id: string, over: Partial<TaskRecord> = {}): TaskRecord =>
        taskFixture({ id, session_id: 'ses_l', created_at: at(id.charCodeAt(0)), updated_at: at(0), ...over });
      const output = { status: 'succeeded', steps: [{ tool: 'shell', output: { stdout: 'big' } }] };
      await store.tasks.insertMany([
        task('a', { status: 'input_required', output: { input_required: { message_id: 'msg_1', seq: 3 } } }),
        task('b'),
        task('c', { status: 'succeeded', output }),
        task('d', { status: 'input_required', output: { input_required: { message_id: 'msg_2', seq: 4 } } }),
        // the same status in another session and tenant: not this session's
        task('e', { status: 'input_required', session_id: 'ses_l2' }),
        task('f', { status: 'input_required', tenant_id: 't2' }),
      ]);
      const waiting = await store.tasks.listIn('t1', 'ses_l', 'input_required');
      expect(waiting.map((t) => t.id)).to.deep.equal(['a', 'd']);
      expect(waiting[1]!.output).to.deep.equal({ input_required: { message_id: 'msg_2', seq: 4 } });
      expect(await store.tasks.listIn('t1', 'ses_l', 'running')).to.deep.equal([]);
      // without outputs: every other field as list has it
      const briefs = await store.tasks.listBriefs('t1', 'ses_l');
      const full = await store.tasks.list('t1', 'ses_l');
      expect(briefs.map((t) => t.id)).to.deep.equal(['a', 'b', 'c', 'd']);
      expect(briefs.every((t) => !('output' in t))).to.equal(true);
      expect(briefs).to.deep.equal(full.map(({ output: _, ...rest }) => rest));
      expect((await store.tasks.listBriefs('t2', 'ses_l')).map((t) => t.id)).to.deep.equal(['f']);
      // with the output's summary: all but its result and steps
      const big = {
        status: 'succeeded',
        summary: 'done',
        usage: { steps: 1 },
        result: { final_answer: 'x'.repeat(1000) },
        steps: [{ tool: 'shell', output: 'y' }],
      };
      await store.tasks.update('t1', 'ses_l', 'b', { status: 'succeeded', output: big }, ['pending']);
      const summaries = await store.tasks.listSummaries('t1', 'ses_l');
      expect(summaries.map((t) => t.id)).to.deep.equal(['a', 'b', 'c', 'd']);
      expect(summaries.map((t) => t.output)).to.deep.equal([
        { input_required: { message_id: 'msg_1', seq: 3 } },
        { status: 'succeeded', summary: 'done', usage: { steps: 1 } },
        { status: 'succeeded' },
        { input_required: { message_id: 'msg_2', seq: 4 } },
      ]);
      expect(summaries.map(({ output: _, ...rest }) => rest)).to.deep.equal(await store.tasks.listBriefs('t1', 'ses_l'));
      // a waiting task's question: its first SUMMARY_QUESTION_MAX characters (code points, not UTF-16 units) in the summary
      const question = `${'é'.repeat(SUMMARY_QUESTION_MAX - 1)}😀${'z'.repeat(99_000)}`;
      const asking = { input_required: { question, message_id: 'msg_9', seq: 9 }, run_id: 'run_9' };
      await store.tasks.update('t1', 'ses_l', 'd', { output: asking }, ['input_required']);
      const [cut] = (await store.tasks.listSummaries('t1', 'ses_l')).filter((t) => t.id === 'd');
      expect(cut!.output).to.deep.equal({
        input_required: { question: `${'é'.repeat(SUMMARY_QUESTION_MAX - 1)}😀`, question_truncated: true, message_id: 'msg_9', seq: 9 },
        run_id: 'run_9',
      });
      expect((await store.tasks.get('t1', 'ses_l', 'd'))!.output, 'the task keeps it whole').to.deep.equal(asking);
    });

    it('inserts a batch of tasks under a cap on what its session holds, and stores none of a batch that would pass it', async () => {
      const task = (id: string, session_id = 'ses_c') => taskFixture({ id, session_id });
      const cap = { maxHeld: 4 };
      expect(await store.tasks.insertMany([task('a'), task('b')], cap)).to.equal('inserted');
      await store.tasks.update('t1', 'ses_c', 'a', { status: 'succeeded' }, ['pending']);
      expect(await store.tasks.insertMany([task('c'), task('d'), task('e')], cap), 'an ended task is held too').to.equal('over-cap');
      expect((await store.tasks.list('t1', 'ses_c')).map((t) => t.id)).to.deep.equal(['a', 'b']);
      expect(await store.tasks.insertMany([task('c'), task('d')], cap), 'up to the cap').to.equal('inserted');
      expect(await store.tasks.insertMany([task('a', 'ses_d'), task('b', 'ses_d')], cap), 'another session has its own count').to.equal('inserted');
      // racing batches that each fit, but not together: one is stored, whole
      const raced = [
        [task('x1', 'ses_r'), task('x2', 'ses_r'), task('x3', 'ses_r')],
        [task('y1', 'ses_r'), task('y2', 'ses_r'), task('y3', 'ses_r')],
        [task('z1', 'ses_r'), task('z2', 'ses_r')],
      ];
      const outcomes = await Promise.all(raced.map((batch) => store.tasks.insertMany(batch, cap)));
      expect(outcomes.filter((o) => o === 'inserted')).to.have.length(1);
      const won = raced[outcomes.indexOf('inserted')]!;
      expect((await store.tasks.list('t1', 'ses_r')).map((t) => t.id).sort()).to.deep.equal(won.map((t) => t.id).sort());
    });

    it('numbers a capped batch from the count it checks: batches that race never share a position, each in one run', async () => {
      const task = (id: string) => taskFixture({ id, session_id: 'ses_n', position: 1 });
      const cap = { maxHeld: 100 };
      const batches = [
        [task('a1'), task('a2')],
        [task('b1'), task('b2'), task('b3')],
      ];
      expect(await Promise.all(batches.map((b) => store.tasks.insertMany(b, cap)))).to.deep.equal(['inserted', 'inserted']);
      const stored = new Map((await store.tasks.list('t1', 'ses_n')).map((t) => [t.id, t.position]));
      expect([...stored.values()].sort()).to.deep.equal([1, 2, 3, 4, 5]);
      for (const b of batches) {
        const positions = b.map((t) => stored.get(t.id)!);
        expect(positions, 'consecutive').to.deep.equal(positions.map((_, i) => positions[0]! + i));
        // the records given carry them too
        expect(b.map((t) => t.position)).to.deep.equal(positions);
      }
      expect(await store.tasks.insertMany([task('c1')], cap)).to.equal('inserted');
      expect((await store.tasks.get('t1', 'ses_n', 'c1'))!.position).to.equal(6);
    });

    it('inserts a batch `whileLive` only while its session is not archived, checked before the cap, and keeps nothing of a refused one', async () => {
      const now = new Date().toISOString();
      const session = (id: string, tenant: string, status: Session['status']): Session => ({
        id,
        tenant_id: tenant,
        title: 't',
        goal: null,
        kind: 'multi_agent',
        status,
        outcome: null,
        metadata: {},
        created_at: now,
        updated_at: now,
      });
      await store.sessions.insert(session('ses_live', 't1', 'idle'));
      await store.sessions.insert(session('ses_gone', 't1', 'archived'));
      const task = (id: string, session_id: string) => taskFixture({ id, session_id });
      const live = { maxHeld: 2, whileLive: true };
      expect(await store.tasks.insertMany([task('a', 'ses_live')], live)).to.equal('inserted');
      expect(await store.tasks.insertMany([task('a', 'ses_gone'), task('b', 'ses_gone'), task('c', 'ses_gone')], live), 'archived, and over the cap').to.equal(
        'archived',
      );
      expect(await store.tasks.list('t1', 'ses_gone')).to.deep.equal([]);
      // the session of the batch's own tenant: another tenant's archived session of that id is not it
      expect(await store.tasks.insertMany([taskFixture({ id: 'a', tenant_id: 't2', session_id: 'ses_gone' })], live)).to.equal('inserted');
      // without whileLive the batch goes in (the reconciler's repairs, a process that stored its tasks before the archive)
      expect(await store.tasks.insertMany([task('a', 'ses_gone')], { maxHeld: 2 })).to.equal('inserted');
      await store.sessions.update('t1', 'ses_live', { status: 'archived' }, ['idle']);
      expect(await store.tasks.insertMany([task('b', 'ses_live')], live)).to.equal('archived');
      expect((await store.tasks.list('t1', 'ses_live')).map((t) => t.id)).to.deep.equal(['a']);
    });

    it('clears the outcome of an ended session with a batch `reopenAt`, its status kept, and of no other: an archived one, a refused batch, another tenant’s', async () => {
      const then = new Date(Date.UTC(2026, 0, 1)).toISOString();
      const now = new Date(Date.UTC(2026, 0, 2)).toISOString();
      const session = (id: string, status: Session['status'], outcome: Session['outcome']): Session => ({
        id,
        tenant_id: 't1',
        title: 't',
        goal: null,
        kind: 'multi_agent',
        status,
        outcome,
        metadata: {},
        created_at: then,
        updated_at: then,
      });
      for (const s of [
        session('ses_done', 'idle', 'succeeded'),
        session('ses_held', 'paused', 'failed'),
        session('ses_shut', 'archived', 'canceled'),
        session('ses_open', 'idle', null),
        session('ses_mine', 'idle', 'succeeded'),
      ])
        await store.sessions.insert(s);
      const task = (id: string, session_id: string) => taskFixture({ id, session_id });
      const reopen = { maxHeld: 3, whileLive: true, reopenAt: now };
      const state = async (id: string) => {
        const s = (await store.sessions.get('t1', id))!;
        return { status: s.status, outcome: s.outcome, updated_at: s.updated_at };
      };
      // refused, the batch reopens nothing: over the cap, a taken id
      expect(await store.tasks.insertMany([task('a', 'ses_done'), task('b', 'ses_done'), task('c', 'ses_done'), task('d', 'ses_done')], reopen)).to.equal(
        'over-cap',
      );
      await store.tasks.insertMany([task('a', 'ses_done')], { maxHeld: 3 });
      expect(await store.tasks.insertMany([task('a', 'ses_done')], reopen)).to.equal('id-taken');
      // without reopenAt, the outcome is the caller's to change
      expect(await store.tasks.insertMany([task('b', 'ses_done')], { maxHeld: 3, whileLive: true })).to.equal('inserted');
      expect(await state('ses_done')).to.deep.equal({ status: 'idle', outcome: 'succeeded', updated_at: then });
      expect(await store.tasks.insertMany([task('c', 'ses_done')], reopen)).to.equal('reopened');
      expect(await store.sessions.get('t1', 'ses_done'), 'the rest of it as it was').to.deep.equal({
        ...session('ses_done', 'idle', 'succeeded'),
        outcome: null,
        updated_at: now,
      });
      expect((await store.tasks.list('t1', 'ses_done')).map((t) => t.id)).to.deep.equal(['a', 'b', 'c']);
      // a batch of another tenant under a session id of this one's
      expect(await store.tasks.insertMany([taskFixture({ id: 'a', tenant_id: 't2', session_id: 'ses_mine' })], reopen)).to.equal('inserted');
      expect(await state('ses_mine'), 'another tenant’s batch').to.deep.equal({ status: 'idle', outcome: 'succeeded', updated_at: then });
      // a paused one stays paused; one with no outcome is not written
      expect(await store.tasks.insertMany([task('a', 'ses_held')], reopen)).to.equal('reopened');
      expect(await state('ses_held')).to.deep.equal({ status: 'paused', outcome: null, updated_at: now });
      expect(await store.tasks.insertMany([task('a', 'ses_open')], reopen)).to.equal('inserted');
      expect(await state('ses_open')).to.deep.equal({ status: 'idle', outcome: null, updated_at: then });
      // an archived one keeps the outcome its archive gave, whether or not the batch goes in
      expect(await store.tasks.insertMany([task('a', 'ses_shut')], reopen)).to.equal('archived');
      expect(await store.tasks.insertMany([task('a', 'ses_shut')], { ...reopen, whileLive: false })).to.equal('inserted');
      expect(await state('ses_shut')).to.deep.equal({ status: 'archived', outcome: 'canceled', updated_at: then });
    });

    it('refuses a batch over the cap before a taken id, as one transaction checks them, and keeps nothing of a refused batch', async () => {
      const task = (id: string) => taskFixture({ id, session_id: 'ses_o' });
      expect(await store.tasks.insertMany([task('a'), task('b')], { maxHeld: 3 })).to.equal('inserted');
      expect(await store.tasks.insertMany([task('c'), task('a')], { maxHeld: 3 }), 'over the cap, and a taken id').to.equal('over-cap');
      expect(await store.tasks.insertMany([task('c'), task('a')], { maxHeld: 4 }), 'within the cap, a taken id').to.equal('id-taken');
      expect(await store.tasks.insertMany([task('d'), task('d')], { maxHeld: 4 }), 'an id named twice').to.equal('id-taken');
      expect((await store.tasks.list('t1', 'ses_o')).map((t) => t.id)).to.deep.equal(['a', 'b']);
      expect(await store.tasks.insertMany([task('c')], { maxHeld: 3 }), 'the refusals held nothing back').to.equal('inserted');
    });

    it('never shows a task of a batch it refuses, not while batches race: over the cap, or reusing an id another took', async () => {
      const task = (id: string, session_id: string) => taskFixture({ id, session_id });
      const race = async (session: string, batches: TaskRecord[][]) => {
        const seen = new Set<string>();
        const outcomes = await readingWhile(Promise.all(batches.map((b) => store.tasks.insertMany(b, { maxHeld: 4 }))), async () => {
          for (const t of await store.tasks.list('t1', session)) seen.add(t.id);
        });
        expect(
          outcomes.filter((o) => o === 'inserted'),
          outcomes.join(),
        ).to.have.length(1);
        const won = batches[outcomes.indexOf('inserted')]!.map((t) => t.id);
        expect((await store.tasks.list('t1', session)).map((t) => t.id).sort()).to.deep.equal([...won].sort());
        expect(
          [...seen].filter((id) => !won.includes(id)),
          'read during the race',
        ).to.deep.equal([]);
        return outcomes;
      };
      const over = ['p', 'q', 'r', 's'].map((k) => [task(`${k}1`, 'ses_v'), task(`${k}2`, 'ses_v'), task(`${k}3`, 'ses_v')]);
      expect((await race('ses_v', over)).filter((o) => o === 'over-cap')).to.have.length(3);
      // each batch fits; each names `shared`, so one alone can be stored
      const sharing = ['p', 'q', 'r'].map((k) => [task(`${k}1`, 'ses_w'), task('shared', 'ses_w')]);
      expect((await race('ses_w', sharing)).filter((o) => o === 'id-taken')).to.have.length(2);
    });

    it('appends a tenant’s ledger after its head, never twice to one head, keeps payloads once, and lists by seq and time', async () => {
      const entry = (tenantId: string, seq: number, prev: string, at: string) => ({
        tenant_id: tenantId,
        seq,
        at,
        kind: 'gate.result',
        subject: { workspace: '.', commit: null },
        payload_digest: 'sha256:p',
        prev_hash: prev,
        hash: `h${seq}`,
        key_id: 'k',
        sig: 's',
      });
      const appendOne = (tenantId: string, at: string) =>
        store.evidence.append(tenantId, (head) => [entry(tenantId, (head?.seq ?? 0) + 1, head?.hash ?? 'genesis', at)], [{ digest: 'sha256:p', body: '{}' }]);
      // ten writers at once: one chain, no seq twice
      await Promise.all(Array.from({ length: 10 }, (_, i) => appendOne('t1', `2026-01-01T00:00:0${i}.000Z`)));
      const all = await store.evidence.list('t1', { limit: 100 });
      expect(all.map((e) => e.seq)).to.deep.equal([1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
      expect(all.every((e, i) => e.prev_hash === (i ? all[i - 1]!.hash : 'genesis'))).to.equal(true);
      expect((await store.evidence.head('t1'))!.seq).to.equal(10);
      expect(await store.evidence.head('t2')).to.equal(null);
      expect(await store.evidence.list('t2', { limit: 10 })).to.deep.equal([]);
      // a batch after the head
      const batch = await store.evidence.append(
        't1',
        (head) => [
          entry('t1', head!.seq + 1, head!.hash, '2026-02-01T00:00:00.000Z'),
          entry('t1', head!.seq + 2, `h${head!.seq + 1}`, '2026-02-01T00:00:00.000Z'),
        ],
        [],
      );
      expect(batch.map((e) => e.seq)).to.deep.equal([11, 12]);
      expect((await store.evidence.list('t1', { afterSeq: 10, limit: 10 })).map((e) => e.seq)).to.deep.equal([11, 12]);
      expect((await store.evidence.list('t1', { since: '2026-02-01T00:00:00.000Z', limit: 10 })).map((e) => e.seq)).to.deep.equal([11, 12]);
      expect(await store.evidence.payloads('t1', ['sha256:p', 'sha256:none'])).to.deep.equal([{ digest: 'sha256:p', body: '{}' }]);
      expect(await store.evidence.payloads('t2', ['sha256:p'])).to.deep.equal([]);
    });

    it('finds the first ledger entry of a kind about a report, per tenant', async () => {
      const entry = ledgerEntryFixture;
      const items: [string, Record<string, string>][] = [
        ['gate.result', { workspace: '.' }],
        ['run.finished', { report_id: 'aud_1', run_id: 'run_1' }],
        ['audit.report', { workspace: '.', report_id: 'aud_1' }],
        ['audit.report', { workspace: '.', report_id: 'aud_2' }],
        ['audit.report', { workspace: '.', report_id: 'aud_1' }],
      ];
      for (const [kind, subject] of items)
        await store.evidence.append('t1', (head) => [entry('t1', (head?.seq ?? 0) + 1, head?.hash ?? 'genesis', kind, subject)], []);
      expect((await store.evidence.firstOfReport('t1', 'audit.report', 'aud_1'))?.seq).to.equal(3);
      expect(await store.evidence.firstOfReport('t1', 'audit.report', 'aud_2')).to.deep.equal(
        entry('t1', 4, 'h3', 'audit.report', { workspace: '.', report_id: 'aud_2' }),
      );
      expect((await store.evidence.firstOfReport('t1', 'run.finished', 'aud_1'))?.seq).to.equal(2);
      expect(await store.evidence.firstOfReport('t1', 'audit.report', 'aud_3')).to.equal(null);
      expect(await store.evidence.firstOfReport('t1', 'gate.result', 'aud_1')).to.equal(null);
      expect(await store.evidence.firstOfReport('t2', 'audit.report', 'aud_1')).to.equal(null);
    });

    it('finds the ledger entries about a gate run, oldest first, per tenant', async () => {
      const entry = ledgerEntryFixture;
      const items: [string, string, Record<string, string>][] = [
        ['t1', 'gate.result', { workspace: '.', gate_id: 'test', gate_run_id: 'grn_1' }],
        ['t1', 'audit.report', { workspace: '.', report_id: 'aud_1' }],
        ['t1', 'gate.result', { workspace: '.', gate_id: 'test', gate_run_id: 'grn_2' }],
        ['t1', 'gate.run', { workspace: '.', gate_run_id: 'grn_1', run_id: 'run_1' }],
        ['t1', 'run.finished', { workspace: '.', run_id: 'run_1' }],
        ['t2', 'gate.run', { workspace: '.', gate_run_id: 'grn_1' }],
      ];
      for (const [tenantId, kind, subject] of items)
        await store.evidence.append(tenantId, (head) => [entry(tenantId, (head?.seq ?? 0) + 1, head?.hash ?? 'genesis', kind, subject)], []);
      const ofFirst = await store.evidence.ofGateRun('t1', 'grn_1');
      expect(ofFirst.map((e) => [e.seq, e.kind])).to.deep.equal([
        [1, 'gate.result'],
        [4, 'gate.run'],
      ]);
      expect(ofFirst[1]).to.deep.equal(entry('t1', 4, 'h3', 'gate.run', { workspace: '.', gate_run_id: 'grn_1', run_id: 'run_1' }));
      expect((await store.evidence.ofGateRun('t1', 'grn_2')).map((e) => e.seq)).to.deep.equal([3]);
      expect((await store.evidence.ofGateRun('t2', 'grn_1')).map((e) => [e.seq, e.kind])).to.deep.equal([[1, 'gate.run']]);
      expect(await store.evidence.ofGateRun('t1', 'grn_3')).to.deep.equal([]);
      expect(await store.evidence.ofGateRun('t3', 'grn_1')).to.deep.equal([]);
    });

    it('keeps gate runs per tenant with their results; the latest result of each gate of a workspace; conditional updates', async () => {
      const gateRun = gateRunFixture;
      const result = gateResultFixture;
      const first = gateRun('t1', 'app');
      const second = gateRun('t1', 'app');
      const other = gateRun('t1', 'lib');
      for (const r of [first, second, other, gateRun('t2', 'app')]) await store.gateRuns.insert(r);
      const page = await store.gateRuns.list('t1', { workspace: 'app', limit: 1 });
      expect(page.items.map((r) => r.id)).to.deep.equal([second.id]);
      expect((await store.gateRuns.list('t1', { workspace: 'app', limit: 5, cursor: page.next_cursor! })).items.map((r) => r.id)).to.deep.equal([first.id]);
      expect((await store.gateRuns.list('t1', { limit: 5 })).items).to.have.length(3);
      expect(await store.gateRuns.get('t2', first.id)).to.equal(null);
      await store.gateRuns.putResult('t1', first.id, result('test', 'app', '2026-01-01T00:00:01.000Z', 'failure'));
      await store.gateRuns.putResult('t1', first.id, result('test', 'app', '2026-01-01T00:00:09.000Z', 'success')); // kept once: the first stays
      await store.gateRuns.putResult('t1', first.id, result('lint', 'app', '2026-01-01T00:00:02.000Z', 'success'));
      await store.gateRuns.putResult('t1', second.id, result('test', 'app', '2026-01-01T00:00:05.000Z', 'success'));
      await store.gateRuns.putResult('t1', other.id, result('test', 'lib', '2026-01-01T00:00:07.000Z', 'failure'));
      // by gate id, not in the order they were kept
      expect((await store.gateRuns.results('t1', first.id)).map((r) => [r.gate_id, r.conclusion])).to.deep.equal([
        ['lint', 'success'],
        ['test', 'failure'],
      ]);
      // results of gate runs under way are no gate's latest yet: no seal holds them
      expect(await store.gateRuns.latestResults('t1', 'app')).to.deep.equal([]);
      expect((await store.gateRuns.runningOf('t1', 'app')).map((r) => r.id)).to.deep.equal([second.id, first.id]);
      expect(await store.gateRuns.runningOf('t2', 'lib')).to.deep.equal([]);
      expect(await store.gateRuns.latestResults('t2', 'app')).to.deep.equal([]);
      // two results of a gate that finished at once: the one of the greater gate run id, whichever was kept first
      for (const id of ['grn_tie_a', 'grn_tie_b', 'grn_tie_0']) await store.gateRuns.insert({ ...gateRun('t1', 'tie'), id, status: 'succeeded' });
      await store.gateRuns.putResult('t1', 'grn_tie_a', result('test', 'tie', '2026-01-01T00:00:03.000Z', 'failure'));
      await store.gateRuns.putResult('t1', 'grn_tie_b', result('test', 'tie', '2026-01-01T00:00:03.000Z', 'success'));
      await store.gateRuns.putResult('t1', 'grn_tie_0', result('test', 'tie', '2026-01-01T00:00:03.000Z', 'failure'));
      expect((await store.gateRuns.latestResults('t1', 'tie')).map((l) => [l.gate_run_id, l.result.conclusion])).to.deep.equal([['grn_tie_b', 'success']]);
      expect(await store.gateRuns.update('t1', first.id, { status: 'succeeded' }, ['running'])).to.deep.include({
        status: 'succeeded',
        gates: ['test', 'lint'],
      });
      expect(await store.gateRuns.update('t1', first.id, { status: 'failed' }, ['running'])).to.equal(null);
      expect(
        (await store.gateRuns.runningOf('t1', 'app')).map((r) => r.id),
        'a sealed run is not running',
      ).to.deep.equal([second.id]);
      // the reconciler's view: running ones of every tenant, made before a time
      const running = await store.gateRuns.listRunning(new Date(Date.now() + 1000).toISOString(), 10);
      expect(running.map((r) => r.id).sort())
        .to.include(second.id)
        .and.include(other.id)
        .and.not.include(first.id);
      expect(await store.gateRuns.listRunning('2000-01-01T00:00:00.000Z', 10)).to.deep.equal([]);
      // a page at a time, oldest first, ties by id: runs still going hide no other behind them
      const cutoff = new Date(Date.now() + 1000).toISOString();
      const all = (await store.gateRuns.listRunning(cutoff, 100)).map((r) => r.id);
      const pages: string[] = [];
      for (let after: { created_at: string; id: string } | undefined, i = 0; i < 10; i++) {
        const page = await store.gateRuns.listRunning(cutoff, 1, after);
        if (!page.length) break;
        pages.push(page[0]!.id);
        after = page[0]!;
      }
      expect(pages).to.deep.equal(all);
      expect(pages).to.have.length(3);
    });

    it('takes each gate’s latest result only from a sealed gate run: not from one canceled after its gate reported, nor one still running', async () => {
      const at = (s: number) => `2026-01-01T00:00:0${s}.000Z`;
      const gateRun = (id: string) => ({ ...gateRunFixture('t1', 'sealed-only'), id, gates: ['test', 'lint', 'build'] });
      const result = (gate: string, finishedAt: string, conclusion: 'success' | 'failure') => gateResultFixture(gate, 'sealed-only', finishedAt, conclusion);
      const [succeeded, failed, canceled, running] = ['grn_sealed_1', 'grn_sealed_2', 'grn_sealed_3', 'grn_sealed_4'];
      for (const id of [succeeded, failed, canceled, running]) await store.gateRuns.insert(gateRun(id));
      // each result kept as its gate ends, while its gate run runs
      await store.gateRuns.putResult('t1', succeeded, result('test', at(1), 'success'));
      await store.gateRuns.putResult('t1', succeeded, result('lint', at(1), 'failure'));
      await store.gateRuns.putResult('t1', failed, result('lint', at(2), 'success'));
      await store.gateRuns.putResult('t1', canceled, result('test', at(3), 'failure'));
      await store.gateRuns.putResult('t1', canceled, result('build', at(3), 'success'));
      await store.gateRuns.putResult('t1', running, result('lint', at(4), 'failure'));
      await store.gateRuns.update('t1', succeeded, { status: 'succeeded' }, ['running']);
      await store.gateRuns.update('t1', failed, { status: 'failed' }, ['running']);
      await store.gateRuns.update('t1', canceled, { status: 'canceled' }, ['running']);
      expect((await store.gateRuns.latestResults('t1', 'sealed-only')).map((l) => [l.result.gate_id, l.result.conclusion, l.gate_run_id])).to.deep.equal([
        ['lint', 'success', failed],
        ['test', 'success', succeeded],
      ]);
      // a gate run's results count once it is sealed
      await store.gateRuns.update('t1', running, { status: 'failed' }, ['running']);
      expect((await store.gateRuns.latestResults('t1', 'sealed-only')).map((l) => [l.result.gate_id, l.result.conclusion, l.gate_run_id])).to.deep.equal([
        ['lint', 'failure', running],
        ['test', 'success', succeeded],
      ]);
      // a gate its sealed gate run did not run (the workspace's HEAD moved, or the gate left the set): the stand-in
      // result the seal names is no gate's latest (readiness read it as a definition changed)
      const obsolete = 'grn_sealed_5';
      await store.gateRuns.insert(gateRun(obsolete));
      await store.gateRuns.putResult('t1', obsolete, { ...result('test', at(5), 'success'), conclusion: 'cancelled', input_digest: '', definition_digest: '' });
      await store.gateRuns.putResult('t1', obsolete, { ...result('build', at(5), 'success'), conclusion: 'skipped', input_digest: '', definition_digest: '' });
      await store.gateRuns.update('t1', obsolete, { status: 'succeeded' }, ['running']);
      expect((await store.gateRuns.latestResults('t1', 'sealed-only')).map((l) => [l.result.gate_id, l.result.conclusion, l.gate_run_id])).to.deep.equal([
        ['lint', 'failure', running],
        ['test', 'success', succeeded],
      ]);
    });
  });
}
