// Automations: a JSON document per row, with the columns the list filters on beside it.
import type { Statement } from 'better-sqlite3';
import { groupCommit, type Db } from './db.js';
import { keyClaimer } from './idempotency-keys.js';
import { withMembers } from '../members.js';
import type { Automation } from '../../platform/index.js';
import {
  decodeCursor,
  toPage,
  type AutomationMembers,
  type AutomationQuery,
  type AutomationRepo,
  type CappedInsert,
  type IdempotencyRecord,
  type JsonDoc,
  type Page,
} from '../port.js';

export function automationRepo(db: Db): AutomationRepo {
  const insert = db.prepare('INSERT INTO automations (id, tenant_id, status, doc) VALUES (?, ?, ?, ?)');
  const get = db.prepare<[string, string], { doc: string }>('SELECT doc FROM automations WHERE tenant_id = ? AND id = ?');
  const write = db.prepare('UPDATE automations SET status = ?, doc = ? WHERE tenant_id = ? AND id = ?');
  // the enabled automations by trigger type (automation_triggers), kept beside each automation's row
  const addTrigger = db.prepare('INSERT OR IGNORE INTO automation_triggers (type, tenant_id, id) VALUES (?, ?, ?)');
  const dropTrigger = db.prepare('DELETE FROM automation_triggers WHERE type = ? AND tenant_id = ? AND id = ?');
  const withTrigger = db.prepare<[string], { doc: string }>(
    "SELECT a.doc FROM automation_triggers AS t JOIN automations AS a ON a.id = t.id WHERE t.type = ? AND a.status = 'enabled' ORDER BY t.id",
  );
  const withTriggerOfTenant = db.prepare<[string, string], { doc: string }>(
    "SELECT a.doc FROM automation_triggers AS t JOIN automations AS a ON a.id = t.id WHERE t.tenant_id = ? AND t.type = ? AND a.status = 'enabled' ORDER BY t.id",
  );
  /** The types of an automation's triggers while it is enabled (a trigger that is not an object, stored before they were checked, is none). */
  const triggerTypes = (a: Automation): Set<string> =>
    new Set(
      a.status === 'enabled'
        ? (a.triggers as unknown[]).flatMap((t) =>
            t && typeof t === 'object' && typeof (t as { type?: unknown }).type === 'string' ? [(t as { type: string }).type] : [],
          )
        : [],
    );
  const placeTriggers = (before: Automation | null, after: Automation) => {
    const was = before ? triggerTypes(before) : new Set<string>();
    const now = triggerTypes(after);
    for (const type of was) if (!now.has(type)) dropTrigger.run(type, after.tenant_id, after.id);
    for (const type of now) if (!was.has(type)) addTrigger.run(type, after.tenant_id, after.id);
  };
  const live = db.prepare<[string], { live: number }>('SELECT live FROM automation_counts WHERE tenant_id = ?');
  // a create's Idempotency-Key, taken in the insert's own transaction
  const claimKey = keyClaimer(db, 'automations');
  const releaseKey = db.prepare('DELETE FROM idempotency_keys WHERE tenant_id = ? AND key_digest = ? AND run_id = ?');
  const read = (row: { doc: string } | undefined): Automation | null => (row ? (JSON.parse(row.doc) as Automation) : null);
  // one prepared statement per shape of list query (how many statuses, whether a cursor), made once
  const listStatements = new Map<string, Statement<unknown[], JsonDoc>>();
  const listStatement = (statuses: number, hasCursor: boolean) => {
    const shape = `${statuses}:${hasCursor}`;
    let stmt = listStatements.get(shape);
    if (!stmt) {
      const where = ['tenant_id = ?', statuses ? `status IN (${Array(statuses).fill('?').join(', ')})` : "status <> 'archived'"];
      if (hasCursor) where.push('id < ?');
      stmt = db.prepare<unknown[], JsonDoc>(`SELECT id, doc AS json FROM automations WHERE ${where.join(' AND ')} ORDER BY id DESC LIMIT ?`);
      listStatements.set(shape, stmt);
    }
    return stmt;
  };

  const listJson = (tenantId: string, q: AutomationQuery): Page<JsonDoc> => {
    const after = decodeCursor(q.cursor, 'automations');
    const statuses = q.statuses ?? [];
    const params: unknown[] = [tenantId, ...statuses, ...(after ? [after] : []), q.limit + 1];
    return toPage(listStatement(statuses.length, Boolean(after)).all(...params), q.limit, 'automations');
  };

  // writes go in the store's group commit: the writes of one turn of the event loop share a commit
  const commit = groupCommit(db);
  const update = (tenantId: string, id: string, changes: Partial<Automation>, ifStatusIn: string[], members?: AutomationMembers) => {
    const current = read(get.get(tenantId, id));
    if (!current || !ifStatusIn.includes(current.status)) return null;
    const next: Automation = withMembers({ ...current, ...changes, id: current.id, tenant_id: current.tenant_id, created_at: current.created_at }, members);
    write.run(next.status, JSON.stringify(next), tenantId, id);
    placeTriggers(current, next);
    return next;
  };

  // read inside the write's IMMEDIATE transaction: no other write, of this process or another, comes between
  const capped = (a: Automation, cap?: { maxLive: number }): CappedInsert => {
    if (cap && a.status !== 'archived' && (live.get(a.tenant_id)?.live ?? 0) >= cap.maxLive) return 'over-cap';
    insert.run(a.id, a.tenant_id, a.status, JSON.stringify(a));
    placeTriggers(null, a);
    return 'inserted';
  };

  return {
    async insert(a, cap) {
      return commit(() => capped(a, cap));
    },
    async insertWithKey(a, key, cap) {
      return commit((): CappedInsert | IdempotencyRecord => {
        // the key first: a retry answers the automation its key made even when the tenant is at its cap now
        const held = claimKey(key.record, key.since, key.pendingSince);
        if (held) return held;
        const done = capped(a, cap);
        // refused: the key taken above goes with it (a record it replaced held the key no longer)
        if (done === 'over-cap') releaseKey.run(a.tenant_id, key.record.key_digest, a.id);
        return done;
      });
    },
    async get(tenantId, id) {
      return read(get.get(tenantId, id));
    },
    async list(tenantId, q) {
      const page = listJson(tenantId, q);
      return { items: page.items.map((d) => JSON.parse(d.json) as Automation), next_cursor: page.next_cursor };
    },
    async listJson(tenantId, q) {
      return listJson(tenantId, q);
    },
    async update(tenantId, id, changes, ifStatusIn, members) {
      return commit(() => update(tenantId, id, changes, ifStatusIn, members));
    },
    async countLive(tenantId) {
      return live.get(tenantId)?.live ?? 0;
    },
    async listEnabledWithTrigger(type, tenantId) {
      const rows = tenantId === undefined ? withTrigger.all(type) : withTriggerOfTenant.all(tenantId, type);
      return rows.map((r) => JSON.parse(r.doc) as Automation);
    },
  };
}
