// The evidence ledger: `_id` is tenant and seq, so two writers that chain to the same head cannot both
// insert; the loser reads the new head and builds again. Payloads are kept once per tenant and digest.
import { Schema, type Model } from 'mongoose';
import type { LedgerEntry } from '../../platform/index.js';
import type { EvidenceRepo, LedgerHead } from '../port.js';
import { loose } from './documents.js';

type StoredEntry = LedgerEntry & { _id: string };
type StoredPayload = { _id: string; tenant_id: string; digest: string; body: string };

export const ledgerSchema = new Schema({ _id: String, tenant_id: { type: String, required: true }, seq: Number, at: String }, loose);
ledgerSchema.index({ tenant_id: 1, seq: 1 });
ledgerSchema.index({ tenant_id: 1, at: 1 });
export const ledgerPayloadSchema = new Schema({ _id: String, tenant_id: String, digest: String }, loose);

const DUPLICATE_KEY = 11000;
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
      if (kept.length)
        await payloads.bulkWrite(
          kept.map((p) => ({
            updateOne: {
              filter: { _id: `${tenantId}:${p.digest}` },
              update: { $setOnInsert: { tenant_id: tenantId, digest: p.digest, body: p.body } },
              upsert: true,
            },
          })),
        );
      for (let i = 1; ; i++) {
        const last = await head(tenantId);
        const entries = build(last ? ({ seq: last.seq, hash: last.hash } satisfies LedgerHead) : null);
        try {
          await ledger.collection.insertMany(entries.map((e) => ({ _id: `${tenantId}:${e.seq}`, ...e })) as never[], { ordered: true });
          return entries;
        } catch (err) {
          // another writer took this head; a partial batch of ours is removed before building again
          if ((err as { code?: number }).code !== DUPLICATE_KEY || i >= APPEND_TRIES) throw err;
          const inserted = (err as { result?: { insertedCount?: number } }).result?.insertedCount ?? 0;
          if (inserted) await ledger.deleteMany({ _id: { $in: entries.slice(0, inserted).map((e) => `${tenantId}:${e.seq}`) } });
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
  };
}
