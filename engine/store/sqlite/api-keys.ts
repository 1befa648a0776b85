// API keys, found by the hash of the key.
import type { Db } from './db.js';
import type { ApiKeyRecord } from '../../platform/index.js';
import type { ApiKeyRepo } from '../port.js';

export function apiKeyRepo(db: Db): ApiKeyRepo {
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
