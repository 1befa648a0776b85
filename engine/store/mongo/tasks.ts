// The tasks of multi-agent sessions; `_id` is tenant, session and the task's own id.
import { Schema, type Model } from 'mongoose';
import type { TaskRecord, TaskStatus } from '../../platform/index.js';
import { SUMMARY_QUESTION_MAX, type TaskRepo } from '../port.js';
import { definedOnly, isDuplicateKey, loose } from './documents.js';
import { sessionScope, type Leases } from './leases.js';

type StoredTask = Omit<TaskRecord, 'id'> & { _id: string; task_id: string };

export const taskSchema = new Schema({ _id: String, tenant_id: { type: String, required: true }, session_id: String, task_id: String, status: String }, loose);
// each ends with the task id, as the lists sort (created_at, task_id): the index gives the order, no sort in memory
taskSchema.index({ tenant_id: 1, session_id: 1, created_at: 1, task_id: 1 });
taskSchema.index({ status: 1, updated_at: 1, _id: 1 });
// a session's tasks in a status (the waiting ones a message may answer), without reading the rest
taskSchema.index({ tenant_id: 1, session_id: 1, status: 1, created_at: 1, task_id: 1 });

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

type StoredSession = { _id: string; tenant_id: string; status: string; outcome: string | null; updated_at: string };

/** `sessions`: the sessions' collection, whose status a batch `whileLive` is inserted under, and whose outcome one `reopenAt` clears. */
/** A waiting task's question cut to SUMMARY_QUESTION_MAX characters, as SQLite cuts it (TaskRepo.listSummaries). */
function cutQuestion(t: TaskRecord): TaskRecord {
  const output = t.output as { input_required?: { question?: unknown } } | null | undefined;
  const question = output?.input_required?.question;
  if (typeof question !== 'string' || question.length <= SUMMARY_QUESTION_MAX || [...question].length <= SUMMARY_QUESTION_MAX) return t;
  const input_required = { ...output!.input_required, question: [...question].slice(0, SUMMARY_QUESTION_MAX).join(''), question_truncated: true };
  return { ...t, output: { ...output, input_required } as TaskRecord['output'] };
}

export function taskRepo(model: Model<StoredTask>, leases: Leases, sessions: Model<StoredSession>): TaskRepo {
  // a replica set would make this one transaction; ordered inserts stop at the first failure, and what
  // they stored before it is taken back, so the batch is all or none
  const insertAll = async (tasks: TaskRecord[]) => {
    const docs = tasks.map(toStored);
    try {
      await model.collection.insertMany(docs as never[], { ordered: true });
      return 'inserted' as const;
    } catch (err) {
      const taken = isDuplicateKey(err);
      // refused by a taken id, the driver names the documents stored before it; any other failure may have
      // stored any part of the batch (a connection lost on the way): each of its documents, by id and time, so
      // that a task of another batch with the same id is not one of them
      const before = taken ? Object.values((err as { insertedIds?: Record<number, string> }).insertedIds ?? {}) : [];
      const stored = taken ? { _id: { $in: before } } : { $or: docs.map((d) => ({ _id: d._id, created_at: d.created_at })) };
      // a take-back that fails leaves what it could not take back: the insert's failure is the answer
      if (!taken || before.length)
        await model.deleteMany(stored).catch(() => {
          throw err;
        });
      if (!taken) throw err;
      return 'id-taken' as const;
    }
  };
  return {
    async insertMany(tasks, cap) {
      const first = tasks[0];
      if (!first) return 'inserted';
      if (!cap) return insertAll(tasks);
      const keys = tasks.map((t) => keyOf(t.tenant_id, t.session_id, t.id));
      // a session that had ended has work again: its outcome goes in one conditional write just after the insert
      // (its status, which pending tasks do not move, stays; an archived one keeps the outcome its archive gave).
      // Without a transaction a reader may see the tasks and the outcome for that round trip. A write that fails
      // leaves the outcome to the caller's recount: the tasks are stored, and the insert answers so
      const reopen = async (at: string) => {
        const cleared = await sessions
          .updateOne(
            { _id: first.session_id, tenant_id: first.tenant_id, status: { $ne: 'archived' }, outcome: { $ne: null } },
            { $set: { outcome: null, updated_at: at } },
          )
          .catch(() => null);
        return cleared?.modifiedCount ? ('reopened' as const) : ('inserted' as const);
      };
      // under the session's lease its capped batches take turns, as in SQLite's IMMEDIATE transaction (with each
      // other and with its agents' inserts), and are refused in its order: the cap, then a taken id (or one named
      // twice). Checked before the insert, a taken id stores no part of the batch, not for a moment
      return leases.insertHeld<'archived' | 'over-cap' | 'id-taken' | 'reopened'>(
        sessionScope(first.tenant_id, first.session_id),
        async () => {
          const [archived, held, taken] = await Promise.all([
            cap.whileLive ? sessions.exists({ _id: first.session_id, tenant_id: first.tenant_id, status: 'archived' }).read('primary') : null,
            model.countDocuments({ tenant_id: first.tenant_id, session_id: first.session_id }).read('primary'),
            model.exists({ _id: { $in: keys } }).read('primary'),
          ]);
          if (archived) return 'archived';
          if (held + tasks.length > cap.maxHeld) return 'over-cap';
          if (taken || new Set(keys).size < keys.length) return 'id-taken';
          tasks.forEach((t, i) => (t.position = held + 1 + i));
          return null;
        },
        async () => {
          const inserted = await insertAll(tasks);
          return inserted === 'inserted' && cap.reopenAt ? reopen(cap.reopenAt) : inserted;
        },
      );
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
    async listIn(tenantId, sessionId, status) {
      const rows = await model.find({ tenant_id: tenantId, session_id: sessionId, status }).sort({ created_at: 1, task_id: 1 }).lean<StoredTask[]>();
      return rows.map((r) => fromStored(r)!);
    },
    async listSummaries(tenantId, sessionId) {
      const rows = await model
        .find({ tenant_id: tenantId, session_id: sessionId }, { 'output.result': 0, 'output.steps': 0 })
        .sort({ created_at: 1, task_id: 1 })
        .lean<StoredTask[]>();
      return rows.map((r) => cutQuestion(fromStored(r)!));
    },
    async listBriefs(tenantId, sessionId) {
      // the output stays in MongoDB: it is most of a task that has run
      const rows = await model.find({ tenant_id: tenantId, session_id: sessionId }, { output: 0 }).sort({ created_at: 1, task_id: 1 }).lean<StoredTask[]>();
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
