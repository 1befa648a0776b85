// The evidence ledger: `_id` is tenant and seq, so two writers that chain to the same head cannot both
// insert; the loser keeps what it wrote, reads the new head and builds the rest on it. Payloads are kept
// once per tenant and digest.
import { Schema, type Model } from 'mongoose';
import type { LedgerEntry } from '../../platform/index.js';
import type { EvidenceRepo, LedgerHead } from '../port.js';
import { isDuplicateKey, loose } from './documents.js';

type StoredEntry = LedgerEntry & { _id: string };
type StoredPayload = { _id: string; tenant_id: string; digest: string; body: string };

export const ledgerSchema = new Schema({ _id: String, tenant_id: { type: String, required: true }, seq: Number, at: String }, loose);
ledgerSchema.index({ tenant_id: 1, seq: 1 });
ledgerSchema.index({ tenant_id: 1, at: 1 });
// a report's entry by its id: only entries that name a report are indexed
ledgerSchema.index(
  { tenant_id: 1, 'subject.report_id': 1, seq: 1 },
  { name: 'ledger_by_report', partialFilterExpression: { 'subject.report_id': { $type: 'string' } } },
);
// a gate run's entries by its id (its seal's): only entries that name a gate run are indexed
ledgerSchema.index(
  { tenant_id: 1, 'subject.gate_run_id': 1, seq: 1 },
  { name: 'ledger_by_gate_run', partialFilterExpression: { 'subject.gate_run_id': { $type: 'string' } } },
);
export const ledgerPayloadSchema = new Schema({ _id: String, tenant_id: String, digest: String }, loose);

const APPEND_TRIES = 20;

const strip = ({ _id, ...entry }: StoredEntry & { __v?: number }): LedgerEntry => {
  delete (entry as { __v?: number }).__v;
  return entry;
};

export function evidenceRepo(ledger: Model<StoredEntry>, payloads: Model<StoredPayload>): EvidenceRepo {
  const head = async (tenantId: string) => {
    const last = await ledger.findOne({ tenant_id: tenantId }).sort({ seq: -1 }).lean<StoredEntry>();
    return last ? strip(last) : null;
  };
  return {
    async append(tenantId, build, kept) {
      // what this call has written so far: a part of the chain that stays; the rest is built on the new head
      const written: LedgerEntry[] = [];
      for (let i = 1; ; i++) {
        const last = await head(tenantId);
        const entries = build(last ? ({ seq: last.seq, hash: last.hash, at: last.at, key_id: last.key_id } satisfies LedgerHead) : null, written.length);
        // the payloads once the first build took the head (one that refuses it, a key the ledger does not know,
        // leaves none behind, as SQLite's transaction does), and before any entry that names them
        if (i === 1 && kept.length)
          await payloads.bulkWrite(
            kept.map((p) => ({
              updateOne: {
                filter: { _id: `${tenantId}:${p.digest}` },
                update: { $setOnInsert: { tenant_id: tenantId, digest: p.digest, body: p.body } },
                upsert: true,
              },
            })),
          );
        // payloads alone (a gate's artifacts): the driver refuses an empty batch
        if (!entries.length) return written;
        try {
          await ledger.collection.insertMany(entries.map((e) => ({ _id: `${tenantId}:${e.seq}`, ...e })) as never[], { ordered: true });
          return [...written, ...entries];
        } catch (err) {
          // another writer took the next seq: ours up to it are in (ordered inserts stop at the first refusal)
          if (!isDuplicateKey(err) || i >= APPEND_TRIES) throw err;
          const inserted = (err as { result?: { insertedCount?: number } }).result?.insertedCount ?? 0;
          written.push(...entries.slice(0, inserted));
        }
      }
    },
    head,
    async list(tenantId, q) {
      const rows = await ledger
        .find({ tenant_id: tenantId, seq: { $gt: q.afterSeq ?? 0 }, ...(q.since ? { at: { $gte: q.since } } : {}) })
        .sort({ seq: 1 })
        .limit(q.limit)
        .lean<StoredEntry[]>();
      return rows.map(strip);
    },
    async payloads(tenantId, digests) {
      const rows = await payloads.find({ _id: { $in: [...new Set(digests)].map((d) => `${tenantId}:${d}`) } }).lean<StoredPayload[]>();
      return rows.map((r) => ({ digest: r.digest, body: r.body }));
    },
    async firstOfReport(tenantId, kind, reportId) {
      const first = await ledger.findOne({ tenant_id: tenantId, 'subject.report_id': reportId, kind }).sort({ seq: 1 }).lean<StoredEntry>();
      return first ? strip(first) : null;
    },
    async ofGateRun(tenantId, gateRunId) {
      const rows = await ledger.find({ tenant_id: tenantId, 'subject.gate_run_id': gateRunId }).sort({ seq: 1 }).lean<StoredEntry[]>();
      return rows.map(strip);
    },
  };
}
