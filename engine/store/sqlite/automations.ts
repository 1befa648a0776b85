// Automations: a JSON document per row, with the columns the list filters on beside it.
import type { Statement } from 'better-sqlite3';
import { groupCommit, type Db } from './db.js';
import type { Automation } from '../../platform/index.js';
import { decodeCursor, toPage, type AutomationQuery, type AutomationRepo, type JsonDoc, type Page } from '../port.js';

export function automationRepo(db: Db): AutomationRepo {
  const insert = db.prepare('INSERT INTO automations (id, tenant_id, status, doc) VALUES (?, ?, ?, ?)');
  const get = db.prepare<[string, string], { doc: string }>('SELECT doc FROM automations WHERE tenant_id = ? AND id = ?');
  const write = db.prepare('UPDATE automations SET status = ?, doc = ? WHERE tenant_id = ? AND id = ?');
  // a trigger that is not an object (none is stored now; one stored before may be) is no trigger: json_extract would fail the query
  // (CASE, not AND: SQLite may evaluate either side of an AND first)
  const hasTrigger = "EXISTS (SELECT 1 FROM json_each(doc, '$.triggers') WHERE CASE WHEN type = 'object' THEN json_extract(value, '$.type') END = ?)";
  const withTrigger = db.prepare<[string], { doc: string }>(`SELECT doc FROM automations WHERE status = 'enabled' AND ${hasTrigger} ORDER BY id`);
  const withTriggerOfTenant = db.prepare<[string, string], { doc: string }>(
    `SELECT doc FROM automations WHERE tenant_id = ? AND status = 'enabled' AND ${hasTrigger} ORDER BY id`,
  );
  const live = db.prepare<[string], { live: number }>('SELECT live FROM automation_counts WHERE tenant_id = ?');
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
    const after = decodeCursor(q.cursor);
    const statuses = q.statuses ?? [];
    const params: unknown[] = [tenantId, ...statuses, ...(after ? [after] : []), q.limit + 1];
    return toPage(listStatement(statuses.length, Boolean(after)).all(...params), q.limit);
  };

  // writes go in the store's group commit: the writes of one turn of the event loop share a commit
  const commit = groupCommit(db);
  const update = (tenantId: string, id: string, changes: Partial<Automation>, ifStatusIn: string[]) => {
    const current = read(get.get(tenantId, id));
    if (!current || !ifStatusIn.includes(current.status)) return null;
    const next: Automation = { ...current, ...changes, id: current.id, tenant_id: current.tenant_id, created_at: current.created_at };
    write.run(next.status, JSON.stringify(next), tenantId, id);
    return next;
  };

  return {
    async insert(a) {
      await commit(() => insert.run(a.id, a.tenant_id, a.status, JSON.stringify(a)));
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
    async update(tenantId, id, changes, ifStatusIn) {
      return commit(() => update(tenantId, id, changes, ifStatusIn));
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
