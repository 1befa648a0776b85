// Outbound notification endpoints (the signing secret sealed inside the document) and their deliveries.
import type { NotificationDelivery, NotificationEndpoint } from '../../platform/index.js';
import { decodeCursor, toPage, type CappedInsert, type NotificationDeliveryRepo, type NotificationEndpointRepo } from '../port.js';
import { groupCommit, TOP, type Db } from './db.js';

export function notificationEndpointRepo(db: Db): NotificationEndpointRepo {
  const insert = db.prepare('INSERT INTO notification_endpoints (id, tenant_id, doc) VALUES (?, ?, ?)');
  const one = db.prepare<[string, string], { doc: string }>('SELECT doc FROM notification_endpoints WHERE tenant_id = ? AND id = ?');
  const byTenant = db.prepare<[string], { doc: string }>('SELECT doc FROM notification_endpoints WHERE tenant_id = ? ORDER BY id');
  const held = db.prepare<[string], { n: number }>('SELECT COUNT(*) AS n FROM notification_endpoints WHERE tenant_id = ?');
  const write = db.prepare('UPDATE notification_endpoints SET doc = ? WHERE tenant_id = ? AND id = ?');
  const remove = db.prepare('DELETE FROM notification_endpoints WHERE tenant_id = ? AND id = ?');
  const removeDeliveries = db.prepare('DELETE FROM notification_deliveries WHERE tenant_id = ? AND endpoint_id = ?');
  const parse = (r: { doc: string } | undefined) => (r ? (JSON.parse(r.doc) as NotificationEndpoint) : null);
  const commit = groupCommit(db);
  const change = (tenantId: string, id: string, apply: (e: NotificationEndpoint) => Partial<NotificationEndpoint>) => {
    const current = parse(one.get(tenantId, id));
    if (!current) return null;
    const next = { ...current, ...apply(current) };
    write.run(JSON.stringify(next), tenantId, id);
    return next;
  };
  const disable = (tenantId: string, id: string, reason: string, at: string) => {
    const current = parse(one.get(tenantId, id));
    if (!current || current.status !== 'enabled') return null;
    const next: NotificationEndpoint = { ...current, status: 'disabled', disabled_reason: reason, updated_at: at };
    write.run(JSON.stringify(next), tenantId, id);
    return next;
  };
  return {
    async insert(e, cap) {
      // read inside the write's IMMEDIATE transaction: no other write, of this process or another, comes between
      return commit((): CappedInsert => {
        if (cap && (held.get(e.tenant_id)?.n ?? 0) >= cap.maxHeld) return 'over-cap';
        insert.run(e.id, e.tenant_id, JSON.stringify(e));
        return 'inserted';
      });
    },
    async get(tenantId, id) {
      return parse(one.get(tenantId, id));
    },
    async list(tenantId) {
      return byTenant.all(tenantId).map((r) => parse(r)!);
    },
    async update(tenantId, id, changes) {
      return commit(() => change(tenantId, id, () => changes));
    },
    async addFailure(tenantId, id, at) {
      return commit(() => change(tenantId, id, (e) => ({ consecutive_failures: e.consecutive_failures + 1, updated_at: at })));
    },
    async resetFailures(tenantId, id) {
      await commit(() => {
        const current = parse(one.get(tenantId, id));
        if (current?.consecutive_failures) write.run(JSON.stringify({ ...current, consecutive_failures: 0 }), tenantId, id);
      });
    },
    async rotateSecret(tenantId, id, expected, changes) {
      return commit(() => {
        const current = parse(one.get(tenantId, id));
        if (!current || current.sealed_secret.ct !== expected.ct || current.sealed_secret.iv !== expected.iv) return null;
        const next: NotificationEndpoint = { ...current, ...changes };
        write.run(JSON.stringify(next), tenantId, id);
        return next;
      });
    },
    async disable(tenantId, id, reason, at) {
      return commit(() => disable(tenantId, id, reason, at));
    },
    async delete(tenantId, id) {
      // its deliveries in the same transaction: none is left behind with its event's payload
      return commit(() => {
        if (remove.run(tenantId, id).changes !== 1) return false;
        removeDeliveries.run(tenantId, id);
        return true;
      });
    },
  };
}

export function notificationDeliveryRepo(db: Db): NotificationDeliveryRepo {
  const insert = db.prepare('INSERT INTO notification_deliveries (id, tenant_id, endpoint_id, doc) VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING');
  const one = db.prepare<[string, string], { doc: string }>('SELECT doc FROM notification_deliveries WHERE tenant_id = ? AND id = ?');
  const page = db.prepare<[string, string, string, number], { doc: string }>(
    'SELECT doc FROM notification_deliveries WHERE tenant_id = ? AND endpoint_id = ? AND id < ? ORDER BY id DESC LIMIT ?',
  );
  const write = db.prepare('UPDATE notification_deliveries SET doc = ? WHERE tenant_id = ? AND id = ?');
  // the index's expressions word for word (migrations.ts), so that SQLite uses it
  const stale = db.prepare<[string, string, string, number], { doc: string }>(
    `SELECT doc FROM notification_deliveries WHERE json_extract(doc, '$.status') = 'pending' AND json_extract(doc, '$.updated_at') < ?
     AND (json_extract(doc, '$.updated_at'), id) > (?, ?) ORDER BY json_extract(doc, '$.updated_at'), id LIMIT ?`,
  );
  // the index's expressions word for word as well; ended: every status but pending
  const prune = db.prepare(
    `DELETE FROM notification_deliveries WHERE id IN (SELECT id FROM notification_deliveries
     WHERE json_extract(doc, '$.status') IN ('succeeded', 'failed') AND json_extract(doc, '$.updated_at') < ? LIMIT ?)`,
  );
  const removeOne = db.prepare('DELETE FROM notification_deliveries WHERE tenant_id = ? AND id = ?');
  const parse = (r: { doc: string } | undefined) => (r ? (JSON.parse(r.doc) as NotificationDelivery) : null);
  const commit = groupCommit(db);
  const update = (
    tenantId: string,
    id: string,
    changes: Partial<NotificationDelivery>,
    when?: { replays: number; status: NotificationDelivery['status'][] },
  ) => {
    const current = parse(one.get(tenantId, id));
    if (!current || (when && (current.replays !== when.replays || !when.status.includes(current.status)))) return null;
    const next = { ...current, ...changes };
    write.run(JSON.stringify(next), tenantId, id);
    return next;
  };
  return {
    async insert(d) {
      await commit(() => insert.run(d.id, d.tenant_id, d.endpoint_id, JSON.stringify(d)));
    },
    async get(tenantId, id) {
      return parse(one.get(tenantId, id));
    },
    async list(tenantId, endpointId, q) {
      const rows = page.all(tenantId, endpointId, decodeCursor(q.cursor, 'notification-deliveries') ?? TOP, q.limit + 1).map((r) => parse(r)!);
      return toPage(rows, q.limit, 'notification-deliveries');
    },
    async update(tenantId, id, changes, when) {
      return commit(() => update(tenantId, id, changes, when));
    },
    async listStalePending(updatedBefore, limit, after) {
      return stale.all(updatedBefore, after?.updated_at ?? '', after?.id ?? '', limit).map((r) => parse(r)!);
    },
    async prune(updatedBefore, limit) {
      return commit(() => prune.run(updatedBefore, limit).changes);
    },
    async delete(tenantId, id) {
      return commit(() => removeOne.run(tenantId, id).changes === 1);
    },
  };
}
