// Idempotency keys and the runs (or automations) they made, one row per key of a tenant, forgotten after a day.
import type { IdempotencyKeyRepo, IdempotencyRecord } from '../port.js';
import { groupCommit, type Db } from './db.js';

const SELECT = 'SELECT tenant_id, key_digest, fingerprint, run_id, created_at FROM idempotency_keys WHERE tenant_id = ? AND key_digest = ? AND created_at > ?';

/**
 * IdempotencyKeyRepo.claim as a write of a transaction (the runs' insert takes a key in its own, the automations'
 * insert a create's): the record that holds the key, or null when `r` was kept. `made`: the table a record's
 * run_id is stored in once its request has made it (the runs, or for a create's key the automations).
 */
export function keyClaimer(
  db: Db,
  made: 'runs' | 'automations' = 'runs',
): (r: IdempotencyRecord, since: string, pendingSince: string) => IdempotencyRecord | null {
  const put = db.prepare(
    `INSERT INTO idempotency_keys (tenant_id, key_digest, fingerprint, run_id, created_at) VALUES (?, ?, ?, ?, ?)
     ON CONFLICT (tenant_id, key_digest) DO UPDATE SET fingerprint = excluded.fingerprint, run_id = excluded.run_id, created_at = excluded.created_at`,
  );
  const get = db.prepare<[string, string, string], IdempotencyRecord>(SELECT);
  const stored = db.prepare<[string, string], { one: number }>(`SELECT 1 AS one FROM ${made} WHERE id = ? AND tenant_id = ?`);
  return (r, since, pendingSince) => {
    const held = get.get(r.tenant_id, r.key_digest, since);
    if (held && held.run_id !== r.run_id && (held.created_at > pendingSince || stored.get(held.run_id, r.tenant_id))) return held;
    put.run(r.tenant_id, r.key_digest, r.fingerprint, r.run_id, r.created_at);
    return null;
  };
}

export function idempotencyKeyRepo(db: Db): IdempotencyKeyRepo {
  const claim = keyClaimer(db);
  const get = db.prepare<[string, string, string], IdempotencyRecord>(SELECT);
  const release = db.prepare('DELETE FROM idempotency_keys WHERE tenant_id = ? AND key_digest = ? AND run_id = ?');
  const prune = db.prepare(
    `DELETE FROM idempotency_keys WHERE (tenant_id, key_digest) IN
     (SELECT tenant_id, key_digest FROM idempotency_keys WHERE created_at < ? ORDER BY created_at LIMIT ?)`,
  );
  const commit = groupCommit(db);
  return {
    async claim(r, since, pendingSince) {
      // read and written in one transaction: no other connection's claim comes between
      return commit(() => claim(r, since, pendingSince));
    },
    async release(tenantId, keyDigest, runId) {
      await commit(() => release.run(tenantId, keyDigest, runId));
    },
    async get(tenantId, keyDigest, since) {
      return get.get(tenantId, keyDigest, since) ?? null;
    },
    async prune(before, limit) {
      return commit(() => prune.run(before, limit).changes);
    },
  };
}
