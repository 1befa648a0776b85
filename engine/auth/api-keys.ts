// API keys: random, shown once, stored as a sha256 hash and bound to one tenant. A presented key is
// hashed and looked up by its hash, so no stored key is ever compared byte by byte.
import { createHash, randomBytes } from 'node:crypto';
import { ConfigError, type ApiKeySeed } from '../../config/env.js';
import {
  type ApiKeyRecord,
  type Clock,
  ConflictError,
  newId,
  NotFoundError,
  type Logger,
  pruneInPages,
  UnauthorizedError,
  ValidationError,
} from '../platform/index.js';
import type { Store } from '../store/index.js';

/**
 * Every key made with `root`, and those made with them, all the way down (revoked ones too, and through them).
 * One pass over the tenant's keys, then a walk of the tree: time in line with the keys, however many (a
 * tenant's revoked and expired keys stay listed, and a walk that read them all for each key held the event
 * loop for seconds past a few thousand).
 */
function madeBelow(all: ApiKeyRecord[], root: ApiKeyRecord): ApiKeyRecord[] {
  const madeWith = new Map<string, ApiKeyRecord[]>();
  for (const k of all) {
    if (!k.created_by) continue;
    const siblings = madeWith.get(k.created_by);
    if (siblings) siblings.push(k);
    else madeWith.set(k.created_by, [k]);
  }
  const below: ApiKeyRecord[] = [];
  const seen = new Set([root.id]);
  for (let queue = [root], i = 0; i < queue.length; i++)
    for (const k of madeWith.get(`key:${queue[i]!.id}`) ?? []) {
      if (seen.has(k.id)) continue;
      seen.add(k.id);
      below.push(k);
      queue.push(k);
    }
  return below;
}

export function hashKey(key: string): string {
  return createHash('sha256').update(key, 'utf8').digest('hex');
}

export function generateKey(): string {
  return `sk_${randomBytes(32).toString('base64url')}`;
}

/** How stale `last_used_at` may be: a key in use is written at most this often. */
export const API_KEY_TOUCH_SECONDS = 60;

const REMOVED = 'removed from SERVICE_API_KEYS' as const;

/** A key that opens nothing any more: revoked, or past its expiry. */
export function isSpent(k: ApiKeyRecord, now: Date): boolean {
  // an expiry that does not read as a date opens nothing
  return !!k.revoked_at || (!!k.expires_at && !(Date.parse(k.expires_at) > now.getTime()));
}

