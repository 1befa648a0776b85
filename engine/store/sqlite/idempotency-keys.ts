// Idempotency keys and the runs they started, one row per key of a tenant, forgotten after a day.
import type { IdempotencyKeyRepo, IdempotencyRecord } from '../port.js';
import { groupCommit, type Db } from './db.js';

export function idempotencyKeyRepo(db: Db): IdempotencyKeyRepo {
  const put = db.prepare(
    `INSERT INTO idempotency_keys (tenant_id, key_digest, fingerprint, run_id, created_at) VALUES (?, ?, ?, ?, ?)
     ON CONFLICT (tenant_id, key_digest) DO UPDATE SET fingerprint = excluded.fingerprint, run_id = excluded.run_id, created_at = excluded.created_at`,
  );
  const get = db.prepare<[string, string, string], IdempotencyRecord>(
    'SELECT tenant_id, key_digest, fingerprint, run_id, created_at FROM idempotency_keys WHERE tenant_id = ? AND key_digest = ? AND created_at > ?',
  );
  const prune = db.prepare(
    `DELETE FROM idempotency_keys WHERE (tenant_id, key_digest) IN
     (SELECT tenant_id, key_digest FROM idempotency_keys WHERE created_at < ? ORDER BY created_at LIMIT ?)`,
  );
  const commit = groupCommit(db);
  return {
    async put(r) {
      await commit(() => put.run(r.tenant_id, r.key_digest, r.fingerprint, r.run_id, r.created_at));
    },
    async get(tenantId, keyDigest, since) {
      return get.get(tenantId, keyDigest, since) ?? null;
    },
    async prune(before, limit) {
      return commit(() => prune.run(before, limit).changes);
    },
  };
}
