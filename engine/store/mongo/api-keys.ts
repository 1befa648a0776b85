import { Schema, type Model } from 'mongoose';
import type { ApiKeyRecord } from '../../platform/index.js';
import { type ApiKeyRepo } from '../port.js';
import { fromStored, isDuplicateKey, loose, toStored, type Stored } from './documents.js';

export const apiKeySchema = new Schema({ _id: String, tenant_id: { type: String, required: true }, hash: { type: String, required: true } }, loose);
apiKeySchema.index({ hash: 1 }, { unique: true });
apiKeySchema.index({ tenant_id: 1, _id: 1 });

export function apiKeyRepo(model: Model<Stored<ApiKeyRecord>>): ApiKeyRepo {
  return {
    async insert(k) {
      try {
        await model.collection.insertOne(toStored(k) as never);
        return true;
      } catch (err) {
        if (isDuplicateKey(err)) return false;
        throw err;
      }
    },
    async findByHash(hash) {
      return fromStored(await model.findOne({ hash }).lean<Stored<ApiKeyRecord>>());
    },
    async list(tenantId) {
      const rows = await model.find({ tenant_id: tenantId }).sort({ _id: 1 }).lean<Stored<ApiKeyRecord>[]>();
      return rows.map((r) => fromStored(r)!);
    },
    async listBootstrap() {
      const rows = await model.find({ source: 'bootstrap' }).sort({ _id: 1 }).lean<Stored<ApiKeyRecord>[]>();
      return rows.map((r) => fromStored(r)!);
    },
    async update(tenantId, id, patch) {
      const row = await model.findOneAndUpdate({ _id: id, tenant_id: tenantId }, { $set: patch }, { returnDocument: 'after' }).lean<Stored<ApiKeyRecord>>();
      return fromStored(row);
    },
  };
}
