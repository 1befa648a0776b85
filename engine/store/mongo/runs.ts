import { Schema, type Model } from 'mongoose';
import { TERMINAL_RUN_STATUSES, type AgentTurn, type Run, type Session, type StepRecord } from '../../platform/index.js';
import { RAN_THROUGH_STATUSES, type IdempotencyKeyRepo, type RunQuery, type RunRepo, type RunStats } from '../port.js';
import { definedOnly, fromStored, isDuplicateKey, loose, pageOf, toStored, type Stored } from './documents.js';

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
// the reconciler's keyset pages (created_at, then id) read the index in order, no sort in memory
runSchema.index({ status: 1, created_at: 1, _id: 1 });
runSchema.index({ tenant_id: 1, _id: -1 });
runSchema.index({ tenant_id: 1, status: 1, _id: -1 });
// a page of one kind of the tenant's runs without walking the others (as SQLite's runs_by_tenant_kind)
runSchema.index({ tenant_id: 1, kind: 1, _id: -1 });

/** A step record or an agent turn of one attempt: `_id` is run, attempt and index. */
type AttemptRow<T> = { _id: string; tenant_id: string; run_id: string; attempt: number; idx: number; doc: T };

export const runStepSchema = new Schema({ _id: String, tenant_id: String, run_id: String, attempt: Number, idx: Number, doc: Object }, loose);
runStepSchema.index({ run_id: 1, attempt: 1, idx: 1 });
export const runTurnSchema = runStepSchema.clone();

const rowId = (runId: string, attempt: number, idx: number) => `${runId}:${attempt}:${idx}`;
/** tries of the step records that go with a run's change, once the change has applied */
const STEP_WRITE_TRIES = 4;
/** how long the metrics' counts of runs by kind and status are answered from the last count */
const COUNTS_FRESH_MS = 10_000;

