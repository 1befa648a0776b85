// The tasks of multi-agent sessions; `_id` is tenant, session and the task's own id.
import { Schema, type Model } from 'mongoose';
import type { TaskRecord, TaskStatus } from '../../platform/index.js';
import type { TaskRepo } from '../port.js';
import { definedOnly, insertUnderCap, isDuplicateKey, loose } from './documents.js';

type StoredTask = Omit<TaskRecord, 'id'> & { _id: string; task_id: string };

export const taskSchema = new Schema({ _id: String, tenant_id: { type: String, required: true }, session_id: String, task_id: String, status: String }, loose);
taskSchema.index({ tenant_id: 1, session_id: 1, created_at: 1 });
taskSchema.index({ status: 1, updated_at: 1, _id: 1 });

const keyOf = (tenantId: string, sessionId: string, id: string) => `${tenantId}:${sessionId}:${id}`;
const toStored = (t: TaskRecord): StoredTask => {
  const { id, ...rest } = t;
  return { _id: keyOf(t.tenant_id, t.session_id, id), task_id: id, ...rest };
};
const fromStored = (d: StoredTask | null): TaskRecord | null => {
  if (!d) return null;
  const { _id, task_id, ...rest } = d as StoredTask & { __v?: number };
  delete (rest as { __v?: number }).__v;
  return { id: task_id, ...rest } as TaskRecord;
};

export function taskRepo(model: Model<StoredTask>): TaskRepo {
  // a replica set would make this one transaction; ordered inserts stop at the first failure, and
  // what they stored before it is taken back, so the batch is all or none
  const insertAll = async (tasks: TaskRecord[]) => {
    try {
      await model.collection.insertMany(tasks.map(toStored) as never[], { ordered: true });
      return 'inserted' as const;
    } catch (err) {
      const e = err as { insertedIds?: Record<number, string> };
      if (!isDuplicateKey(err)) throw err;
      const inserted = Object.values(e.insertedIds ?? {});
      if (inserted.length) await model.deleteMany({ _id: { $in: inserted } });
      return 'id-taken' as const;
    }
  };
  return {
    async insertMany(tasks, cap) {
      const first = tasks[0];
      if (!cap || !first) return insertAll(tasks);
      return insertUnderCap(tasks.length, cap.maxHeld, {
        insert: () => insertAll(tasks),
        count: () => model.countDocuments({ tenant_id: first.tenant_id, session_id: first.session_id }),
        remove: () => model.deleteMany({ _id: { $in: tasks.map((t) => keyOf(t.tenant_id, t.session_id, t.id)) } }),
      });
    },
    async get(tenantId, sessionId, id) {
      return fromStored(await model.findOne({ _id: keyOf(tenantId, sessionId, id) }).lean<StoredTask>());
    },
    async getMany(tenantId, sessionId, ids) {
      if (!ids.length) return [];
      const rows = await model
        .find({ _id: { $in: ids.map((id) => keyOf(tenantId, sessionId, id)) } })
        .sort({ created_at: 1, task_id: 1 })
        .lean<StoredTask[]>();
      return rows.map((r) => fromStored(r)!);
    },
    async list(tenantId, sessionId) {
      const rows = await model.find({ tenant_id: tenantId, session_id: sessionId }).sort({ created_at: 1, task_id: 1 }).lean<StoredTask[]>();
      return rows.map((r) => fromStored(r)!);
    },
    async update(tenantId, sessionId, id, changes, ifStatusIn) {
      const updated = await model
        .findOneAndUpdate({ _id: keyOf(tenantId, sessionId, id), status: { $in: ifStatusIn } }, { $set: definedOnly(changes) }, { returnDocument: 'after' })
        .lean<StoredTask>();
      return fromStored(updated);
    },
    async counts(tenantId, sessionId) {
      const rows = await model.aggregate<{ _id: TaskStatus; n: number }>([
        { $match: { tenant_id: tenantId, session_id: sessionId } },
        { $group: { _id: '$status', n: { $sum: 1 } } },
      ]);
      return Object.fromEntries(rows.map((r) => [r._id, r.n]));
    },
    async listStale(status, updatedBefore, limit, after) {
      const page = after
        ? {
            $or: [
              { updated_at: { $gt: after.updated_at } },
              { updated_at: after.updated_at, _id: { $gt: keyOf(after.tenant_id, after.session_id, after.id) } },
            ],
          }
        : {};
      const rows = await model
        .find({ status, updated_at: { $lt: updatedBefore }, ...page })
        .sort({ updated_at: 1, _id: 1 })
        .limit(limit)
        .lean<StoredTask[]>();
      return rows.map((r) => fromStored(r)!);
    },
  };
}
