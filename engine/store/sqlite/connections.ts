// A tenant's connections: one row each, the sealed credential inside the document.
import { groupCommit, type Db } from './db.js';
import type { ConnectionRecord } from '../../platform/index.js';
import { decodeCursor, toPage, type ConnectionChanges, type ConnectionRepo, type ConnectionState } from '../port.js';

const isUniqueViolation = (err: unknown) => (err as { code?: string }).code === 'SQLITE_CONSTRAINT_UNIQUE';

export function connectionRepo(db: Db): ConnectionRepo {
  const insert = db.prepare('INSERT INTO connections (id, tenant_id, provider, name, doc) VALUES (?, ?, ?, ?, ?)');
  const one = db.prepare<[string, string], { doc: string }>('SELECT doc FROM connections WHERE tenant_id = ? AND id = ?');
  const byName = db.prepare<[string, string], { doc: string }>('SELECT doc FROM connections WHERE tenant_id = ? AND name = ?');
  const byTenant = db.prepare<[string, string, number], { doc: string }>('SELECT doc FROM connections WHERE tenant_id = ? AND id > ? ORDER BY id LIMIT ?');
  const byProvider = db.prepare<[string, string, string, number], { doc: string }>(
    'SELECT doc FROM connections WHERE tenant_id = ? AND provider = ? AND id > ? ORDER BY id LIMIT ?',
  );
  const held = db.prepare<[string], { n: number }>('SELECT COUNT(*) AS n FROM connections WHERE tenant_id = ?');
  const write = db.prepare('UPDATE connections SET name = ?, doc = ? WHERE tenant_id = ? AND id = ?');
  const remove = db.prepare('DELETE FROM connections WHERE tenant_id = ? AND id = ?');
  const commit = groupCommit(db);
  const update = (tenantId: string, id: string, changes: ConnectionChanges, when?: ConnectionState): ConnectionRecord | null => {
    const row = one.get(tenantId, id);
    if (!row) return null;
    const current = JSON.parse(row.doc) as ConnectionRecord;
    if (
      when &&
      (current.base_url !== when.base_url ||
        current.sealed.ct !== when.sealed.ct ||
        current.sealed.iv !== when.sealed.iv ||
        JSON.stringify(current.settings) !== JSON.stringify(when.settings))
    )
      return null;
    const next: ConnectionRecord = { ...current, ...changes };
    write.run(next.name, JSON.stringify(next), tenantId, id);
    return next;
  };
  const parse = (r: { doc: string }) => JSON.parse(r.doc) as ConnectionRecord;
  const rows = (tenantId: string, provider: string | undefined, after: string, limit: number) =>
    (provider ? byProvider.all(tenantId, provider, after, limit) : byTenant.all(tenantId, after, limit)).map(parse);
  return {
    async insert(c, cap) {
      // a failed statement undoes only itself: the rest of the group commit's transaction stands
      return commit(() => {
        // read inside the write's IMMEDIATE transaction: no other write, of this process or another, comes between
        if (cap && (held.get(c.tenant_id)?.n ?? 0) >= cap.maxHeld) return 'over-cap' as const;
        try {
          insert.run(c.id, c.tenant_id, c.provider, c.name, JSON.stringify(c));
          return true;
        } catch (err) {
          if (isUniqueViolation(err)) return false;
          throw err;
        }
      });
    },
    async get(tenantId, id) {
      const row = one.get(tenantId, id);
      return row ? parse(row) : null;
    },
    async getByName(tenantId, name) {
      const row = byName.get(tenantId, name);
      return row ? parse(row) : null;
    },
    async list(tenantId, provider, limit = -1) {
      return rows(tenantId, provider, '', limit);
    },
    async page(tenantId, q) {
      return toPage(rows(tenantId, q.provider, decodeCursor(q.cursor, 'connections') ?? '', q.limit + 1), q.limit, 'connections');
    },
    async update(tenantId, id, changes, when) {
      return commit(() => {
        try {
          return update(tenantId, id, changes, when);
        } catch (err) {
          if (isUniqueViolation(err)) return 'name-taken' as const;
          throw err;
        }
      });
    },
    async delete(tenantId, id) {
      return commit(() => remove.run(tenantId, id).changes === 1);
    },
  };
}
