import { Schema, type Model } from 'mongoose';
import type { IdempotencyKeyRepo, IdempotencyRecord } from '../port.js';
import { loose } from './documents.js';

/** a key's document: its record, and the time MongoDB's TTL monitor forgets it after (a day and a margin) */
type KeyDoc = IdempotencyRecord & { _id: string; expires_at: Date };

const KEPT_MS = 25 * 3600 * 1000;

export const idempotencyKeySchema = new Schema({ _id: String, created_at: { type: String, required: true }, expires_at: Date }, loose);
idempotencyKeySchema.index({ expires_at: 1 }, { expireAfterSeconds: 0 });
idempotencyKeySchema.index({ created_at: 1 });

export function idempotencyKeyRepo(model: Model<KeyDoc>): IdempotencyKeyRepo {
  const idOf = (tenantId: string, keyDigest: string) => `${tenantId}:${keyDigest}`;
  return {
    async put(r) {
      const doc: KeyDoc = { ...r, _id: idOf(r.tenant_id, r.key_digest), expires_at: new Date(Date.parse(r.created_at) + KEPT_MS) };
      await model.collection.replaceOne({ _id: doc._id } as never, doc, { upsert: true });
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
