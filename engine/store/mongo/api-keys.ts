import { Schema, type Model } from 'mongoose';
import type { ApiKeyRecord } from '../../platform/index.js';
import { makerOf, type ApiKeyRepo } from '../port.js';
import { fromStored, insertNew, loose, pageOf, type Stored } from './documents.js';
import type { Leases } from './leases.js';

export const apiKeySchema = new Schema({ _id: String, tenant_id: { type: String, required: true }, hash: { type: String, required: true } }, loose);
apiKeySchema.index({ hash: 1 }, { unique: true });
apiKeySchema.index({ tenant_id: 1, _id: 1 });
// spent keys past their retention, and whether a key made one still stored (pruneSpent)
apiKeySchema.index({ revoked_at: 1 }, { sparse: true });
apiKeySchema.index({ expires_at: 1 }, { sparse: true });
apiKeySchema.index({ tenant_id: 1, created_by: 1 }, { sparse: true });

export function apiKeyRepo(model: Model<Stored<ApiKeyRecord>>, leases: Leases): ApiKeyRepo {
  /**
   * Inserts, then reads the maker: one revoked by then (before this key's insert, or meanwhile) has its
   * cascade's listing miss this key, so this key is revoked here and refused. Without transactions, the order
   * is what holds: a cascade revokes its key before it lists what was made with it.
   */
  const insert = async (k: ApiKeyRecord): Promise<boolean | 'maker-revoked'> => {
    if (!(await insertNew(model, k))) return false;
    const maker = makerOf(k);
    if (!maker) return true;
    const made = await model.findOne({ _id: maker, tenant_id: k.tenant_id }, { revoked_at: 1 }).read('primary').lean<{ revoked_at?: string | null }>();
    if (!made?.revoked_at) return true;
    await model.updateOne({ _id: k.id, tenant_id: k.tenant_id }, { $set: { revoked_at: made.revoked_at, revoked_reason: 'revoked' } });
    return 'maker-revoked';
  };
  return {
    async insert(k, cap) {
      if (!cap) return insert(k);
      // counted and inserted under the tenant's lease: its capped inserts take turns, as in SQLite's IMMEDIATE transaction
      let inserted: boolean | 'maker-revoked' = false;
      const done = await leases.insertHeld(
        `api-keys:${k.tenant_id}`,
        async () =>
          (await model
            .countDocuments({ tenant_id: k.tenant_id, source: 'api', revoked_at: null, $or: [{ expires_at: null }, { expires_at: { $gt: cap.now } }] })
            .read('primary')) >= cap.maxLive
            ? 'over-cap'
            : null,
        async () => {
          inserted = await insert(k);
          return 'inserted';
        },
      );
      return done === 'over-cap' ? 'over-cap' : inserted;
    },
    // a revocation reads the key, then lists what was made with it, from the primary: a secondary that lags
    // could miss a key made with it just before it was revoked, and the cascade would end without it
    async get(tenantId, id) {
      return fromStored(await model.findOne({ _id: id, tenant_id: tenantId }).read('primary').lean<Stored<ApiKeyRecord>>());
    },
    page: (tenantId, q) => pageOf(model, { tenant_id: tenantId }, q),
    // every request's key: read from the primary, so a key revoked there is not let in by a secondary that lags
    async findByHash(hash) {
      return fromStored(await model.findOne({ hash }).read('primary').lean<Stored<ApiKeyRecord>>());
    },
    async list(tenantId) {
      const rows = await model.find({ tenant_id: tenantId }).sort({ _id: 1 }).read('primary').lean<Stored<ApiKeyRecord>[]>();
      return rows.map((r) => fromStored(r)!);
    },
    async listBootstrap() {
      const rows = await model.find({ source: 'bootstrap' }).sort({ _id: 1 }).lean<Stored<ApiKeyRecord>[]>();
      return rows.map((r) => fromStored(r)!);
    },
    async pruneSpent(spentBefore, limit) {
      // the spent keys past the time that made no key still stored (a cascade walks through one that did: it
      // goes once what it made has); a spent key makes none meanwhile
      const spent = await model
        .aggregate<{ _id: string; tenant_id: string }>([
          { $match: { source: { $ne: 'bootstrap' }, $or: [{ revoked_at: { $ne: null, $lt: spentBefore } }, { expires_at: { $ne: null, $lt: spentBefore } }] } },
          {
            $lookup: {
              from: model.collection.name,
              let: { maker: { $concat: ['key:', '$_id'] }, tenant: '$tenant_id' },
              pipeline: [
                { $match: { $expr: { $and: [{ $eq: ['$tenant_id', '$$tenant'] }, { $eq: ['$created_by', '$$maker'] }] } } },
                { $limit: 1 },
                { $project: { _id: 1 } },
              ],
              as: 'made',
            },
          },
          { $match: { made: { $size: 0 } } },
          { $sort: { _id: 1 } },
          { $limit: limit },
          { $project: { _id: 1, tenant_id: 1 } },
        ])
        .read('primary');
      if (!spent.length) return 0;
      return (await model.deleteMany({ _id: { $in: spent.map((k) => k._id) } })).deletedCount;
    },
    async update(tenantId, id, patch) {
      const row = await model.findOneAndUpdate({ _id: id, tenant_id: tenantId }, { $set: patch }, { returnDocument: 'after' }).lean<Stored<ApiKeyRecord>>();
      return fromStored(row);
    },
  };
}
