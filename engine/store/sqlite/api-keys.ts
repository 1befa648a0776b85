// API keys, found by the hash of the key.
import { groupCommit, TOP, type Db } from './db.js';
import type { ApiKeyPatch, ApiKeyRecord } from '../../platform/index.js';
import { decodeCursor, makerOf, toPage, type ApiKeyRepo } from '../port.js';

export function apiKeyRepo(db: Db): ApiKeyRepo {
  const insert = db.prepare('INSERT OR IGNORE INTO api_keys (id, tenant_id, hash, doc) VALUES (?, ?, ?, ?)');
  const byHash = db.prepare<[string], { doc: string }>('SELECT doc FROM api_keys WHERE hash = ?');
  const byTenant = db.prepare<[string], { doc: string }>('SELECT doc FROM api_keys WHERE tenant_id = ? ORDER BY id');
  const all = db.prepare<[], { doc: string }>('SELECT doc FROM api_keys ORDER BY id');
  const one = db.prepare<[string, string], { doc: string }>('SELECT doc FROM api_keys WHERE tenant_id = ? AND id = ?');
  const write = db.prepare('UPDATE api_keys SET doc = ? WHERE tenant_id = ? AND id = ?');
  const page = db.prepare<[string, string, number], { doc: string }>('SELECT doc FROM api_keys WHERE tenant_id = ? AND id < ? ORDER BY id DESC LIMIT ?');
  // the keys the cap counts: made through the API, neither revoked nor expired (the operator's, CLI and
  // SERVICE_API_KEYS, are not); expiries are ISO times of one form, compared as text
  const live = db.prepare<[string, string], { n: number }>(
    `SELECT COUNT(*) AS n FROM api_keys WHERE tenant_id = ? AND json_extract(doc, '$.source') = 'api' AND json_extract(doc, '$.revoked_at') IS NULL
     AND (json_extract(doc, '$.expires_at') IS NULL OR json_extract(doc, '$.expires_at') > ?)`,
  );
  // when a key was spent (revoked or expired, whichever came first): the expression of the index api_keys_spent
  const spentAt = `min(coalesce(json_extract(doc, '$.revoked_at'), json_extract(doc, '$.expires_at')), coalesce(json_extract(doc, '$.expires_at'), json_extract(doc, '$.revoked_at')))`;
  const pruneSpent = db.prepare<[string, number]>(
    `DELETE FROM api_keys WHERE rowid IN (
       SELECT rowid FROM api_keys INDEXED BY api_keys_spent
       WHERE json_extract(doc, '$.source') != 'bootstrap' AND (json_extract(doc, '$.revoked_at') IS NOT NULL OR json_extract(doc, '$.expires_at') IS NOT NULL)
         AND ${spentAt} < ?
         AND NOT EXISTS (SELECT 1 FROM api_keys made WHERE json_extract(made.doc, '$.created_by') = 'key:' || api_keys.id AND made.tenant_id = api_keys.tenant_id)
       ORDER BY ${spentAt} LIMIT ?)`,
  );
  const commit = groupCommit(db);
  const update = (tenantId: string, id: string, patch: ApiKeyPatch): ApiKeyRecord | null => {
    const row = one.get(tenantId, id);
    if (!row) return null;
    const next = { ...(JSON.parse(row.doc) as ApiKeyRecord), ...patch };
    write.run(JSON.stringify(next), tenantId, id);
    return next;
  };
  return {
    async insert(k, cap) {
      // counted, and the maker read, inside the write's IMMEDIATE transaction: no other write, of this process or
      // another, comes between
      return commit(() => {
        if (cap && (live.get(k.tenant_id, cap.now)?.n ?? 0) >= cap.maxLive) return 'over-cap';
        const maker = makerOf(k);
        if (maker && (JSON.parse(one.get(k.tenant_id, maker)?.doc ?? '{}') as Partial<ApiKeyRecord>).revoked_at) return 'maker-revoked';
        return insert.run(k.id, k.tenant_id, k.hash, JSON.stringify(k)).changes === 1;
      });
    },
    async get(tenantId, id) {
      const row = one.get(tenantId, id);
      return row ? (JSON.parse(row.doc) as ApiKeyRecord) : null;
    },
    async page(tenantId, q) {
      const rows = page.all(tenantId, decodeCursor(q.cursor, 'api-keys') ?? TOP, q.limit + 1).map((r) => JSON.parse(r.doc) as ApiKeyRecord);
      return toPage(rows, q.limit, 'api-keys');
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
    async pruneSpent(spentBefore, limit) {
      // in the write's IMMEDIATE transaction: no key is made with one of these between the check and the delete
      return commit(() => pruneSpent.run(spentBefore, limit).changes);
    },
  };
}
