// SQLite adapter (better-sqlite3, WAL): the embedded default. Documents are JSON columns; the
// columns the API filters on are indexed beside them. Writes that depend on a read run in
// IMMEDIATE transactions, so they are conditional even with several processes on one file.
import fs from 'node:fs';
import path from 'node:path';
import Database from 'better-sqlite3';
import type { ApiKeyRecord, Automation, Run, WebhookDelivery, WebhookSecretRecord } from '../../model.js';
import {
  decodeCursor,
  toPage,
  type ApiKeyRepo,
  type AutomationRepo,
  type DeliveryRepo,
  type RunRepo,
  type RunStats,
  type Store,
  type WebhookSecretRepo,
} from '../port.js';
import { MIGRATIONS } from './migrations.js';

/** Larger than any id: a page without a cursor starts below it. */
const TOP = '\uffff';

export function openSqliteStore(file: string): Store {
  if (file !== ':memory:') fs.mkdirSync(path.dirname(file), { recursive: true });
  const db = new Database(file);
  db.pragma('journal_mode = WAL');
  db.pragma('synchronous = NORMAL');
  db.pragma('busy_timeout = 5000');
  db.pragma('foreign_keys = ON');
  migrate(db);
  return {
    kind: 'sqlite',
    automations: automationRepo(db),
    apiKeys: apiKeyRepo(db),
    runs: runRepo(db),
    webhookSecrets: webhookSecretRepo(db),
    deliveries: deliveryRepo(db),
    async ping() {
      db.prepare('SELECT 1').get();
    },
    async close() {
      if (db.open) db.close();
    },
  };
}

function migrate(db: Database.Database): void {
  const current = db.pragma('user_version', { simple: true }) as number;
  const apply = db.transaction(() => {
    for (let v = current; v < MIGRATIONS.length; v++) {
      db.exec(MIGRATIONS[v]!);
      db.pragma(`user_version = ${v + 1}`);
    }
  });
  apply.immediate();
}

function automationRepo(db: Database.Database): AutomationRepo {
  const insert = db.prepare('INSERT INTO automations (id, tenant_id, status, doc) VALUES (?, ?, ?, ?)');
  const get = db.prepare<[string, string], { doc: string }>('SELECT doc FROM automations WHERE tenant_id = ? AND id = ?');
  const write = db.prepare('UPDATE automations SET status = ?, doc = ? WHERE tenant_id = ? AND id = ?');
  const hasTrigger = "EXISTS (SELECT 1 FROM json_each(doc, '$.triggers') WHERE json_extract(value, '$.type') = ?)";
  const withTrigger = db.prepare<[string], { doc: string }>(`SELECT doc FROM automations WHERE status = 'enabled' AND ${hasTrigger} ORDER BY id`);
  const withTriggerOfTenant = db.prepare<[string, string], { doc: string }>(
    `SELECT doc FROM automations WHERE tenant_id = ? AND status = 'enabled' AND ${hasTrigger} ORDER BY id`,
  );
  const read = (row: { doc: string } | undefined): Automation | null => (row ? (JSON.parse(row.doc) as Automation) : null);
  // one prepared statement per shape of list query (how many statuses, whether a cursor), made once
  const listStatements = new Map<string, Database.Statement<unknown[], { doc: string }>>();
  const listStatement = (statuses: number, hasCursor: boolean) => {
    const shape = `${statuses}:${hasCursor}`;
    let stmt = listStatements.get(shape);
    if (!stmt) {
      const where = ['tenant_id = ?', statuses ? `status IN (${Array(statuses).fill('?').join(', ')})` : "status <> 'archived'"];
      if (hasCursor) where.push('id < ?');
      stmt = db.prepare<unknown[], { doc: string }>(`SELECT doc FROM automations WHERE ${where.join(' AND ')} ORDER BY id DESC LIMIT ?`);
      listStatements.set(shape, stmt);
    }
    return stmt;
  };

  const update = db.transaction((tenantId: string, id: string, changes: Partial<Automation>, ifStatusIn: string[]) => {
    const current = read(get.get(tenantId, id));
    if (!current || !ifStatusIn.includes(current.status)) return null;
    const next: Automation = { ...current, ...changes, id: current.id, tenant_id: current.tenant_id, created_at: current.created_at };
    write.run(next.status, JSON.stringify(next), tenantId, id);
    return next;
  });

  return {
    async insert(a) {
      insert.run(a.id, a.tenant_id, a.status, JSON.stringify(a));
    },
    async get(tenantId, id) {
      return read(get.get(tenantId, id));
    },
    async list(tenantId, q) {
      const after = decodeCursor(q.cursor);
      const statuses = q.statuses ?? [];
      const params: unknown[] = [tenantId, ...statuses, ...(after ? [after] : []), q.limit + 1];
      const rows = listStatement(statuses.length, Boolean(after)).all(...params);
      return toPage(
        rows.map((r) => JSON.parse(r.doc) as Automation),
        q.limit,
      );
    },
    async update(tenantId, id, changes, ifStatusIn) {
      return update.immediate(tenantId, id, changes, ifStatusIn);
    },
    async listEnabledWithTrigger(type, tenantId) {
      const rows = tenantId === undefined ? withTrigger.all(type) : withTriggerOfTenant.all(tenantId, type);
      return rows.map((r) => JSON.parse(r.doc) as Automation);
    },
  };
}

