// Runs: a JSON document per row, with the columns the lists, stats and the reconciler filter on.
import type { Run } from '../records.js';
import { decodeCursor, toPage, type RunRepo, type RunStats } from '../port.js';
import { TOP, type Db } from './db.js';

export function runRepo(db: Db): RunRepo {
  const insert = db.prepare(
    'INSERT INTO runs (id, tenant_id, kind, status, automation_id, session_id, created_at, finished_at, duration_ms, doc) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)',
  );
  const get = db.prepare<[string, string], { doc: string }>('SELECT doc FROM runs WHERE tenant_id = ? AND id = ?');
  const write = db.prepare('UPDATE runs SET status = ?, finished_at = ?, duration_ms = ?, doc = ? WHERE tenant_id = ? AND id = ?');
  const byAutomation = db.prepare<[string, string, string, number], { doc: string }>(
    'SELECT doc FROM runs WHERE tenant_id = ? AND automation_id = ? AND id < ? ORDER BY id DESC LIMIT ?',
  );
  const bySession = db.prepare<[string, string, string, number], { doc: string }>(
    'SELECT doc FROM runs WHERE tenant_id = ? AND session_id = ? AND id < ? ORDER BY id DESC LIMIT ?',
  );
  const counts = db.prepare<[string, string], { status: string; n: number }>(
    'SELECT status, COUNT(*) AS n FROM runs WHERE tenant_id = ? AND automation_id = ? GROUP BY status',
  );
  const durationsOfAutomation = db.prepare<[string, string, number], { duration_ms: number }>(
    'SELECT duration_ms FROM runs WHERE tenant_id = ? AND automation_id = ? AND duration_ms IS NOT NULL ORDER BY id DESC LIMIT ?',
  );
  const latestOfAutomation = db.prepare<[string, string], { doc: string }>(
    'SELECT doc FROM runs WHERE tenant_id = ? AND automation_id = ? ORDER BY id DESC LIMIT 1',
  );
  const durationsOfKind = db.prepare<[string, string, number], { duration_ms: number }>(
    'SELECT duration_ms FROM runs WHERE tenant_id = ? AND kind = ? AND finished_at IS NOT NULL AND duration_ms IS NOT NULL ORDER BY finished_at DESC LIMIT ?',
  );
  const stale = db.prepare<[string, string, number], { doc: string }>('SELECT doc FROM runs WHERE status = ? AND created_at < ? ORDER BY created_at LIMIT ?');
  const byKindStatus = db.prepare<[], { kind: Run['kind']; status: Run['status']; count: number }>(
    'SELECT kind, status, COUNT(*) AS count FROM runs GROUP BY kind, status',
  );
  const read = (row: { doc: string } | undefined): Run | null => (row ? (JSON.parse(row.doc) as Run) : null);

  const update = db.transaction((tenantId: string, id: string, changes: Partial<Run>, ifStatusIn: string[]) => {
    const current = read(get.get(tenantId, id));
    if (!current || !ifStatusIn.includes(current.status)) return null;
    const next: Run = { ...current, ...changes, id: current.id, tenant_id: current.tenant_id, kind: current.kind, created_at: current.created_at };
    write.run(next.status, next.finished_at, next.duration_ms, JSON.stringify(next), tenantId, id);
    return next;
  });

  return {
    async insert(r) {
      insert.run(r.id, r.tenant_id, r.kind, r.status, r.automation_id, r.session_id, r.created_at, r.finished_at, r.duration_ms, JSON.stringify(r));
    },
    async get(tenantId, id) {
      return read(get.get(tenantId, id));
    },
    async update(tenantId, id, changes, ifStatusIn) {
      return update.immediate(tenantId, id, changes, ifStatusIn);
    },
    async listByAutomation(tenantId, automationId, q) {
      const rows = byAutomation.all(tenantId, automationId, decodeCursor(q.cursor) ?? TOP, q.limit + 1);
      return toPage(
        rows.map((r) => read(r)!),
        q.limit,
      );
    },
    async listBySession(tenantId, sessionId, q) {
      const rows = bySession.all(tenantId, sessionId, decodeCursor(q.cursor) ?? TOP, q.limit + 1);
      return toPage(
        rows.map((r) => read(r)!),
        q.limit,
      );
    },
    async automationStats(tenantId, automationId, recent): Promise<RunStats> {
      const byStatus: RunStats['counts'] = {};
      for (const row of counts.all(tenantId, automationId)) byStatus[row.status as Run['status']] = row.n;
      return {
        counts: byStatus,
        durations_ms: durationsOfAutomation.all(tenantId, automationId, recent).map((r) => r.duration_ms),
        last: read(latestOfAutomation.get(tenantId, automationId)),
      };
    },
    async recentDurations(tenantId, kind, limit) {
      return durationsOfKind.all(tenantId, kind, limit).map((r) => r.duration_ms);
    },
    async listStale(status, createdBefore, limit) {
      return stale.all(status, createdBefore, limit).map((r) => read(r)!);
    },
    async countByKindAndStatus() {
      return byKindStatus.all();
    },
  };
}
