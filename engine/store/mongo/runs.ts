import { Schema, type Model } from 'mongoose';
import type { Run } from '../records.js';
import { decodeCursor, toPage, type RunRepo, type RunStats } from '../port.js';
import { definedOnly, fromStored, loose, toStored, type Stored } from './documents.js';

export const runSchema = new Schema(
  {
    _id: String,
    tenant_id: { type: String, required: true },
    kind: String,
    status: String,
    automation_id: String,
    session_id: String,
    created_at: String,
    finished_at: String,
  },
  loose,
);
runSchema.index({ tenant_id: 1, automation_id: 1, _id: -1 });
runSchema.index({ tenant_id: 1, session_id: 1, _id: -1 });
runSchema.index({ tenant_id: 1, kind: 1, finished_at: -1 });
runSchema.index({ status: 1, created_at: 1 });

export function runRepo(model: Model<Stored<Run>>): RunRepo {
  const page = async (filter: Record<string, unknown>, q: { limit: number; cursor?: string }) => {
    const after = decodeCursor(q.cursor);
    if (after) filter._id = { $lt: after };
    const rows = await model
      .find(filter)
      .sort({ _id: -1 })
      .limit(q.limit + 1)
      .lean<Stored<Run>[]>();
    return toPage(
      rows.map((r) => fromStored(r)!),
      q.limit,
    );
  };
  return {
    async insert(r) {
      await model.collection.insertOne(toStored(r) as never);
    },
    async get(tenantId, id) {
      return fromStored(await model.findOne({ _id: id, tenant_id: tenantId }).lean<Stored<Run>>());
    },
    async update(tenantId, id, changes, ifStatusIn) {
      const updated = await model
        .findOneAndUpdate({ _id: id, tenant_id: tenantId, status: { $in: ifStatusIn } }, { $set: definedOnly(changes) }, { returnDocument: 'after' })
        .lean<Stored<Run>>();
      return fromStored(updated);
    },
    listByAutomation: (tenantId, automationId, q) => page({ tenant_id: tenantId, automation_id: automationId }, q),
    listBySession: (tenantId, sessionId, q) => page({ tenant_id: tenantId, session_id: sessionId }, q),
    async automationStats(tenantId, automationId, recent): Promise<RunStats> {
      const grouped = await model.aggregate<{ _id: Run['status']; n: number }>([
        { $match: { tenant_id: tenantId, automation_id: automationId } },
        { $group: { _id: '$status', n: { $sum: 1 } } },
      ]);
      const durations = await model
        .find({ tenant_id: tenantId, automation_id: automationId, duration_ms: { $ne: null } }, { duration_ms: 1 })
        .sort({ _id: -1 })
        .limit(recent)
        .lean<{ duration_ms: number }[]>();
      const last = await model.findOne({ tenant_id: tenantId, automation_id: automationId }).sort({ _id: -1 }).lean<Stored<Run>>();
      return { counts: Object.fromEntries(grouped.map((g) => [g._id, g.n])), durations_ms: durations.map((d) => d.duration_ms), last: fromStored(last) };
    },
    async recentDurations(tenantId, kind, limit) {
      const rows = await model
        .find({ tenant_id: tenantId, kind, finished_at: { $ne: null }, duration_ms: { $ne: null } }, { duration_ms: 1 })
        .sort({ finished_at: -1 })
        .limit(limit)
        .lean<{ duration_ms: number }[]>();
      return rows.map((r) => r.duration_ms);
    },
    async countByKindAndStatus() {
      const rows = await model.aggregate<{ _id: { kind: Run['kind']; status: Run['status'] }; count: number }>([
        { $group: { _id: { kind: '$kind', status: '$status' }, count: { $sum: 1 } } },
      ]);
      return rows.map((r) => ({ kind: r._id.kind, status: r._id.status, count: r.count }));
    },
    async listStale(status, createdBefore, limit) {
      const rows = await model
        .find({ status, created_at: { $lt: createdBefore } })
        .sort({ created_at: 1 })
        .limit(limit)
        .lean<Stored<Run>[]>();
      return rows.map((r) => fromStored(r)!);
    },
  };
}
