// Sessions, their agents and their message log. A message's seq comes from a counter document per
// session, incremented atomically, so concurrent writers never share one.
import { Schema, type Model } from 'mongoose';
import type { AgentRecord, MessageRecord, Session } from '../../platform/index.js';
import type { AgentRepo, MessageRepo, SessionRepo } from '../port.js';
import { memberOperators } from '../members.js';
import { definedOnly, fromStored, isDuplicateKey, loose, pageOf, toStored, type Stored } from './documents.js';

export const sessionSchema = new Schema({ _id: String, tenant_id: { type: String, required: true }, kind: String, status: String }, loose);
sessionSchema.index({ tenant_id: 1, _id: -1 });
sessionSchema.index({ tenant_id: 1, status: 1, _id: -1 });
// a tenant's multi-agent sessions (GET /sessions?kind=multi_agent), apart from the many its runs make
sessionSchema.index({ tenant_id: 1, kind: 1, _id: -1 }, { name: 'sessions_multi_agent', partialFilterExpression: { kind: 'multi_agent' } });
sessionSchema.index({ status: 1, updated_at: 1, _id: 1 });

export const agentSchema = new Schema({ _id: String, tenant_id: { type: String, required: true }, session_id: String }, loose);
agentSchema.index({ tenant_id: 1, session_id: 1, _id: 1 });

export const messageSchema = new Schema({ _id: String, tenant_id: { type: String, required: true }, session_id: String, seq: Number }, loose);
messageSchema.index({ session_id: 1, seq: 1 }, { unique: true });

export function sessionRepo(model: Model<Stored<Session>>): SessionRepo {
  return {
    async insert(s) {
      await model.collection.insertOne(toStored(s) as never);
    },
    async get(tenantId, id) {
      return fromStored(await model.findOne({ _id: id, tenant_id: tenantId }).lean<Stored<Session>>());
    },
    list: (tenantId, q) => pageOf(model, { tenant_id: tenantId, status: q.status ?? { $ne: 'archived' }, ...(q.kind ? { kind: q.kind } : {}) }, q),
    async update(tenantId, id, changes, ifStatusIn, ifOutcome) {
      const outcome = ifOutcome === undefined ? {} : { outcome: ifOutcome };
      const updated = await model
        .findOneAndUpdate(
          { _id: id, tenant_id: tenantId, status: { $in: ifStatusIn }, ...outcome },
          { $set: definedOnly(changes) },
          { returnDocument: 'after' },
        )
        .lean<Stored<Session>>();
      return fromStored(updated);
    },
    async listStale(status, updatedBefore, limit, after) {
      const page = after ? { $or: [{ updated_at: { $gt: after.updated_at } }, { updated_at: after.updated_at, _id: { $gt: after.id } }] } : {};
      const rows = await model
        .find({ kind: 'multi_agent', status, updated_at: { $lt: updatedBefore }, ...page })
        .sort({ updated_at: 1, _id: 1 })
        .limit(limit)
        .lean<Stored<Session>[]>();
      return rows.map((r) => fromStored(r)!);
    },
  };
}

type SessionModel = Model<Stored<Session>>;

/**
 * Whether a session is archived, read from the primary just before a write of its agents or messages. Without
 * a transaction (no replica set assumed) an archive may still land between the read and the write, a window
 * of one round trip where SQLite's IMMEDIATE transaction has none.
 */
const isArchived = async (sessions: SessionModel, tenantId: string, sessionId: string) =>
  Boolean(await sessions.exists({ _id: sessionId, tenant_id: tenantId, status: 'archived' }).read('primary'));

export function agentRepo(model: Model<Stored<AgentRecord>>, sessions: SessionModel): AgentRepo {
  return {
    // the count read just before the insert: two inserts at once may both pass it (no transaction assumed)
    async insert(a, cap) {
      if (await isArchived(sessions, a.tenant_id, a.session_id)) return 'archived';
      if (cap && (await model.countDocuments({ tenant_id: a.tenant_id, session_id: a.session_id }).read('primary')) >= cap.maxHeld) return 'over-cap';
      await model.collection.insertOne(toStored(a) as never);
      return 'inserted';
    },
    async get(tenantId, sessionId, id) {
      return fromStored(await model.findOne({ _id: id, tenant_id: tenantId, session_id: sessionId }).lean<Stored<AgentRecord>>());
    },
    async list(tenantId, sessionId) {
      const rows = await model.find({ tenant_id: tenantId, session_id: sessionId }).sort({ _id: 1 }).lean<Stored<AgentRecord>[]>();
      return rows.map((r) => fromStored(r)!);
    },
    async update(tenantId, sessionId, id, changes, members) {
      if (await isArchived(sessions, tenantId, sessionId)) return null;
      const { $set, ...unset } = memberOperators(members);
      const updated = await model
        .findOneAndUpdate(
          { _id: id, tenant_id: tenantId, session_id: sessionId },
          { $set: { ...definedOnly(changes), ...$set }, ...unset },
          { returnDocument: 'after' },
        )
        .lean<Stored<AgentRecord>>();
      return fromStored(updated);
    },
  };
}

/** tries of a message's append that another append beat to its seq */
const APPEND_TRIES = 50;

export function messageRepo(model: Model<Stored<MessageRecord>>, sessions: SessionModel): MessageRepo {
  return {
    // seq is the last visible one plus one, taken again when another append took it first (the unique
    // (session_id, seq) index): a message is visible before any later seq is, so a reader that has seen N
    // never misses a message N-1 that appears after it (a counter's seq, inserted in a second write, could)
    async append(m) {
      if (await isArchived(sessions, m.tenant_id, m.session_id)) return null;
      for (let i = 1; ; i++) {
        const last = await model.findOne({ session_id: m.session_id }, { seq: 1 }).sort({ seq: -1 }).lean<{ seq: number }>();
        const record: MessageRecord = { ...m, seq: (last?.seq ?? 0) + 1 };
        try {
          await model.collection.insertOne(toStored(record) as never);
          return record;
        } catch (err) {
          if (!isDuplicateKey(err) || i >= APPEND_TRIES) throw err;
        }
      }
    },
    async list(tenantId, sessionId, q) {
      const rows = await model
        .find({ tenant_id: tenantId, session_id: sessionId, seq: { $gt: q.afterSeq ?? 0 } })
        .sort({ seq: 1 })
        .limit(q.limit)
        .lean<Stored<MessageRecord>[]>();
      return rows.map((r) => fromStored(r)!);
    },
    async lastSeq(tenantId, sessionId) {
      const last = await model.findOne({ tenant_id: tenantId, session_id: sessionId }).sort({ seq: -1 }).select({ seq: 1 }).lean<{ seq: number }>();
      return last?.seq ?? 0;
    },
    async get(tenantId, sessionId, id) {
      return fromStored(await model.findOne({ _id: id, tenant_id: tenantId, session_id: sessionId }).lean<Stored<MessageRecord>>());
    },
  };
}
