import { Schema, type Model } from 'mongoose';
import type { Automation } from '../../platform/index.js';
import { decodeCursor, toPage, type AutomationRepo } from '../port.js';
import { definedOnly, fromStored, loose, toStored, type Stored } from './documents.js';

export const automationSchema = new Schema({ _id: String, tenant_id: { type: String, required: true }, status: { type: String, required: true } }, loose);
automationSchema.index({ tenant_id: 1, _id: -1 });
automationSchema.index({ tenant_id: 1, status: 1, _id: -1 });

export function automationRepo(model: Model<Stored<Automation>>): AutomationRepo {
  return {
    async insert(a) {
      await model.collection.insertOne(toStored(a) as never);
    },
    async get(tenantId, id) {
      return fromStored(await model.findOne({ _id: id, tenant_id: tenantId }).lean<Stored<Automation>>());
    },
    async list(tenantId, q) {
      const after = decodeCursor(q.cursor);
      const filter: Record<string, unknown> = { tenant_id: tenantId, status: q.statuses ? { $in: q.statuses } : { $ne: 'archived' } };
      if (after) filter._id = { $lt: after };
      const rows = await model
        .find(filter)
        .sort({ _id: -1 })
        .limit(q.limit + 1)
        .lean<Stored<Automation>[]>();
      return toPage(
        rows.map((r) => fromStored(r)!),
        q.limit,
      );
    },
    async update(tenantId, id, changes, ifStatusIn) {
      const updated = await model
        .findOneAndUpdate({ _id: id, tenant_id: tenantId, status: { $in: ifStatusIn } }, { $set: definedOnly(changes) }, { returnDocument: 'after' })
        .lean<Stored<Automation>>();
      return fromStored(updated);
    },
    async listEnabledWithTrigger(type, tenantId) {
      const filter: Record<string, unknown> = { status: 'enabled', 'triggers.type': type, ...(tenantId === undefined ? {} : { tenant_id: tenantId }) };
      const rows = await model.find(filter).sort({ _id: 1 }).lean<Stored<Automation>[]>();
      return rows.map((r) => fromStored(r)!);
    },
  };
}
