// Gate runs and their results. The latest result of each gate of a workspace (of a sealed gate run) is one indexed query.
import type { GateResult, GateRunRecord } from '../../platform/index.js';
import { decodeCursor, toPage, type GateRunRepo } from '../port.js';
import { groupCommit, type Db } from './db.js';

export function gateRunRepo(db: Db): GateRunRepo {
  const insert = db.prepare('INSERT INTO gate_runs (id, tenant_id, workspace, status, doc) VALUES (?, ?, ?, ?, ?)');
  const get = db.prepare<[string, string], { doc: string }>('SELECT doc FROM gate_runs WHERE tenant_id = ? AND id = ?');
  const write = db.prepare('UPDATE gate_runs SET status = ?, doc = ? WHERE tenant_id = ? AND id = ?');
  const list = db.prepare<[string, string, number], { doc: string }>('SELECT doc FROM gate_runs WHERE tenant_id = ? AND id < ? ORDER BY id DESC LIMIT ?');
  // a statement of its own: `workspace = coalesce(?, workspace)` kept SQLite off the workspace's index, and a
  // page of a small workspace walked every gate run of its tenant (24 ms at 10,000 in another workspace)
  const listOfWorkspace = db.prepare<[string, string, string, number], { doc: string }>(
    'SELECT doc FROM gate_runs WHERE tenant_id = ? AND workspace = ? AND id < ? ORDER BY id DESC LIMIT ?',
  );
  const putResult = db.prepare('INSERT OR IGNORE INTO gate_results (tenant_id, gate_run_id, gate_id, workspace, finished_at, doc) VALUES (?, ?, ?, ?, ?, ?)');
  const results = db.prepare<[string, string], { doc: string }>('SELECT doc FROM gate_results WHERE tenant_id = ? AND gate_run_id = ?');
  // one seek per gate, not a walk of every result the workspace ever had (a GROUP BY read them all: 137 ms at
  // 10,000 gate runs of 5 gates): the gate ids come one after another from the index (the next one above the
  // last), and each gate's latest result is the top of its own range of the index, by finished_at, among the
  // results of sealed gate runs (each looked up by its key): a result is kept as its gate ends, and one of a
  // gate run canceled later, or still running, was read as the gate's latest, though no seal holds it. A gate
  // its run did not run (HEAD moved, the gate left the set) has a stand-in result, with no digests: not a latest
  const latest = db.prepare<[{ tenant: string; workspace: string }], { gate_run_id: string; doc: string }>(
    `WITH RECURSIVE gate (id) AS (
       SELECT MIN(gate_id) FROM gate_results WHERE tenant_id = @tenant AND workspace = @workspace
       UNION ALL
       SELECT (SELECT MIN(gate_id) FROM gate_results WHERE tenant_id = @tenant AND workspace = @workspace AND gate_id > gate.id) FROM gate WHERE gate.id IS NOT NULL
     )
     SELECT r.gate_run_id, r.doc FROM gate JOIN gate_results AS r ON r.tenant_id = @tenant AND r.gate_id = gate.id AND r.gate_run_id = (
       SELECT x.gate_run_id FROM gate_results AS x
       WHERE x.tenant_id = @tenant AND x.workspace = @workspace AND x.gate_id = gate.id
         AND json_extract(x.doc, '$.definition_digest') <> ''
         AND EXISTS (SELECT 1 FROM gate_runs AS g WHERE g.id = x.gate_run_id AND g.tenant_id = @tenant AND g.status IN ('succeeded', 'failed'))
       ORDER BY x.finished_at DESC, x.gate_run_id DESC LIMIT 1
     ) ORDER BY gate.id`,
  );
  // by the index of running runs (few), not by the workspace's (every run it ever had)
  const runningOf = db.prepare<[string, string], { doc: string }>(
    "SELECT doc FROM gate_runs INDEXED BY gate_runs_by_status WHERE status = 'running' AND tenant_id = ? AND workspace = ? ORDER BY id DESC",
  );
  const running = db.prepare<[string, string, string, number], { doc: string }>(
    `SELECT doc FROM gate_runs WHERE status = 'running' AND json_extract(doc, '$.created_at') < ? AND (json_extract(doc, '$.created_at'), id) > (?, ?)
     ORDER BY json_extract(doc, '$.created_at'), id LIMIT ?`,
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
      const before = decodeCursor(q.cursor, 'gate-runs') ?? '~';
      const rows = q.workspace === undefined ? list.all(tenantId, before, q.limit + 1) : listOfWorkspace.all(tenantId, q.workspace, before, q.limit + 1);
      return toPage(
        rows.map((r) => read(r)!),
        q.limit,
        'gate-runs',
      );
    },
    async putResult(tenantId, gateRunId, r) {
      await commit(() => putResult.run(tenantId, gateRunId, r.gate_id, r.subject.workspace, r.finished_at, JSON.stringify(r)));
    },
    async results(tenantId, gateRunId) {
      return results.all(tenantId, gateRunId).map((row) => JSON.parse(row.doc) as GateResult);
    },
    async listRunning(createdBefore, limit, after) {
      return running.all(createdBefore, after?.created_at ?? '', after?.id ?? '', limit).map((r) => read(r)!);
    },
    async latestResults(tenantId, workspace) {
      return latest.all({ tenant: tenantId, workspace }).map((row) => ({ gate_run_id: row.gate_run_id, result: JSON.parse(row.doc) as GateResult }));
    },
    async runningOf(tenantId, workspace) {
      return runningOf.all(tenantId, workspace).map((r) => read(r)!);
    },
  };
}