function runRepo(db: Database.Database): RunRepo {
  const insert = db.prepare(
    'INSERT INTO runs (id, tenant_id, kind, status, automation_id, session_id, created_at, finished_at, duration_ms, doc) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)',
  );
  const get = db.prepare<[string, string], { doc: string }>('SELECT doc FROM runs WHERE tenant_id = ? AND id = ?');
  const write = db.prepare('UPDATE runs SET status = ?, finished_at = ?, duration_ms = ?, doc = ? WHERE tenant_id = ? AND id = ?');
  const byAutomation = db.prepare<[string, string, string, number], { doc: string }>(
    'SELECT doc FROM runs WHERE tenant_id = ? AND automation_id = ? AND id < ? ORDER BY id DESC LIMIT ?',
  );
  const bySession = db.prepare<[string, string, string, number], { doc: string }>(
    'SELECT doc FROM runs WHERE tenant_id = ? AND session_id = ? AND id < ? ORDER BY id DESC LIMIT ?',
  );
  const counts = db.prepare<[string, string], { status: string; n: number }>(
    'SELECT status, COUNT(*) AS n FROM runs WHERE tenant_id = ? AND automation_id = ? GROUP BY status',
  );
  const durationsOfAutomation = db.prepare<[string, string, number], { duration_ms: number }>(
    'SELECT duration_ms FROM runs WHERE tenant_id = ? AND automation_id = ? AND duration_ms IS NOT NULL ORDER BY id DESC LIMIT ?',
  );
  const latestOfAutomation = db.prepare<[string, string], { doc: string }>(
    'SELECT doc FROM runs WHERE tenant_id = ? AND automation_id = ? ORDER BY id DESC LIMIT 1',
  );
  const durationsOfKind = db.prepare<[string, string, number], { duration_ms: number }>(
    'SELECT duration_ms FROM runs WHERE tenant_id = ? AND kind = ? AND finished_at IS NOT NULL AND duration_ms IS NOT NULL ORDER BY finished_at DESC LIMIT ?',
  );
  const stale = db.prepare<[string, string, number], { doc: string }>('SELECT doc FROM runs WHERE status = ? AND created_at < ? ORDER BY created_at LIMIT ?');
  const byKindStatus = db.prepare<[], { kind: Run['kind']; status: Run['status']; count: number }>(
    'SELECT kind, status, COUNT(*) AS count FROM runs GROUP BY kind, status',
  );
  const read = (row: { doc: string } | undefined): Run | null => (row ? (JSON.parse(row.doc) as Run) : null);

  const update = db.transaction((tenantId: string, id: string, changes: Partial<Run>, ifStatusIn: string[]) => {
    const current = read(get.get(tenantId, id));
    if (!current || !ifStatusIn.includes(current.status)) return null;
    const next: Run = { ...current, ...changes, id: current.id, tenant_id: current.tenant_id, kind: current.kind, created_at: current.created_at };
    write.run(next.status, next.finished_at, next.duration_ms, JSON.stringify(next), tenantId, id);
    return next;
  });

  return {
    async insert(r) {
      insert.run(r.id, r.tenant_id, r.kind, r.status, r.automation_id, r.session_id, r.created_at, r.finished_at, r.duration_ms, JSON.stringify(r));
    },
    async get(tenantId, id) {
      return read(get.get(tenantId, id));
    },
    async update(tenantId, id, changes, ifStatusIn) {
      return update.immediate(tenantId, id, changes, ifStatusIn);
    },
    async listByAutomation(tenantId, automationId, q) {
      const rows = byAutomation.all(tenantId, automationId, decodeCursor(q.cursor) ?? TOP, q.limit + 1);
      return toPage(
        rows.map((r) => read(r)!),
        q.limit,
      );
    },
    async listBySession(tenantId, sessionId, q) {
      const rows = bySession.all(tenantId, sessionId, decodeCursor(q.cursor) ?? TOP, q.limit + 1);
      return toPage(
        rows.map((r) => read(r)!),
        q.limit,
      );
    },
    async automationStats(tenantId, automationId, recent): Promise<RunStats> {
      const byStatus: RunStats['counts'] = {};
      for (const row of counts.all(tenantId, automationId)) byStatus[row.status as Run['status']] = row.n;
      return {
        counts: byStatus,
        durations_ms: durationsOfAutomation.all(tenantId, automationId, recent).map((r) => r.duration_ms),
        last: read(latestOfAutomation.get(tenantId, automationId)),
      };
    },
    async recentDurations(tenantId, kind, limit) {
      return durationsOfKind.all(tenantId, kind, limit).map((r) => r.duration_ms);
    },
    async listStale(status, createdBefore, limit) {
      return stale.all(status, createdBefore, limit).map((r) => read(r)!);
    },
    async countByKindAndStatus() {
      return byKindStatus.all();
    },
  };
}

