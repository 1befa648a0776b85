// A tenant's sealed webhook secrets, one row per kind.
import { groupCommit, type Db } from './db.js';
import type { WebhookSecretRecord } from '../../platform/index.js';
import type { WebhookSecretRepo } from '../port.js';

export function webhookSecretRepo(db: Db): WebhookSecretRepo {
  const put = db.prepare('INSERT INTO webhook_secrets (tenant_id, kind, doc) VALUES (?, ?, ?) ON CONFLICT (tenant_id, kind) DO UPDATE SET doc = excluded.doc');
  const byTenant = db.prepare<[string], { doc: string }>('SELECT doc FROM webhook_secrets WHERE tenant_id = ? ORDER BY kind');
  const remove = db.prepare('DELETE FROM webhook_secrets WHERE tenant_id = ? AND kind = ?');
  const commit = groupCommit(db);
  return {
    async put(r) {
      await commit(() => put.run(r.tenant_id, r.kind, JSON.stringify(r)));
    },
    async list(tenantId) {
      return byTenant.all(tenantId).map((r) => JSON.parse(r.doc) as WebhookSecretRecord);
    },
    async delete(tenantId, kind) {
      return commit(() => remove.run(tenantId, kind).changes === 1);
    },
  };
}
