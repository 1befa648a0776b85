import { Schema, type Model } from 'mongoose';
import type { NotificationDelivery, NotificationEndpoint } from '../../platform/index.js';
import { decodeCursor, toPage, type NotificationDeliveryRepo, type NotificationEndpointRepo } from '../port.js';
import { fromStored, insertOneOrNone, isDuplicateKey, loose, toStored, type Stored } from './documents.js';
import type { Leases } from './leases.js';

export const notificationEndpointSchema = new Schema({ _id: String, tenant_id: { type: String, required: true } }, loose);
notificationEndpointSchema.index({ tenant_id: 1, _id: 1 });

export const notificationDeliverySchema = new Schema(
  { _id: String, tenant_id: { type: String, required: true }, endpoint_id: { type: String, required: true } },
  loose,
);
notificationDeliverySchema.index({ tenant_id: 1, endpoint_id: 1, _id: -1 });
notificationDeliverySchema.index({ status: 1, updated_at: 1, _id: 1 });

export function notificationEndpointRepo(
  model: Model<Stored<NotificationEndpoint>>,
  leases: Leases,
  deliveries: Model<Stored<NotificationDelivery>>,
): NotificationEndpointRepo {
  return {
    async insert(e, cap) {
      const insert = () => insertOneOrNone(model, e);
      if (!cap) return insert();
      // counted and inserted under the tenant's lease: its capped inserts take turns, as in SQLite's IMMEDIATE transaction
      return leases.insertHeld(
        `notification-endpoints:${e.tenant_id}`,
        async () => ((await model.countDocuments({ tenant_id: e.tenant_id }).read('primary')) >= cap.maxHeld ? 'over-cap' : null),
        insert,
      );
    },
    async get(tenantId, id) {
      return fromStored(await model.findOne({ _id: id, tenant_id: tenantId }).lean<Stored<NotificationEndpoint>>());
    },
    async list(tenantId) {
      const rows = await model.find({ tenant_id: tenantId }).sort({ _id: 1 }).lean<Stored<NotificationEndpoint>[]>();
      return rows.map((r) => fromStored(r)!);
    },
    async update(tenantId, id, changes) {
      return fromStored(
        await model.findOneAndUpdate({ _id: id, tenant_id: tenantId }, { $set: changes }, { returnDocument: 'after' }).lean<Stored<NotificationEndpoint>>(),
      );
    },
    async addFailure(tenantId, id, at) {
      return fromStored(
        await model
          .findOneAndUpdate({ _id: id, tenant_id: tenantId }, { $inc: { consecutive_failures: 1 }, $set: { updated_at: at } }, { returnDocument: 'after' })
          .lean<Stored<NotificationEndpoint>>(),
      );
    },
    async resetFailures(tenantId, id) {
      await model.updateOne({ _id: id, tenant_id: tenantId, consecutive_failures: { $gt: 0 } }, { $set: { consecutive_failures: 0 } });
    },
    async rotateSecret(tenantId, id, expected, changes) {
      return fromStored(
        await model
          .findOneAndUpdate(
            { _id: id, tenant_id: tenantId, 'sealed_secret.ct': expected.ct, 'sealed_secret.iv': expected.iv },
            { $set: changes },
            { returnDocument: 'after' },
          )
          .lean<Stored<NotificationEndpoint>>(),
      );
    },
    async disable(tenantId, id, reason, at) {
      return fromStored(
        await model
          .findOneAndUpdate(
            { _id: id, tenant_id: tenantId, status: 'enabled' },
            { $set: { status: 'disabled', disabled_reason: reason, updated_at: at } },
            { returnDocument: 'after' },
          )
          .lean<Stored<NotificationEndpoint>>(),
      );
    },
    async delete(tenantId, id) {
      if ((await model.deleteOne({ _id: id, tenant_id: tenantId })).deletedCount !== 1) return false;
      // its deliveries right after (no transaction here): none is left behind with its event's payload
      await deliveries.deleteMany({ tenant_id: tenantId, endpoint_id: id });
      return true;
    },
  };
}

export function notificationDeliveryRepo(model: Model<Stored<NotificationDelivery>>): NotificationDeliveryRepo {
  return {
    async insert(d) {
      await model.collection.insertOne(toStored(d) as never).catch((err: unknown) => {
        if (!isDuplicateKey(err)) throw err;
      });
    },
    async get(tenantId, id) {
      return fromStored(await model.findOne({ _id: id, tenant_id: tenantId }).lean<Stored<NotificationDelivery>>());
    },
    async list(tenantId, endpointId, q) {
      const after = decodeCursor(q.cursor, 'notification-deliveries');
      const rows = await model
        .find({ tenant_id: tenantId, endpoint_id: endpointId, ...(after ? { _id: { $lt: after } } : {}) })
        .sort({ _id: -1 })
        .limit(q.limit + 1)
        .lean<Stored<NotificationDelivery>[]>();
      return toPage(
        rows.map((r) => fromStored(r)!),
        q.limit,
        'notification-deliveries',
      );
    },
    async update(tenantId, id, changes, when) {
      const condition = when ? { replays: when.replays, status: { $in: when.status } } : {};
      return fromStored(
        await model
          .findOneAndUpdate({ _id: id, tenant_id: tenantId, ...condition }, { $set: changes }, { returnDocument: 'after' })
          .lean<Stored<NotificationDelivery>>(),
      );
    },
    async listStalePending(updatedBefore, limit, after) {
      const page = after ? { $or: [{ updated_at: { $gt: after.updated_at } }, { updated_at: after.updated_at, _id: { $gt: after.id } }] } : {};
      const rows = await model
        .find({ status: 'pending', updated_at: { $lt: updatedBefore }, ...page })
        .sort({ updated_at: 1, _id: 1 })
        .limit(limit)
        .lean<Stored<NotificationDelivery>[]>();
      return rows.map((r) => fromStored(r)!);
    },
    async prune(updatedBefore, limit) {
      const ended = { status: { $in: ['succeeded', 'failed'] as NotificationDelivery['status'][] }, updated_at: { $lt: updatedBefore } };
      const old = await model.find(ended, { _id: 1 }).limit(limit).lean<{ _id: string }[]>();
      if (!old.length) return 0;
      return (await model.deleteMany({ _id: { $in: old.map((d) => d._id) }, ...ended })).deletedCount;
    },
    async delete(tenantId, id) {
      return (await model.deleteOne({ _id: id, tenant_id: tenantId })).deletedCount === 1;
    },
  };
}