function apiKeyRepo(db: Database.Database): ApiKeyRepo {
  const insert = db.prepare('INSERT OR IGNORE INTO api_keys (id, tenant_id, hash, doc) VALUES (?, ?, ?, ?)');
  const byHash = db.prepare<[string], { doc: string }>('SELECT doc FROM api_keys WHERE hash = ?');
  const byTenant = db.prepare<[string], { doc: string }>('SELECT doc FROM api_keys WHERE tenant_id = ? ORDER BY id');
  return {
    async insert(k) {
      return insert.run(k.id, k.tenant_id, k.hash, JSON.stringify(k)).changes === 1;
    },
    async findByHash(hash) {
      const row = byHash.get(hash);
      return row ? (JSON.parse(row.doc) as ApiKeyRecord) : null;
    },
    async list(tenantId) {
      return byTenant.all(tenantId).map((r) => JSON.parse(r.doc) as ApiKeyRecord);
    },
  };
}

function webhookSecretRepo(db: Database.Database): WebhookSecretRepo {
  const put = db.prepare('INSERT INTO webhook_secrets (tenant_id, kind, doc) VALUES (?, ?, ?) ON CONFLICT (tenant_id, kind) DO UPDATE SET doc = excluded.doc');
  const byTenant = db.prepare<[string], { doc: string }>('SELECT doc FROM webhook_secrets WHERE tenant_id = ? ORDER BY kind');
  const remove = db.prepare('DELETE FROM webhook_secrets WHERE tenant_id = ? AND kind = ?');
  return {
    async put(r) {
      put.run(r.tenant_id, r.kind, JSON.stringify(r));
    },
    async list(tenantId) {
      return byTenant.all(tenantId).map((r) => JSON.parse(r.doc) as WebhookSecretRecord);
    },
    async delete(tenantId, kind) {
      return remove.run(tenantId, kind).changes === 1;
    },
  };
}

