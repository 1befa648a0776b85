// Gate runs and their results; `_id` of a result is tenant, run and gate, so it is kept once.
import { Schema, type Model } from 'mongoose';
import type { GateResult, GateRunRecord } from '../../platform/index.js';
import type { GateRunRepo } from '../port.js';
import { definedOnly, fromStored, loose, pageOf, toStored, type Stored } from './documents.js';

type StoredResult = { _id: string; tenant_id: string; gate_run_id: string; gate_id: string; workspace: string; finished_at: string; result: GateResult };

export const gateRunSchema = new Schema({ _id: String, tenant_id: { type: String, required: true }, workspace: String, status: String }, loose);
gateRunSchema.index({ tenant_id: 1, workspace: 1, _id: -1 });
gateRunSchema.index({ tenant_id: 1, _id: -1 });
gateRunSchema.index({ status: 1, created_at: 1, _id: 1 });
export const gateResultSchema = new Schema(
  { _id: String, tenant_id: String, gate_run_id: String, gate_id: String, workspace: String, finished_at: String },
  loose,
);
// each gate's latest result (latestResults) read in the index's order, ties on finished_at by gate run as in SQLite
gateResultSchema.index({ tenant_id: 1, workspace: 1, gate_id: 1, finished_at: -1, gate_run_id: -1 });
gateResultSchema.index({ tenant_id: 1, gate_run_id: 1 });

/** A gate's results read at a time while looking for its latest of a sealed gate run (the first page nearly always holds it). */
const LATEST_PAGE = 20;

export function gateRunRepo(runs: Model<Stored<GateRunRecord>>, results: Model<StoredResult>): GateRunRepo {
  return {
    async insert(r) {
      await runs.collection.insertOne(toStored(r) as never);
    },
    async get(tenantId, id) {
      return fromStored(await runs.findOne({ _id: id, tenant_id: tenantId }).lean<Stored<GateRunRecord>>());
    },
    async update(tenantId, id, changes, ifStatusIn) {
      const { id: _, tenant_id: __, ...rest } = changes;
      const updated = await runs
        .findOneAndUpdate({ _id: id, tenant_id: tenantId, status: { $in: ifStatusIn } }, { $set: definedOnly(rest) }, { returnDocument: 'after' })
        .lean<Stored<GateRunRecord>>();
      return fromStored(updated);
    },
    list(tenantId, q) {
      return pageOf(runs, { tenant_id: tenantId, ...(q.workspace ? { workspace: q.workspace } : {}) }, q);
    },
    async putResult(tenantId, gateRunId, r) {
      await results.updateOne(
        { _id: `${tenantId}:${gateRunId}:${r.gate_id}` },
        {
          $setOnInsert: {
            tenant_id: tenantId,
            gate_run_id: gateRunId,
            gate_id: r.gate_id,
            workspace: r.subject.workspace,
            finished_at: r.finished_at,
            result: r,
          },
        },
        { upsert: true },
      );
    },
    async results(tenantId, gateRunId) {
      // sorted in memory: a gate run has a result per gate, a handful
      return (await results.find({ tenant_id: tenantId, gate_run_id: gateRunId }).sort({ gate_id: 1 }).lean<StoredResult[]>()).map((r) => r.result);
    },
    async listRunning(createdBefore, limit, after) {
      const page = after ? { $or: [{ created_at: { $gt: after.created_at } }, { created_at: after.created_at, _id: { $gt: after.id } }] } : {};
      const rows = await runs
        .find({ status: 'running', created_at: { $lt: createdBefore }, ...page })
        .sort({ created_at: 1, _id: 1 })
        .limit(limit)
        .lean<Stored<GateRunRecord>[]>();
      return rows.map((r) => fromStored(r)!);
    },
    async latestResults(tenantId, workspace) {
      // each gate's latest result of a sealed gate run (a result is kept as its gate ends, and one of a gate run
      // canceled later, or still running, was read as the gate's latest though no seal holds it): a gate's
      // results newest first, a page at a time, each page's gate runs looked up at once, as SQLite walks its index
      const gateIds = ((await results.distinct('gate_id', { tenant_id: tenantId, workspace })) as string[]).sort();
      const latest: { gate_run_id: string; result: GateResult }[] = [];
      for (const gateId of gateIds) {
        for (let skip = 0; ; skip += LATEST_PAGE) {
          const page = await results
            .find({ tenant_id: tenantId, workspace, gate_id: gateId, 'result.definition_digest': { $ne: '' } })
            .sort({ finished_at: -1, gate_run_id: -1 })
            .skip(skip)
            .limit(LATEST_PAGE)
            .lean<StoredResult[]>();
          const sealed = new Set(
            (
              await runs
                .find({ tenant_id: tenantId, _id: { $in: page.map((r) => r.gate_run_id) }, status: { $in: ['succeeded', 'failed'] } }, { _id: 1 })
                .lean<{ _id: string }[]>()
            ).map((r) => r._id),
          );
          const first = page.find((r) => sealed.has(r.gate_run_id));
          if (first) latest.push({ gate_run_id: first.gate_run_id, result: first.result });
          if (first || page.length < LATEST_PAGE) break;
        }
      }
      return latest;
    },
    async runningOf(tenantId, workspace) {
      const rows = await runs.find({ tenant_id: tenantId, workspace, status: 'running' }).sort({ _id: -1 }).lean<Stored<GateRunRecord>[]>();
      return rows.map((r) => fromStored(r)!);
    },
  };
}
