// The evidence ledger: entries keyed by tenant and seq, appended in the group commit's IMMEDIATE
// transaction that reads the head and writes what follows it, so two writers never chain to the same head.
import type { LedgerEntry } from '../../platform/index.js';
import type { EvidenceRepo, LedgerHead } from '../port.js';
import { groupCommit, type Db } from './db.js';

export function evidenceRepo(db: Db): EvidenceRepo {
  const headRow = db.prepare<[string], { doc: string }>('SELECT doc FROM ledger WHERE tenant_id = ? ORDER BY seq DESC LIMIT 1');
  // what an append chains to (LedgerHead), without reading the head's whole document
  const headLink = db.prepare<[string], NonNullable<LedgerHead>>(
    "SELECT seq, json_extract(doc, '$.hash') AS hash, at, json_extract(doc, '$.key_id') AS key_id FROM ledger WHERE tenant_id = ? ORDER BY seq DESC LIMIT 1",
  );
  const insert = db.prepare('INSERT INTO ledger (tenant_id, seq, at, doc) VALUES (?, ?, ?, ?)');
  const keep = db.prepare('INSERT OR IGNORE INTO ledger_payloads (tenant_id, digest, body) VALUES (?, ?, ?)');
  const list = db.prepare<[string, number, string, number], { doc: string }>(
    'SELECT doc FROM ledger WHERE tenant_id = ? AND seq > ? AND at >= ? ORDER BY seq LIMIT ?',
  );
  const payload = db.prepare<[string, string], { digest: string; body: string }>('SELECT digest, body FROM ledger_payloads WHERE tenant_id = ? AND digest = ?');
  // by ledger_by_report, whose entries are only those that name a report: without statistics SQLite took the
  // primary key instead and walked the tenant's whole ledger (15 ms at 20,000 entries)
  const ofReport = db.prepare<[string, string, string], { doc: string }>(
    "SELECT doc FROM ledger INDEXED BY ledger_by_report WHERE tenant_id = ? AND json_extract(doc, '$.subject.report_id') = ? AND json_extract(doc, '$.kind') = ? ORDER BY seq LIMIT 1",
  );
  // by ledger_by_gate_run, whose entries are only those that name a gate run (named, as above)
  const ofGateRun = db.prepare<[string, string], { doc: string }>(
    "SELECT doc FROM ledger INDEXED BY ledger_by_gate_run WHERE tenant_id = ? AND json_extract(doc, '$.subject.gate_run_id') = ? ORDER BY seq",
  );
  const commit = groupCommit(db);
  const append = (tenantId: string, build: (head: LedgerHead, from: number) => LedgerEntry[], payloads: { digest: string; body: string }[]) => {
    const entries = build(headLink.get(tenantId) ?? null, 0);
    for (const p of payloads) keep.run(tenantId, p.digest, p.body);
    for (const e of entries) insert.run(tenantId, e.seq, e.at, JSON.stringify(e));
    return entries;
  };
  return {
    async append(tenantId, build, payloads) {
      return commit(() => append(tenantId, build, payloads));
    },
    async head(tenantId) {
      const row = headRow.get(tenantId);
      return row ? (JSON.parse(row.doc) as LedgerEntry) : null;
    },
    async list(tenantId, q) {
      return list.all(tenantId, q.afterSeq ?? 0, q.since ?? '', q.limit).map((r) => JSON.parse(r.doc) as LedgerEntry);
    },
    async payloads(tenantId, digests) {
      return [...new Set(digests)].map((d) => payload.get(tenantId, d)).filter((p) => p !== undefined);
    },
    async firstOfReport(tenantId, kind, reportId) {
      const row = ofReport.get(tenantId, reportId, kind);
      return row ? (JSON.parse(row.doc) as LedgerEntry) : null;
    },
    async ofGateRun(tenantId, gateRunId) {
      return ofGateRun.all(tenantId, gateRunId).map((r) => JSON.parse(r.doc) as LedgerEntry);
    },
  };
}
