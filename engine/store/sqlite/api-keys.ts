// API keys, found by the hash of the key.
import { groupCommit, type Db } from './db.js';
import type { ApiKeyPatch, ApiKeyRecord } from '../../platform/index.js';
import type { ApiKeyRepo } from '../port.js';

export function apiKeyRepo(db: Db): ApiKeyRepo {
  const insert = db.prepare('INSERT OR IGNORE INTO api_keys (id, tenant_id, hash, doc) VALUES (?, ?, ?, ?)');
  const byHash = db.prepare<[string], { doc: string }>('SELECT doc FROM api_keys WHERE hash = ?');
  const byTenant = db.prepare<[string], { doc: string }>('SELECT doc FROM api_keys WHERE tenant_id = ? ORDER BY id');
  const all = db.prepare<[], { doc: string }>('SELECT doc FROM api_keys ORDER BY id');
  const one = db.prepare<[string, string], { doc: string }>('SELECT doc FROM api_keys WHERE tenant_id = ? AND id = ?');
  const write = db.prepare('UPDATE api_keys SET doc = ? WHERE tenant_id = ? AND id = ?');
  const commit = groupCommit(db);
  const update = (tenantId: string, id: string, patch: ApiKeyPatch): ApiKeyRecord | null => {
    const row = one.get(tenantId, id);
    if (!row) return null;
    const next = { ...(JSON.parse(row.doc) as ApiKeyRecord), ...patch };
    write.run(JSON.stringify(next), tenantId, id);
    return next;
  };
  return {
    async insert(k) {
      return commit(() => insert.run(k.id, k.tenant_id, k.hash, JSON.stringify(k)).changes === 1);
    },
    async findByHash(hash) {
      const row = byHash.get(hash);
      return row ? (JSON.parse(row.doc) as ApiKeyRecord) : null;
    },
    async list(tenantId) {
      return byTenant.all(tenantId).map((r) => JSON.parse(r.doc) as ApiKeyRecord);
    },
    async listBootstrap() {
      // few keys, read at start only: the source lives in the document
      return all
        .all()
        .map((r) => JSON.parse(r.doc) as ApiKeyRecord)
        .filter((k) => k.source === 'bootstrap');
    },
    async update(tenantId, id, patch) {
      return commit(() => update(tenantId, id, patch));
    },
  };
}
