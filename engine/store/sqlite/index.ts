// SQLite adapter (better-sqlite3, WAL): the embedded default. Documents are JSON columns; the
// columns the API filters on are indexed beside them. Writes that depend on a read run in
// IMMEDIATE transactions, so they are conditional even with several processes on one file.
import fs from 'node:fs';
import path from 'node:path';
import Database from 'better-sqlite3';
import type { ApiKeyRecord, Automation } from '../../model.js';
import { decodeCursor, toPage, type ApiKeyRepo, type AutomationRepo, type Store } from '../port.js';
import { MIGRATIONS } from './migrations.js';

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
      return toPage(rows.map((r) => JSON.parse(r.doc) as Automation), q.limit);
    },
    async update(tenantId, id, changes, ifStatusIn) {
      return update.immediate(tenantId, id, changes, ifStatusIn);
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
