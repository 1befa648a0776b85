// Gate runs and their results. The latest result of each gate of a workspace is one indexed query.
import type { GateResult, GateRunRecord } from '../../platform/index.js';
import { decodeCursor, toPage, type GateRunRepo } from '../port.js';
import { groupCommit, type Db } from './db.js';

export function gateRunRepo(db: Db): GateRunRepo {
  const insert = db.prepare('INSERT INTO gate_runs (id, tenant_id, workspace, status, doc) VALUES (?, ?, ?, ?, ?)');
  const get = db.prepare<[string, string], { doc: string }>('SELECT doc FROM gate_runs WHERE tenant_id = ? AND id = ?');
  const write = db.prepare('UPDATE gate_runs SET status = ?, doc = ? WHERE tenant_id = ? AND id = ?');
  const list = db.prepare<[string, string, string | null, number], { doc: string }>(
    'SELECT doc FROM gate_runs WHERE tenant_id = ? AND id < ? AND workspace = coalesce(?, workspace) ORDER BY id DESC LIMIT ?',
  );
  const putResult = db.prepare('INSERT OR IGNORE INTO gate_results (tenant_id, gate_run_id, gate_id, workspace, finished_at, doc) VALUES (?, ?, ?, ?, ?, ?)');
  const results = db.prepare<[string, string], { doc: string }>('SELECT doc FROM gate_results WHERE tenant_id = ? AND gate_run_id = ?');
  // SQLite takes the other columns of the row that holds the MAX
  const latest = db.prepare<[string, string], { gate_run_id: string; doc: string }>(
    'SELECT gate_run_id, doc, MAX(finished_at) FROM gate_results WHERE tenant_id = ? AND workspace = ? GROUP BY gate_id ORDER BY gate_id',
  );
  // by the index of running runs (few), not by the workspace's (every run it ever had)
  const runningOf = db.prepare<[string, string], { doc: string }>(
    "SELECT doc FROM gate_runs INDEXED BY gate_runs_by_status WHERE status = 'running' AND tenant_id = ? AND workspace = ? ORDER BY id DESC",
  );
  const running = db.prepare<[string, number], { doc: string }>(
    "SELECT doc FROM gate_runs WHERE status = 'running' AND json_extract(doc, '$.created_at') < ? ORDER BY json_extract(doc, '$.created_at') LIMIT ?",
  );
  const read = (row: { doc: string } | undefined) => (row ? (JSON.parse(row.doc) as GateRunRecord) : null);
  // writes go in the store's group commit: the writes of one turn of the event loop share a commit
  const commit = groupCommit(db);
  const update = (tenantId: string, id: string, changes: Partial<GateRunRecord>, ifStatusIn: string[]) => {
    const current = read(get.get(tenantId, id));
    if (!current || !ifStatusIn.includes(current.status)) return null;
    const next: GateRunRecord = { ...current, ...changes, id, tenant_id: tenantId };
    write.run(next.status, JSON.stringify(next), tenantId, id);
    return next;
  };
  return {
    async insert(r) {
      await commit(() => insert.run(r.id, r.tenant_id, r.workspace, r.status, JSON.stringify(r)));
    },
    async get(tenantId, id) {
      return read(get.get(tenantId, id));
    },
    async update(tenantId, id, changes, ifStatusIn) {
      return commit(() => update(tenantId, id, changes, ifStatusIn));
    },
    async list(tenantId, q) {
      // ids sort below '~' (they are ulids): no cursor starts from the top
      const rows = list.all(tenantId, decodeCursor(q.cursor) ?? '~', q.workspace ?? null, q.limit + 1);
      return toPage(
        rows.map((r) => read(r)!),
        q.limit,
      );
    },
    async putResult(tenantId, gateRunId, r) {
      await commit(() => putResult.run(tenantId, gateRunId, r.gate_id, r.subject.workspace, r.finished_at, JSON.stringify(r)));
    },
    async results(tenantId, gateRunId) {
      return results.all(tenantId, gateRunId).map((row) => JSON.parse(row.doc) as GateResult);
    },
    async listRunning(createdBefore, limit) {
      return running.all(createdBefore, limit).map((r) => read(r)!);
    },
    async latestResults(tenantId, workspace) {
      return latest.all(tenantId, workspace).map((row) => ({ gate_run_id: row.gate_run_id, result: JSON.parse(row.doc) as GateResult }));
    },
    async runningOf(tenantId, workspace) {
      return runningOf.all(tenantId, workspace).map((r) => read(r)!);
    },
  };
}
