import { Schema, type Model } from 'mongoose';
import type { ConnectionRecord } from '../../platform/index.js';
import { type ConnectionRepo } from '../port.js';
import { fromStored, insertNew, isDuplicateKey, loose, type Stored } from './documents.js';

export const connectionSchema = new Schema(
  { _id: String, tenant_id: { type: String, required: true }, provider: { type: String, required: true }, name: { type: String, required: true } },
  loose,
);
connectionSchema.index({ tenant_id: 1, name: 1 }, { unique: true });
connectionSchema.index({ tenant_id: 1, provider: 1, _id: 1 });

export function connectionRepo(model: Model<Stored<ConnectionRecord>>): ConnectionRepo {
  return {
    insert: (c) => insertNew(model, c),
    async get(tenantId, id) {
      return fromStored(await model.findOne({ _id: id, tenant_id: tenantId }).lean<Stored<ConnectionRecord>>());
    },
    async list(tenantId, provider) {
      const rows = await model
        .find({ tenant_id: tenantId, ...(provider ? { provider } : {}) })
        .sort({ _id: 1 })
        .lean<Stored<ConnectionRecord>[]>();
      return rows.map((r) => fromStored(r)!);
    },
    async update(tenantId, id, changes, when) {
      const unchanged = when ? { base_url: when.base_url, 'sealed.iv': when.sealed.iv, 'sealed.ct': when.sealed.ct } : {};
      try {
        const row = await model
          .findOneAndUpdate({ _id: id, tenant_id: tenantId, ...unchanged }, { $set: changes }, { returnDocument: 'after' })
          .lean<Stored<ConnectionRecord>>();
        return fromStored(row);
      } catch (err) {
        if (isDuplicateKey(err)) return 'name-taken';
        throw err;
      }
    },
    async delete(tenantId, id) {
      return (await model.deleteOne({ _id: id, tenant_id: tenantId })).deletedCount === 1;
    },
  };
}