function deliveryRepo(db: Database.Database): DeliveryRepo {
  const insert = db.prepare(
    'INSERT INTO deliveries (id, tenant_id, kind, status, provider_delivery_id, received_at, doc) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING',
  );
  const byProviderId = db.prepare<[string, string, string], { doc: string }>(
    'SELECT doc FROM deliveries WHERE tenant_id = ? AND kind = ? AND provider_delivery_id = ?',
  );
  const get = db.prepare<[string, string], { doc: string }>('SELECT doc FROM deliveries WHERE tenant_id = ? AND id = ?');
  const write = db.prepare('UPDATE deliveries SET status = ?, doc = ? WHERE tenant_id = ? AND id = ?');
  const stale = db.prepare<[string, string, number], { doc: string }>(
    'SELECT doc FROM deliveries WHERE status = ? AND received_at < ? ORDER BY received_at LIMIT ?',
  );
  const read = (row: { doc: string } | undefined): WebhookDelivery | null => (row ? (JSON.parse(row.doc) as WebhookDelivery) : null);
  const listStatements = new Map<string, Database.Statement<unknown[], { doc: string }>>();
  const listStatement = (kind: boolean, status: boolean) => {
    const shape = `${kind}:${status}`;
    let stmt = listStatements.get(shape);
    if (!stmt) {
      const where = ['tenant_id = ?', ...(kind ? ['kind = ?'] : []), ...(status ? ['status = ?'] : []), 'id < ?'];
      stmt = db.prepare<unknown[], { doc: string }>(`SELECT doc FROM deliveries WHERE ${where.join(' AND ')} ORDER BY id DESC LIMIT ?`);
      listStatements.set(shape, stmt);
    }
    return stmt;
  };
  const update = db.transaction((tenantId: string, id: string, changes: Partial<WebhookDelivery>, ifStatusIn: string[]) => {
    const current = read(get.get(tenantId, id));
    if (!current || !ifStatusIn.includes(current.status)) return null;
    const next: WebhookDelivery = { ...current, ...changes, id: current.id, tenant_id: current.tenant_id };
    write.run(next.status, JSON.stringify(next), tenantId, id);
    return next;
  });
  const insertOne = (d: WebhookDelivery): WebhookDelivery | null => {
    const inserted = insert.run(d.id, d.tenant_id, d.kind, d.status, d.provider_delivery_id, d.received_at, JSON.stringify(d)).changes === 1;
    if (inserted || d.provider_delivery_id === null) return null;
    return read(byProviderId.get(d.tenant_id, d.kind, d.provider_delivery_id));
  };
  // Group commit: deliveries that arrive in the same turn of the event loop are written in one
  // transaction, so a burst pays for one commit rather than one each. Each caller still learns
  // only after its row is committed.
  type Pending = { d: WebhookDelivery; resolve(v: WebhookDelivery | null): void; reject(e: unknown): void };
  let batch: Pending[] = [];
  const insertAll = db.transaction((items: Pending[]) => items.map((p) => insertOne(p.d)));
  const flush = () => {
    const items = batch;
    batch = [];
    try {
      const results = insertAll.immediate(items);
      items.forEach((p, i) => p.resolve(results[i]!));
    } catch {
      // one bad row must not fail the others: write them one by one
      for (const p of items) {
        try {
          p.resolve(insertOne(p.d));
        } catch (err) {
          p.reject(err);
        }
      }
    }
  };
  return {
    insert(d) {
      return new Promise((resolve, reject) => {
        if (batch.push({ d, resolve, reject }) === 1) setImmediate(flush);
      });
    },
    async get(tenantId, id) {
      return read(get.get(tenantId, id));
    },
    async list(tenantId, q) {
      const params: unknown[] = [tenantId, ...(q.kind ? [q.kind] : []), ...(q.status ? [q.status] : []), decodeCursor(q.cursor) ?? TOP, q.limit + 1];
      const rows = listStatement(Boolean(q.kind), Boolean(q.status)).all(...params);
      return toPage(
        rows.map((r) => read(r)!),
        q.limit,
      );
    },
    async update(tenantId, id, changes, ifStatusIn) {
      return update.immediate(tenantId, id, changes, ifStatusIn);
    },
    async listStale(status, receivedBefore, limit) {
      return stale.all(status, receivedBefore, limit).map((r) => read(r)!);
    },
  };
}
