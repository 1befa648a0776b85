import { Schema, type Model } from 'mongoose';
import type { IdempotencyKeyRepo, IdempotencyRecord } from '../port.js';
import { isDuplicateKey, loose } from './documents.js';

/** a key's document: its record, and the time MongoDB's TTL monitor forgets it after (a day and a margin) */
type KeyDoc = IdempotencyRecord & { _id: string; expires_at: Date };

const KEPT_MS = 25 * 3600 * 1000;

export const idempotencyKeySchema = new Schema({ _id: String, created_at: { type: String, required: true }, expires_at: Date }, loose);
idempotencyKeySchema.index({ expires_at: 1 }, { expireAfterSeconds: 0 });
idempotencyKeySchema.index({ created_at: 1 });

/**
 * `made`: where a claim looks for what the record that holds a key made: the runs' collection, or for the keys
 * of automations' creates (a digest scope of their own in the same collection) the automations'.
 */
export function idempotencyKeyRepo(model: Model<KeyDoc>, made: Model<{ _id: string; tenant_id: string }>): IdempotencyKeyRepo {
  const idOf = (tenantId: string, keyDigest: string) => `${tenantId}:${keyDigest}`;
  return {
    async claim(r, since, pendingSince) {
      const doc: KeyDoc = { ...r, _id: idOf(r.tenant_id, r.key_digest), expires_at: new Date(Date.parse(r.created_at) + KEPT_MS) };
      // no transaction: the record read is replaced only if it is still the one read (or inserted only if
      // there was none), else read again; a claim made meanwhile is then the one that holds the key
      for (;;) {
        const held = await model.findOne({ _id: doc._id }).lean<KeyDoc>();
        if (held && held.created_at > since && held.run_id !== r.run_id) {
          if (held.created_at > pendingSince || (await made.exists({ _id: held.run_id, tenant_id: r.tenant_id }))) {
            return { tenant_id: held.tenant_id, key_digest: held.key_digest, fingerprint: held.fingerprint, run_id: held.run_id, created_at: held.created_at };
          }
        }
        try {
          if (!held) {
            await model.collection.insertOne(doc as never);
            return null;
          }
          const replaced = await model.collection.replaceOne({ _id: doc._id, run_id: held.run_id, created_at: held.created_at } as never, doc);
          if (replaced.matchedCount === 1) return null;
        } catch (err) {
          if (!isDuplicateKey(err)) throw err;
        }
      }
    },
    async release(tenantId, keyDigest, runId) {
      await model.deleteOne({ _id: idOf(tenantId, keyDigest), run_id: runId });
    },
    async get(tenantId, keyDigest, since) {
      const doc = await model.findOne({ _id: idOf(tenantId, keyDigest), created_at: { $gt: since } }).lean<KeyDoc>();
      if (!doc) return null;
      return { tenant_id: doc.tenant_id, key_digest: doc.key_digest, fingerprint: doc.fingerprint, run_id: doc.run_id, created_at: doc.created_at };
    },
    async prune(before, limit) {
      const old = await model
        .find({ created_at: { $lt: before } }, { _id: 1 })
        .sort({ created_at: 1 })
        .limit(limit)
        .lean<{ _id: string }[]>();
      if (!old.length) return 0;
      return (await model.deleteMany({ _id: { $in: old.map((d) => d._id) }, created_at: { $lt: before } })).deletedCount;
    },
  };
}