export function apiKeysOf(deps: { store: Store; clock: Clock; log: Logger; limits?: { tenantMaxApiKeys?: number; apiKeysSpentKeptDays?: number } }) {
  const { store, clock, log } = deps;

  function record(
    tenantId: string,
    hash: string,
    o: { label?: string | null; source: ApiKeyRecord['source']; expires_at?: string | null; created_by?: string | null },
  ): ApiKeyRecord {
    return {
      id: newId('key'),
      tenant_id: tenantId,
      hash,
      label: o.label ?? null,
      source: o.source,
      created_at: clock.now().toISOString(),
      expires_at: o.expires_at ?? null,
      revoked_at: null,
      revoked_reason: null,
      last_used_at: null,
      created_by: o.created_by ?? null,
    };
  }

  return {
    /** Makes a new key; the returned `key` is the only time it exists in clear. */
    async create(
      tenantId: string,
      opts: {
        label?: string | null;
        source: ApiKeyRecord['source'];
        expires_at?: string | null;
        created_by?: string | null;
        /** the expiry of the key that makes this one: the new key expires no later (by default, then) */
        not_after?: string | null;
      },
    ): Promise<{ record: ApiKeyRecord; key: string }> {
      const notAfter = opts.not_after ? Date.parse(opts.not_after) : null;
      const expires = opts.expires_at ? Date.parse(opts.expires_at) : notAfter;
      if (expires !== null && !Number.isFinite(expires))
        throw new ValidationError('the expiry is not a date', [{ path: '/body/expires_at', message: 'an RFC 3339 date and time' }]);
      if (expires !== null && expires <= clock.now().getTime())
        throw new ValidationError('the expiry is in the past', [{ path: '/body/expires_at', message: 'must be in the future' }]);
      // a key that expires cannot make one that outlives it
      if (expires !== null && notAfter !== null && expires > notAfter)
        throw new ValidationError('the expiry is after that of the key making it', [
          { path: '/body/expires_at', message: `must not be after ${new Date(notAfter).toISOString()}, when the key making it expires` },
        ]);
      const key = generateKey();
      const made = record(tenantId, hashKey(key), { ...opts, expires_at: expires === null ? null : new Date(expires).toISOString() });
      // keys made through the API are held to the tenant's cap (each is a row every list and revocation reads);
      // the operator's (the CLI's, SERVICE_API_KEYS) are not
      const max = opts.source === 'api' ? deps.limits?.tenantMaxApiKeys : undefined;
      const inserted = await store.apiKeys.insert(made, max ? { maxLive: max, now: clock.now().toISOString() } : undefined);
      if (inserted === 'over-cap')
        throw new ConflictError(
          `this tenant has ${max} API keys neither revoked nor expired, the most it may keep (SERVICE_TENANT_MAX_API_KEYS): revoke one first`,
        );
      // the request came in with a key revoked since: it makes none
      if (inserted === 'maker-revoked') throw new UnauthorizedError('the API key this request came with was revoked');
      log.info({ tenant_id: tenantId, key_id: made.id, source: opts.source }, 'api key created');
      return { record: made, key };
    },

    list: (tenantId: string) => store.apiKeys.list(tenantId),
    /** A page of the tenant's keys, newest first. */
    page: (tenantId: string, q: { limit: number; cursor?: string }) => store.apiKeys.page(tenantId, q),
    get: (tenantId: string, id: string) => store.apiKeys.get(tenantId, id),

    /**
     * Revokes one of the tenant's keys; every process refuses it from its next request (each looks keys
     * up in the store). With `cascade`, also every key made with it, and those made with them, all the
     * way down (a leaked key's holder may have made keys). Answers the key and the others it revoked.
     */
    async revoke(tenantId: string, id: string, opts: { cascade?: boolean } = {}): Promise<{ key: ApiKeyRecord; cascaded: ApiKeyRecord[] }> {
      const existing = await store.apiKeys.get(tenantId, id);
      if (!existing) throw new NotFoundError(`no api key ${id}`);
      const at = clock.now().toISOString();
      const revokeOne = async (k: ApiKeyRecord): Promise<ApiKeyRecord> => {
        // revoked here it stays revoked, even if SERVICE_API_KEYS had dropped it first and lists it again later
        if (k.revoked_reason === 'revoked') return k;
        const revoked = await store.apiKeys.update(tenantId, k.id, { revoked_at: k.revoked_at ?? at, revoked_reason: 'revoked' });
        if (!revoked) throw new NotFoundError(`no api key ${k.id}`);
        return revoked;
      };
      // the key first, then what was made with it: a key made with a revoked key is refused as it is written
      // (ApiKeyRepo.insert), so once a listing finds nothing left to revoke, nothing more can come
      const key = await revokeOne(existing);
      const cascaded: ApiKeyRecord[] = [];
      while (opts.cascade) {
        const left = madeBelow(await store.apiKeys.list(tenantId), existing).filter((k) => k.revoked_reason !== 'revoked');
        if (!left.length) break;
        for (const k of left) cascaded.push(await revokeOne(k));
      }
      log.info({ tenant_id: tenantId, key_id: id, cascaded: cascaded.map((k) => k.id) }, 'api key revoked');
      return { key, cascaded };
    },

    /**
     * Deletes the keys revoked or expired more than SERVICE_API_KEYS_SPENT_KEPT_DAYS ago (the reconciler's pass),
     * a page at a time, within a bound: a tenant that makes a key for every CI job does not keep them all for
     * good. How many were deleted.
     */
    async prune(): Promise<number> {
      const days = deps.limits?.apiKeysSpentKeptDays;
      if (!days) return 0;
      const before = new Date(clock.now().getTime() - days * 86_400_000).toISOString();
      let deleted = 0;
      await pruneInPages(async (limit) => {
        const n = await store.apiKeys.pruneSpent(before, limit);
        deleted += n;
        return n;
      });
      if (deleted) log.info({ deleted, kept_days: days }, 'api keys revoked or expired long ago deleted');
      return deleted;
    },

    /** The key a presented secret is, when it may still be used; its last use is written now and then. */
    async resolve(presented: string): Promise<ApiKeyRecord | null> {
      const found = await store.apiKeys.findByHash(hashKey(presented));
      const now = clock.now();
      if (!found || isSpent(found, now)) return null;
      if (!found.last_used_at || now.getTime() - Date.parse(found.last_used_at) >= API_KEY_TOUCH_SECONDS * 1000)
        void store.apiKeys
          .update(found.tenant_id, found.id, { last_used_at: now.toISOString() })
          .catch((err: Error) => log.warn({ key_id: found.id, err: err.message }, 'the last use of an api key could not be written'));
      return found;
    },

    /**
     * Syncs the bootstrap keys with SERVICE_API_KEYS: new ones are stored, ones no longer listed are
     * revoked (a key that leaves the variable stops working at the next start), and one listed again is
     * restored. A key revoked through the API stays revoked.
     */
    async seed(seeds: ApiKeySeed[]): Promise<{ added: number; revoked: number }> {
      let added = 0;
      const listed = new Set<string>();
      for (const s of seeds) {
        const hash = hashKey(s.key);
        listed.add(hash);
        if (await store.apiKeys.insert(record(s.tenantId, hash, { label: 'SERVICE_API_KEYS', source: 'bootstrap' }))) {
          added++;
          continue;
        }
        const existing = await store.apiKeys.findByHash(hash);
        if (existing && existing.tenant_id !== s.tenantId)
          throw new ConfigError([`SERVICE_API_KEYS: a key given for tenant ${s.tenantId} is already bound to another tenant`]);
        if (existing?.revoked_reason === REMOVED) await store.apiKeys.update(existing.tenant_id, existing.id, { revoked_at: null, revoked_reason: null });
      }
      let revoked = 0;
      const now = clock.now().toISOString();
      for (const k of await store.apiKeys.listBootstrap()) {
        if (listed.has(k.hash) || k.revoked_at) continue;
        await store.apiKeys.update(k.tenant_id, k.id, { revoked_at: now, revoked_reason: REMOVED });
        revoked++;
      }
      if (added || revoked) log.info({ added, revoked }, 'bootstrap api keys synced with SERVICE_API_KEYS');
      return { added, revoked };
    },
  };
}

export type ApiKeys = ReturnType<typeof apiKeysOf>;