/** `keys`: where a new run's Idempotency-Key is taken, before the run is stored (MongoDB has no transaction here). */
export function runRepo(
  model: Model<Stored<Run>>,
  stepModel: Model<AttemptRow<StepRecord>>,
  turnModel: Model<AttemptRow<AgentTurn>>,
  keys: IdempotencyKeyRepo,
  sessionModel: Model<Stored<Session>>,
): RunRepo {
  let counted: { at: number; rows: { kind: Run['kind']; status: Run['status']; count: number }[] } | undefined;
  const page = (filter: Record<string, unknown>, q: { limit: number; cursor?: string }) => pageOf(model, filter, q);
  return {
    async insert(r, key) {
      const held = key ? await keys.claim(key.record, key.since, key.pendingSince) : null;
      if (held) return held;
      try {
        await model.collection.insertOne(toStored(r) as never);
      } catch (err) {
        // a failure that may have stored the run all the same: the run is taken back, then the key let go (if
        // the run cannot be taken back, its record stays: a claim sees the run and answers it). A process
        // that dies here leaves a record that a later claim takes over once the claim's lifetime is past.
        if (key && !isDuplicateKey(err)) {
          const gone = await model
            .deleteOne({ _id: r.id, tenant_id: r.tenant_id })
            .then(() => true)
            .catch(() => false);
          if (gone) await keys.release(r.tenant_id, key.record.key_digest, r.id).catch(() => undefined);
        }
        throw err;
      }
      return null;
    },
    async get(tenantId, id) {
      return fromStored(await model.findOne({ _id: id, tenant_id: tenantId }).lean<Stored<Run>>());
    },
    async prune(idBefore, finishedBefore, limit) {
      // by _id, which sorts by the time a run was made; each run's rows and own session go after it
      const ended = await model
        .find(
          {
            _id: { $lt: idBefore },
            status: { $in: TERMINAL_RUN_STATUSES },
            finished_at: { $lt: finishedBefore },
            kind: { $ne: 'session_task' },
          },
          { _id: 1, tenant_id: 1, kind: 1, session_id: 1 },
        )
        .sort({ _id: 1 })
        .limit(limit)
        .lean<Pick<Stored<Run>, '_id' | 'tenant_id' | 'kind' | 'session_id'>[]>();
      if (!ended.length) return 0;
      const ids = ended.map((r) => r._id);
      await Promise.all([stepModel.deleteMany({ run_id: { $in: ids } }), turnModel.deleteMany({ run_id: { $in: ids } })]);
      await model.deleteMany({ _id: { $in: ids } });
      for (const r of ended)
        if (r.session_id && (r.kind === 'autonomy' || r.kind === 'vibe') && !(await model.exists({ tenant_id: r.tenant_id, session_id: r.session_id })))
          await sessionModel.deleteOne({ _id: r.session_id, tenant_id: r.tenant_id, kind: { $in: ['autonomy', 'vibe'] } });
      return ended.length;
    },
    async update(tenantId, id, changes, guard, steps = []) {
      const filter: Record<string, unknown> = { _id: id, tenant_id: tenantId, status: { $in: guard.status } };
      if (guard.attempt !== undefined) filter.attempt = guard.attempt;
      if (guard.uncanceled) filter.cancel_requested_at = null;
      // two writes (one transaction would need a replica set): the steps of the attempt the guard names go first,
      // so that a transition that applied never stands without them (a process that died between the two, or a
      // store that failed the second, ended a run with its last steps missing); written for a transition that
      // then does not apply, they are that attempt's own records all the same (keyed by run, attempt and index)
      if (steps.length && guard.attempt !== undefined) await this.putSteps(tenantId, id, guard.attempt, steps);
      const updated = fromStored(await model.findOneAndUpdate(filter, { $set: definedOnly(changes) }, { returnDocument: 'after' }).lean<Stored<Run>>());
      // an attempt the guard does not name is known once the change applied: its steps are tried a few more
      // times then rather than failing a transition that stands
      if (updated && steps.length && guard.attempt === undefined) {
        for (let i = 1; ; i++) {
          try {
            await this.putSteps(tenantId, id, updated.attempt, steps);
            break;
          } catch (err) {
            if (i >= STEP_WRITE_TRIES) throw err;
            await new Promise((r) => setTimeout(r, 200 * 2 ** i));
          }
        }
      }
      return updated;
    },
    async putSteps(tenantId, runId, attempt, steps) {
      if (!steps.length) return;
      await stepModel.bulkWrite(
        steps.map((s) => ({
          replaceOne: {
            filter: { _id: rowId(runId, attempt, s.index) },
            replacement: { _id: rowId(runId, attempt, s.index), tenant_id: tenantId, run_id: runId, attempt, idx: s.index, doc: s },
            upsert: true,
          },
        })),
      );
    },
    async steps(tenantId, runId, attempt) {
      const rows = await stepModel.find({ run_id: runId, attempt, tenant_id: tenantId }).sort({ idx: 1 }).lean<AttemptRow<StepRecord>[]>();
      return rows.map((r) => r.doc);
    },
    async appendTurn(tenantId, runId, attempt, turn) {
      const _id = rowId(runId, attempt, turn.index);
      await turnModel.replaceOne({ _id }, { _id, tenant_id: tenantId, run_id: runId, attempt, idx: turn.index, doc: turn }, { upsert: true });
    },
    async turns(tenantId, runId, attempt) {
      const rows = await turnModel.find({ run_id: runId, attempt, tenant_id: tenantId }).sort({ idx: 1 }).lean<AttemptRow<AgentTurn>[]>();
      return rows.map((r) => r.doc);
    },
    list: (tenantId, q: RunQuery) =>
      page(
        {
          tenant_id: tenantId,
          ...(q.kind ? { kind: q.kind } : {}),
          ...(q.status ? { status: q.status } : {}),
          ...(q.automation_id ? { automation_id: q.automation_id } : {}),
          ...(q.session_id ? { session_id: q.session_id } : {}),
        },
        q,
      ),
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
      // only runs that started and ran to an end of their own (port.ts)
      const ran = { status: { $in: RAN_THROUGH_STATUSES }, started_at: { $ne: null } };
      const rows = await model
        .find({ tenant_id: tenantId, kind, finished_at: { $ne: null }, duration_ms: { $ne: null }, ...ran }, { duration_ms: 1 })
        .sort({ finished_at: -1 })
        .limit(limit)
        .lean<{ duration_ms: number }[]>();
      return rows.map((r) => r.duration_ms);
    },
    async countByKindAndStatus() {
      // a scan of every run: a scrape within COUNTS_FRESH_MS of the last one is answered from it
      if (counted && Date.now() - counted.at < COUNTS_FRESH_MS) return counted.rows;
      const rows = await model.aggregate<{ _id: { kind: Run['kind']; status: Run['status'] }; count: number }>([
        { $group: { _id: { kind: '$kind', status: '$status' }, count: { $sum: 1 } } },
      ]);
      counted = { at: Date.now(), rows: rows.map((r) => ({ kind: r._id.kind, status: r._id.status, count: r.count })) };
      return counted.rows;
    },
    async listStale(status, createdBefore, limit, after) {
      const rows = await model
        .find({
          status,
          created_at: { $lt: createdBefore },
          ...(after ? { $or: [{ created_at: { $gt: after.created_at } }, { created_at: after.created_at, _id: { $gt: after.id } }] } : {}),
        })
        .sort({ created_at: 1, _id: 1 })
        .limit(limit)
        .lean<Stored<Run>[]>();
      return rows.map((r) => fromStored(r)!);
    },
    async statusOf(tenantId, ids) {
      if (!ids.length) return [];
      const rows = await model
        .find({ _id: { $in: ids }, tenant_id: tenantId }, { status: 1, finished_at: 1 })
        .lean<{ _id: string; status: Run['status']; finished_at?: string | null }[]>();
      return rows.map((r) => ({ id: r._id, status: r.status, finished_at: r.finished_at ?? null }));
    },
  };
}
