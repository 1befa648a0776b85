import { Schema, type Model } from 'mongoose';
import type { WebhookSecretRecord } from '../../platform/index.js';
import { type WebhookSecretRepo } from '../port.js';
import { loose } from './documents.js';

export const webhookSecretSchema = new Schema({ _id: String, tenant_id: { type: String, required: true }, kind: { type: String, required: true } }, loose);
webhookSecretSchema.index({ tenant_id: 1, kind: 1 }, { unique: true });

export function webhookSecretRepo(model: Model<WebhookSecretRecord & { _id: string }>): WebhookSecretRepo {
  const strip = ({ _id, ...rest }: WebhookSecretRecord & { _id: string }) => rest as WebhookSecretRecord;
  return {
    async put(r) {
      await model.collection.replaceOne({ _id: `${r.tenant_id}:${r.kind}` } as never, { ...r }, { upsert: true });
    },
    async list(tenantId) {
      const rows = await model.find({ tenant_id: tenantId }).sort({ kind: 1 }).lean<(WebhookSecretRecord & { _id: string })[]>();
      return rows.map(strip);
    },
    async delete(tenantId, kind) {
      return (await model.deleteOne({ _id: `${tenantId}:${kind}` })).deletedCount === 1;
    },
  };
}
