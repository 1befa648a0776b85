import { Schema, type Model } from 'mongoose';
import type { DeliveryStatus, WebhookDelivery } from '../../platform/index.js';
import type { DeliveryRepo } from '../port.js';
import { definedOnly, fromStored, isDuplicateKey, loose, pageOf, toStored, type Stored } from './documents.js';

export const deliverySchema = new Schema(
  { _id: String, tenant_id: { type: String, required: true }, kind: String, status: String, provider_delivery_id: String, received_at: String },
  loose,
);
deliverySchema.index({ tenant_id: 1, _id: -1 });
deliverySchema.index({ tenant_id: 1, kind: 1, _id: -1 });
// status first: a tenant's status filter and the reconciler's scan of received deliveries share it
deliverySchema.index({ status: 1, tenant_id: 1, _id: -1 });
// a GitHub body signed once is a replay for good: found by its digest
deliverySchema.index({ tenant_id: 1, kind: 1, body_sha256: 1 });
// a request signed under an id the signature does not cover (ours) is a replay under any id: found by what was signed
deliverySchema.index({ tenant_id: 1, kind: 1, signed_sha256: 1 }, { partialFilterExpression: { signed_sha256: { $type: 'string' } } });
// the reconciler's scan of processed and failed deliveries whose body and event are past their retention
deliverySchema.index({ status: 1, payload_pruned_at: 1, received_at: 1 });
// refused requests past their week, oldest first (pruneRejected)
deliverySchema.index({ received_at: 1 }, { partialFilterExpression: { status: 'rejected' } });
deliverySchema.index(
  { tenant_id: 1, kind: 1, provider_delivery_id: 1 },
  { unique: true, partialFilterExpression: { provider_delivery_id: { $type: 'string' } } },
);

export function deliveryRepo(model: Model<Stored<WebhookDelivery>>): DeliveryRepo {
  return {
    async insert(d) {
      try {
        await model.collection.insertOne(toStored(d) as never);
        return null;
      } catch (err) {
        if (!isDuplicateKey(err) || d.provider_delivery_id === null) throw err;
        const found = await model
          .findOne({ tenant_id: d.tenant_id, kind: d.kind, provider_delivery_id: d.provider_delivery_id })
          .lean<Stored<WebhookDelivery>>();
        return fromStored(found);
      }
    },
    async get(tenantId, id) {
      return fromStored(await model.findOne({ _id: id, tenant_id: tenantId }).lean<Stored<WebhookDelivery>>());
    },
    // summaries: the server leaves the body and the event (up to 1 MB each) out
    list: (tenantId, q) =>
      pageOf(model, { tenant_id: tenantId, ...(q.kind ? { kind: q.kind } : {}), ...(q.status ? { status: q.status } : {}) }, q, ['body', 'event_payload']),
    async update(tenantId, id, changes, ifStatusIn) {
      const updated = await model
        .findOneAndUpdate({ _id: id, tenant_id: tenantId, status: { $in: ifStatusIn } }, { $set: definedOnly(changes) }, { returnDocument: 'after' })
        .lean<Stored<WebhookDelivery>>();
      return fromStored(updated);
    },
    async addAttempt(tenantId, id, ifStatusIn) {
      const updated = await model
        .findOneAndUpdate(
          { _id: id, tenant_id: tenantId, status: { $in: ifStatusIn }, payload_pruned_at: null },
          { $inc: { attempts: 1 } },
          { returnDocument: 'after' },
        )
        .lean<Stored<WebhookDelivery>>();
      return fromStored(updated);
    },
    async releaseAttempt(tenantId, id, attempt) {
      const released = await model.updateOne({ _id: id, tenant_id: tenantId, attempts: attempt }, { $inc: { attempts: -1 } });
      return released.modifiedCount === 1;
    },
    async addRuns(tenantId, id, runs, changes, ifStatusIn) {
      const updated = await model
        .findOneAndUpdate(
          { _id: id, tenant_id: tenantId, status: { $in: ifStatusIn } },
          { $push: { runs: { $each: runs } }, $set: definedOnly(changes) },
          { returnDocument: 'after' },
        )
        .lean<Stored<WebhookDelivery>>();
      return fromStored(updated);
    },
    async pruneRejected(before, limit) {
      const old = await model
        .find({ status: 'rejected', received_at: { $lt: before } }, { _id: 1 })
        .sort({ received_at: 1 })
        .limit(limit)
        .lean<{ _id: string }[]>();
      if (!old.length) return 0;
      return (await model.deleteMany({ _id: { $in: old.map((d) => d._id) }, status: 'rejected' })).deletedCount;
    },
    async prunePayloads(before, prunedAt, limit) {
      // payload_pruned_at: null matches the records that have none
      const kept = { status: { $in: ['processed', 'failed'] as DeliveryStatus[] }, payload_pruned_at: null };
      const old = await model
        .find({ ...kept, received_at: { $lt: before } }, { _id: 1 })
        .sort({ received_at: 1 })
        .limit(limit)
        .lean<{ _id: string }[]>();
      if (!old.length) return 0;
      const done = await model.updateMany(
        { _id: { $in: old.map((d) => d._id) }, ...kept },
        { $set: { body: null, event_payload: null, payload_pruned_at: prunedAt } },
      );
      return done.modifiedCount;
    },
    async findByBody(tenantId, kind, bodySha256) {
      return fromStored(
        await model.findOne({ tenant_id: tenantId, kind, body_sha256: bodySha256, status: { $ne: 'rejected' } }).lean<Stored<WebhookDelivery>>(),
      );
    },
    async findBySigned(tenantId, kind, signedSha256) {
      return fromStored(
        await model.findOne({ tenant_id: tenantId, kind, signed_sha256: signedSha256, status: { $ne: 'rejected' } }).lean<Stored<WebhookDelivery>>(),
      );
    },
    async listStale(status, receivedBefore, limit, after) {
      const page = after ? { $or: [{ received_at: { $gt: after.received_at } }, { received_at: after.received_at, _id: { $gt: after.id } }] } : {};
      const rows = await model
        .find({ status, received_at: { $lt: receivedBefore }, ...page })
        .sort({ received_at: 1, _id: 1 })
        .limit(limit)
        .lean<Stored<WebhookDelivery>[]>();
      return rows.map((r) => fromStored(r)!);
    },
  };
}
