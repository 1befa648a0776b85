// API keys: random, shown once, stored as a sha256 hash and bound to one tenant. A presented key is
// hashed and looked up by its hash, so no stored key is ever compared byte by byte.
import { createHash, randomBytes } from 'node:crypto';
import type { ApiKeySeed } from '../../config/env.js';
import { type Clock, newId, type Logger, type ApiKeyRecord } from '../platform/index.js';
import type { Store } from '../store/index.js';

export function hashKey(key: string): string {
  return createHash('sha256').update(key, 'utf8').digest('hex');
}

export function generateKey(): string {
  return `sk_${randomBytes(32).toString('base64url')}`;
}

export function apiKeysOf(deps: { store: Store; clock: Clock; log: Logger }) {
  const { store, clock, log } = deps;
  return {
    /** Makes a new key; the returned `key` is the only time it exists in clear. */
    async create(tenantId: string, opts: { label?: string; source: ApiKeyRecord['source'] }): Promise<{ record: ApiKeyRecord; key: string }> {
      const key = generateKey();
      const record: ApiKeyRecord = {
        id: newId('key'),
        tenant_id: tenantId,
        hash: hashKey(key),
        label: opts.label ?? null,
        source: opts.source,
        created_at: clock.now().toISOString(),
      };
      await store.apiKeys.insert(record);
      log.info({ tenant_id: tenantId, key_id: record.id, source: opts.source }, 'api key created');
      return { record, key };
    },

    /** The tenant a presented key belongs to, or null. */
    async resolve(presented: string): Promise<ApiKeyRecord | null> {
      return store.apiKeys.findByHash(hashKey(presented));
    },

    /** Stores the bootstrap keys of SERVICE_API_KEYS; a key already stored is left as it is. */
    async seed(seeds: ApiKeySeed[]): Promise<number> {
      let added = 0;
      for (const s of seeds) {
        const record: ApiKeyRecord = {
          id: newId('key'),
          tenant_id: s.tenantId,
          hash: hashKey(s.key),
          label: 'SERVICE_API_KEYS',
          source: 'bootstrap',
          created_at: clock.now().toISOString(),
        };
        if (await store.apiKeys.insert(record)) added++;
        else {
          const existing = await store.apiKeys.findByHash(record.hash);
          if (existing && existing.tenant_id !== s.tenantId) {
            throw new Error(`SERVICE_API_KEYS: a key given for tenant ${s.tenantId} is already bound to another tenant`);
          }
        }
      }
      if (added) log.info({ added }, 'bootstrap api keys stored');
      return added;
    },
  };
}

export type ApiKeys = ReturnType<typeof apiKeysOf>;
