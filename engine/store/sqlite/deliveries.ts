// Webhook deliveries, inserted in group commits; one row per provider delivery id.
import type { Statement } from 'better-sqlite3';
import type { WebhookDelivery } from '../../platform/index.js';
import { decodeCursor, toPage, type DeliveryRepo, type DeliverySummary } from '../port.js';
import { groupCommit, TOP, type Db } from './db.js';

export function deliveryRepo(db: Db): DeliveryRepo {
  const insert = db.prepare(
    'INSERT INTO deliveries (id, tenant_id, kind, status, provider_delivery_id, received_at, body_sha256, signed_sha256, doc) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING',
  );
  const byProviderId = db.prepare<[string, string, string], { doc: string }>(
    'SELECT doc FROM deliveries WHERE tenant_id = ? AND kind = ? AND provider_delivery_id = ?',
  );
  const get = db.prepare<[string, string], { doc: string }>('SELECT doc FROM deliveries WHERE tenant_id = ? AND id = ?');
  const write = db.prepare('UPDATE deliveries SET status = ?, doc = ? WHERE tenant_id = ? AND id = ?');
  // through deliveries_by_status: few are in a stale status at any time, and their sort is cheap
  const stale = db.prepare<[string, string, string, string, number], { doc: string }>(
    'SELECT doc FROM deliveries WHERE status = ? AND received_at < ? AND (received_at, id) > (?, ?) ORDER BY received_at, id LIMIT ?',
  );
  const pruneRejected = db.prepare(
    `DELETE FROM deliveries WHERE id IN (SELECT id FROM deliveries INDEXED BY deliveries_rejected_at WHERE status = 'rejected' AND received_at < ? ORDER BY received_at LIMIT ?)`,
  );
  // through the partial index of those still kept (by status, the planner would read every processed delivery)
  const prunePayloads = db.prepare(
    `UPDATE deliveries SET payload_pruned = 1, doc = json_set(doc, '$.body', NULL, '$.event_payload', NULL, '$.payload_pruned_at', ?)
     WHERE id IN (SELECT id FROM deliveries INDEXED BY deliveries_payload_kept WHERE payload_pruned = 0 AND status IN ('processed', 'failed') AND received_at < ? ORDER BY received_at LIMIT ?)`,
  );
  // the partial index's condition word for word (migrations.ts), so that SQLite uses it
  const byBody = db.prepare<[string, string, string], { doc: string }>(
    "SELECT doc FROM deliveries WHERE status <> 'rejected' AND tenant_id = ? AND kind = ? AND body_sha256 = ? LIMIT 1",
  );
  // the partial index's condition word for word as well
  const bySigned = db.prepare<[string, string, string], { doc: string }>(
    "SELECT doc FROM deliveries WHERE signed_sha256 IS NOT NULL AND status <> 'rejected' AND tenant_id = ? AND kind = ? AND signed_sha256 = ? LIMIT 1",
  );
  const read = (row: { doc: string } | undefined): WebhookDelivery | null => (row ? (JSON.parse(row.doc) as WebhookDelivery) : null);
  const listStatements = new Map<string, Statement<unknown[], { doc: string }>>();
  const listStatement = (kind: boolean, status: boolean) => {
    const shape = `${kind}:${status}`;
    let stmt = listStatements.get(shape);
    if (!stmt) {
      const where = ['tenant_id = ?', ...(kind ? ['kind = ?'] : []), ...(status ? ['status = ?'] : []), 'id < ?'];
      // summaries: SQLite drops the body and the event (up to 1 MB each), in C; a page of 100 large deliveries
      // read whole was 188 MB to parse, and to answer, on the event loop
      stmt = db.prepare<unknown[], { doc: string }>(
        `SELECT json_remove(doc, '$.body', '$.event_payload') AS doc FROM deliveries WHERE ${where.join(' AND ')} ORDER BY id DESC LIMIT ?`,
      );
      listStatements.set(shape, stmt);
    }
    return stmt;
  };
  /** A change computed from the record as the write finds it (inside the commit's transaction, so atomic). */
  const update = (tenantId: string, id: string, changes: (current: WebhookDelivery) => Partial<WebhookDelivery>, ifStatusIn: string[], ifKept = false) => {
    const current = read(get.get(tenantId, id));
    if (!current || !ifStatusIn.includes(current.status) || (ifKept && current.payload_pruned_at)) return null;
    const next: WebhookDelivery = { ...current, ...changes(current), id: current.id, tenant_id: current.tenant_id };
    write.run(next.status, JSON.stringify(next), tenantId, id);
    return next;
  };
  const insertOne = (d: WebhookDelivery): WebhookDelivery | null => {
    const inserted =
      insert.run(d.id, d.tenant_id, d.kind, d.status, d.provider_delivery_id, d.received_at, d.body_sha256, d.signed_sha256 ?? null, JSON.stringify(d))
        .changes === 1;
    if (inserted || d.provider_delivery_id === null) return null;
    return read(byProviderId.get(d.tenant_id, d.kind, d.provider_delivery_id));
  };
  // deliveries written in the same turn of the event loop (arrivals, their progress) share one transaction
  const commit = groupCommit(db);
  return {
    insert(d) {
      return commit(() => insertOne(d));
    },
    async get(tenantId, id) {
      return read(get.get(tenantId, id));
    },
    async list(tenantId, q) {
      const params: unknown[] = [
        tenantId,
        ...(q.kind ? [q.kind] : []),
        ...(q.status ? [q.status] : []),
        decodeCursor(q.cursor, 'webhook-deliveries') ?? TOP,
        q.limit + 1,
      ];
      const rows = listStatement(Boolean(q.kind), Boolean(q.status)).all(...params);
      return toPage(
        rows.map((r) => JSON.parse(r.doc) as DeliverySummary),
        q.limit,
        'webhook-deliveries',
      );
    },
    async update(tenantId, id, changes, ifStatusIn) {
      return commit(() => update(tenantId, id, () => changes, ifStatusIn));
    },
    async addAttempt(tenantId, id, ifStatusIn) {
      return commit(() => update(tenantId, id, (d) => ({ attempts: d.attempts + 1 }), ifStatusIn, true));
    },
    async releaseAttempt(tenantId, id, attempt) {
      return commit(() => {
        const current = read(get.get(tenantId, id));
        if (current?.attempts !== attempt) return false;
        write.run(current.status, JSON.stringify({ ...current, attempts: attempt - 1 }), tenantId, id);
        return true;
      });
    },
    async addRuns(tenantId, id, runs, changes, ifStatusIn) {
      return commit(() => update(tenantId, id, (d) => ({ ...changes, runs: [...d.runs, ...runs] }), ifStatusIn));
    },
    async listStale(status, receivedBefore, limit, after) {
      return stale.all(status, receivedBefore, after?.received_at ?? '', after?.id ?? '', limit).map((r) => read(r)!);
    },
    async pruneRejected(before, limit) {
      return commit(() => pruneRejected.run(before, limit).changes);
    },
    async prunePayloads(before, prunedAt, limit) {
      return commit(() => prunePayloads.run(prunedAt, before, limit).changes);
    },
    async findByBody(tenantId, kind, bodySha256) {
      return read(byBody.get(tenantId, kind, bodySha256));
    },
    async findBySigned(tenantId, kind, signedSha256) {
      return read(bySigned.get(tenantId, kind, signedSha256));
    },
  };
}
