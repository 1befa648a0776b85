// Sessions, their agents and their message log. A message's seq comes from a counter document per
// session, incremented atomically, so concurrent writers never share one.
import { Schema, type Model } from 'mongoose';
import { ServiceUnavailableError, type AgentRecord, type MessageRecord, type Session } from '../../platform/index.js';
import type { AgentRepo, MessageRepo, SessionRepo } from '../port.js';
import { memberOperators } from '../members.js';
import { definedOnly, fromStored, insertOneOrNone, isDuplicateKey, loose, pageOf, toStored, type Stored } from './documents.js';
import { sessionScope, type Leases } from './leases.js';

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

/** The collections of what a session holds (other repositories' own), which its prune deletes with it. */
export type SessionRows = Record<'runs' | 'runSteps' | 'runTurns' | 'agents' | 'messages' | 'tasks' | 'leases', Model<{ _id: string }>>;

export function sessionRepo(model: Model<Stored<Session>>, rows: SessionRows): SessionRepo {
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
    async pruneArchived(updatedBefore, limit) {
      const old = await model
        .find({ kind: 'multi_agent', status: 'archived', outcome: { $ne: null }, updated_at: { $lt: updatedBefore } }, { _id: 1, tenant_id: 1 })
        .sort({ updated_at: 1 })
        // more than asked for: one with a run still live is passed over, and must not hold the rest back
        .limit(limit + 20)
        .lean<{ _id: string; tenant_id: string }[]>();
      let pruned = 0;
      for (const { _id: sessionId, tenant_id: tenantId } of old) {
        if (pruned === limit) break;
        const of = { tenant_id: tenantId, session_id: sessionId };
        if (await rows.runs.exists({ ...of, status: { $in: ['queued', 'running'] } })) continue;
        const runIds = (await rows.runs.find(of, { _id: 1 }).lean<{ _id: string }[]>()).map((r) => r._id);
        await Promise.all([rows.runSteps.deleteMany({ run_id: { $in: runIds } }), rows.runTurns.deleteMany({ run_id: { $in: runIds } })]);
        await rows.runs.deleteMany(of);
        await Promise.all([
          rows.messages.deleteMany(of),
          rows.agents.deleteMany(of),
          rows.tasks.deleteMany(of),
          rows.leases.deleteOne({ _id: sessionScope(tenantId, sessionId) }),
        ]);
        // the session last: a prune cut off on the way leaves it to be found again
        await model.deleteOne({ _id: sessionId, tenant_id: tenantId, status: 'archived' });
        pruned++;
      }
      return pruned;
    },
  };
}

type SessionModel = Model<Stored<Session>>;

/**
 * Whether a session is archived, read from the primary (a secondary behind it could miss the archive). Read
 * just before a write of its agents or messages, it refuses most writes into an archived session before they
 * are seen; without a transaction (no replica set assumed) an archive may still land between it and the
 * write, which `whileLive` catches after the write.
 */
const isArchived = async (sessions: SessionModel, tenantId: string, sessionId: string) =>
  Boolean(await sessions.exists({ _id: sessionId, tenant_id: tenantId, status: 'archived' }).read('primary'));

/**
 * `write`, then whether the session is archived now: an archive that landed before the write is seen here, and
 * the write is taken back (null), so nothing stays written past an archive, which is never undone. SQLite's
 * IMMEDIATE transaction has no such step: here a reader may see the write for the round trip before it is
 * taken back, and a write just before the archive is taken back too (its caller is told the session is
 * archived, as when the archive came first). A read that fails takes the write back as well, and throws; a
 * take-back that fails throws, and leaves the write.
 */
async function whileLive<T>(
  sessions: SessionModel,
  tenantId: string,
  sessionId: string,
  write: () => Promise<T>,
  takeBack: () => Promise<unknown>,
): Promise<T | null> {
  const written = await write();
  const archived = await isArchived(sessions, tenantId, sessionId).catch(async (err: unknown) => {
    await takeBack().catch(() => undefined);
    throw err;
  });
  if (!archived) return written;
  await takeBack();
  return null;
}

export function agentRepo(model: Model<Stored<AgentRecord>>, sessions: SessionModel, leases: Leases): AgentRepo {
  const insertLive = async (a: AgentRecord) => {
    const inserted = await whileLive(
      sessions,
      a.tenant_id,
      a.session_id,
      () => insertOneOrNone(model, a),
      () => model.deleteOne({ _id: a.id, tenant_id: a.tenant_id }),
    );
    return inserted ?? 'archived';
  };
  return {
    async insert(a, cap) {
      if (!cap) return (await isArchived(sessions, a.tenant_id, a.session_id)) ? 'archived' : insertLive(a);
      // counted and inserted under the session's lease, which its task batches take too: its capped inserts take
      // turns, as in SQLite's IMMEDIATE transaction, and are refused in its order: the archive, then the cap
      return leases.insertHeld<'archived' | 'over-cap'>(
        sessionScope(a.tenant_id, a.session_id),
        async () => {
          const [archived, held] = await Promise.all([
            isArchived(sessions, a.tenant_id, a.session_id),
            model.countDocuments({ tenant_id: a.tenant_id, session_id: a.session_id }).read('primary'),
          ]);
          if (archived) return 'archived';
          return held >= cap.maxHeld ? 'over-cap' : null;
        },
        () => insertLive(a),
      );
    },
    async get(tenantId, sessionId, id) {
      return fromStored(await model.findOne({ _id: id, tenant_id: tenantId, session_id: sessionId }).lean<Stored<AgentRecord>>());
    },
    async list(tenantId, sessionId) {
      const rows = await model.find({ tenant_id: tenantId, session_id: sessionId }).sort({ _id: 1 }).lean<Stored<AgentRecord>[]>();
      return rows.map((r) => fromStored(r)!);
    },
    // checked before the write only: an update cannot be taken back as an insert can (what it replaced, written
    // back, could undo another update that stands), so an archive may still land between the check and the write
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
    // never misses a message N-1 that appears after it (a counter's seq, inserted in a second write, could).
    // One taken back because the session was archived by then (`whileLive`) leaves its seq unused: an append
    // after it that was written and checked before the archive keeps the seq after it
    async append(m) {
      if (await isArchived(sessions, m.tenant_id, m.session_id)) return null;
      const insert = async () => {
        for (let i = 1; ; i++) {
          const last = await model.findOne({ session_id: m.session_id }, { seq: 1 }).sort({ seq: -1 }).lean<{ seq: number }>();
          const record: MessageRecord = { ...m, seq: (last?.seq ?? 0) + 1 };
          try {
            await model.collection.insertOne(toStored(record) as never);
            return record;
          } catch (err) {
            if (!isDuplicateKey(err)) throw err;
            // beaten that often: a crowd of appends to one session, told to come back, not a raw duplicate key (500)
            if (i >= APPEND_TRIES)
              throw new ServiceUnavailableError(`too many messages appended to session ${m.session_id} at once: try again`, 1, { cause: err });
            // past a few, apart a little (a random wait), so that the crowd's retries stop meeting at the same seq
            if (i >= 5) await new Promise((r) => setTimeout(r, Math.random() * 5 * i));
          }
        }
      };
      return whileLive(sessions, m.tenant_id, m.session_id, insert, () => model.deleteOne({ _id: m.id, tenant_id: m.tenant_id }));
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
