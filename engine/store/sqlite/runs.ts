// Runs: a JSON document per row, with the columns the lists, stats and the reconciler filter on.
// Steps and agent turns are rows of their own, keyed by run, attempt and index.
import type { Statement } from 'better-sqlite3';
import { TERMINAL_RUN_STATUSES, type AgentTurn, type Run, type StepRecord } from '../../platform/index.js';
import { decodeCursor, RAN_THROUGH_STATUSES, toPage, type RunGuard, type RunQuery, type RunRepo, type RunStats, type RunStatusRow } from '../port.js';
import { groupCommit, TOP, type Db } from './db.js';
import { keyClaimer } from './idempotency-keys.js';

export function runRepo(db: Db): RunRepo {
  const insert = db.prepare(
    'INSERT INTO runs (id, tenant_id, kind, status, automation_id, session_id, created_at, finished_at, duration_ms, doc) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)',
  );
  const get = db.prepare<[string, string], { doc: string }>('SELECT doc FROM runs WHERE tenant_id = ? AND id = ?');
  const claimKey = keyClaimer(db);
  const putStep = db.prepare('INSERT OR REPLACE INTO run_steps (run_id, attempt, idx, tenant_id, doc) VALUES (?, ?, ?, ?, ?)');
  const stepsOf = db.prepare<[string, number, string], { doc: string }>(
    'SELECT doc FROM run_steps WHERE run_id = ? AND attempt = ? AND tenant_id = ? ORDER BY idx',
  );
  const putTurn = db.prepare('INSERT OR REPLACE INTO run_turns (run_id, attempt, idx, tenant_id, doc) VALUES (?, ?, ?, ?, ?)');
  const turnsOf = db.prepare<[string, number, string], { doc: string }>(
    'SELECT doc FROM run_turns WHERE run_id = ? AND attempt = ? AND tenant_id = ? ORDER BY idx',
  );
  // kept by triggers as runs are written (migrations.ts): no walk of the automation's runs
  const counts = db.prepare<[string, string], { status: string; n: number }>(
    'SELECT status, n FROM automation_run_counts WHERE tenant_id = ? AND automation_id = ? AND n > 0',
  );
  const durationsOfAutomation = db.prepare<[string, string, number], { duration_ms: number }>(
    'SELECT duration_ms FROM runs WHERE tenant_id = ? AND automation_id = ? AND duration_ms IS NOT NULL ORDER BY id DESC LIMIT ?',
  );
  const latestOfAutomation = db.prepare<[string, string], { doc: string }>(
    'SELECT doc FROM runs WHERE tenant_id = ? AND automation_id = ? ORDER BY id DESC LIMIT 1',
  );
  // only runs that started and ran to an end of their own (port.ts). The walk of the tenant's finished runs in the
  // index passes over the canceled ones: a burst of them newer than the last fifty that count costs about 1 ms a
  // thousand (20,000: 14-19 ms). The start, kept in the document alone, is read for rows of those statuses only.
  const durationsOfKind = db.prepare<[string, string, number], { duration_ms: number }>(
    `SELECT duration_ms FROM runs WHERE tenant_id = ? AND kind = ? AND finished_at IS NOT NULL AND duration_ms IS NOT NULL
       AND status IN (${RAN_THROUGH_STATUSES.map((s) => `'${s}'`).join(', ')}) AND doc ->> '$.started_at' IS NOT NULL
       ORDER BY finished_at DESC LIMIT ?`,
  );
  // the IN term is the index's own condition, word for word: SQLite uses a partial index only when the query says so
  const stale = db.prepare<[string, string, string, string, number], { doc: string }>(
    "SELECT doc FROM runs WHERE status IN ('queued', 'running') AND status = ? AND created_at < ? AND (created_at, id) > (?, ?) ORDER BY created_at, id LIMIT ?",
  );
  // kept by triggers as runs are written (migrations.ts): no scan of the runs
  const byKindStatus = db.prepare<[], { kind: Run['kind']; status: Run['status']; count: number }>(
    'SELECT kind, status, n AS count FROM run_counts WHERE n > 0',
  );
  const statuses = db.prepare<[string, string], RunStatusRow>(
    'SELECT id, status, finished_at FROM runs WHERE tenant_id = ? AND id IN (SELECT value FROM json_each(?))',
  );
  const read = (row: { doc: string } | undefined): Run | null => (row ? (JSON.parse(row.doc) as Run) : null);
  // by id (an id sorts by the time its run was made), in the index of the runs a prune may delete, whose condition
  // is said word for word: the runs it keeps (task runs, live runs) are not walked again at each pass
  const ended = db.prepare<[string, string, number], { id: string; tenant_id: string; kind: string; session_id: string | null }>(
    `SELECT id, tenant_id, kind, session_id FROM runs INDEXED BY runs_prunable WHERE finished_at IS NOT NULL AND kind <> 'session_task'
     AND id < ? AND status IN (${TERMINAL_RUN_STATUSES.map((st) => `'${st}'`).join(', ')}) AND finished_at < ? ORDER BY id LIMIT ?`,
  );
  const removeRun = db.prepare('DELETE FROM runs WHERE id = ?');
  const removeSteps = db.prepare('DELETE FROM run_steps WHERE run_id = ?');
  const removeTurns = db.prepare('DELETE FROM run_turns WHERE run_id = ?');
  // an autonomy or vibe run's own session, once no run of it is left
  const removeOwnSession = db.prepare(
    "DELETE FROM sessions WHERE tenant_id = ? AND id = ? AND kind IN ('autonomy', 'vibe') AND NOT EXISTS (SELECT 1 FROM runs WHERE tenant_id = ? AND session_id = ?)",
  );

  // one prepared statement per shape of list query (which filters are given), made once
  const FILTERS = ['kind', 'status', 'automation_id', 'session_id'] as const;
  const listStatements = new Map<string, Statement<unknown[], { doc: string }>>();
  // The narrowest index of what is asked, chosen here: SQLite, left to itself, read a tenant's ended runs of a status
  // to find a session's or a kind's few (76 ms among 100,000). A status that has not ended is held by few runs of a
  // tenant at any time: a page of them is read from the tenant's status index whatever else is asked (84 ms for an
  // automation's queued runs among 50,000 otherwise); then a session's runs, an automation's, a kind's.
  const indexOf = (given: readonly (typeof FILTERS)[number][], live: boolean): string | null =>
    live
      ? 'runs_by_tenant_status'
      : given.includes('session_id')
        ? 'runs_by_session'
        : given.includes('automation_id')
          ? 'runs_by_automation'
          : given.includes('kind')
            ? 'runs_by_tenant_kind'
            : null;
  const listStatement = (given: readonly (typeof FILTERS)[number][], live: boolean) => {
    const shape = `${given.join(',')}:${live}`;
    let stmt = listStatements.get(shape);
    if (!stmt) {
      const where = ['tenant_id = ?', ...given.map((f) => `${f} = ?`), 'id < ?'];
      const index = indexOf(given, live);
      const from = index ? `runs INDEXED BY ${index}` : 'runs';
      stmt = db.prepare<unknown[], { doc: string }>(`SELECT doc FROM ${from} WHERE ${where.join(' AND ')} ORDER BY id DESC LIMIT ?`);
      listStatements.set(shape, stmt);
    }
    return stmt;
  };

  /**
   * The UPDATE of a run that sets, besides its document, only the indexed columns that change: SQLite
   * rewrites the entries of every index on a column named in SET, changed or not (a start that named
   * finished_at wrote a page of an index on it for nothing). One statement per set of columns.
   */
  const COLUMNS = ['status', 'finished_at', 'duration_ms'] as const;
  const writes = new Map<string, Statement>();
  const write = (current: Run, next: Run) => {
    const changed = COLUMNS.filter((c) => next[c] !== current[c]);
    const shape = changed.join(',');
    let stmt = writes.get(shape);
    if (!stmt) {
      stmt = db.prepare(`UPDATE runs SET ${changed.map((c) => `${c} = ?, `).join('')}doc = ? WHERE tenant_id = ? AND id = ?`);
      writes.set(shape, stmt);
    }
    stmt.run(...changed.map((c) => next[c]), JSON.stringify(next), next.tenant_id, next.id);
  };

  const writeSteps = (tenantId: string, runId: string, attempt: number, steps: StepRecord[]) => {
    for (const s of steps) putStep.run(runId, attempt, s.index, tenantId, JSON.stringify(s));
  };

  // every write of a run goes through one group commit: ten runs settling at once pay for one commit
  const commit = groupCommit(db);
  const update = (tenantId: string, id: string, changes: Partial<Run>, guard: RunGuard, steps: StepRecord[]) => {
    const current = read(get.get(tenantId, id));
    if (!current || !guard.status.includes(current.status)) return null;
    if ((guard.attempt !== undefined && current.attempt !== guard.attempt) || (guard.uncanceled && current.cancel_requested_at)) return null;
    const next: Run = { ...current, ...changes, id: current.id, tenant_id: current.tenant_id, kind: current.kind, created_at: current.created_at };
    write(current, next);
    writeSteps(tenantId, id, current.attempt, steps);
    return next;
  };

  return {
    async insert(r, key) {
      return commit(() => {
        // the key and its run in one transaction: both stored, or neither
        const held = key ? claimKey(key.record, key.since, key.pendingSince) : null;
        if (!held)
          insert.run(r.id, r.tenant_id, r.kind, r.status, r.automation_id, r.session_id, r.created_at, r.finished_at, r.duration_ms, JSON.stringify(r));
        return held;
      });
    },
    async get(tenantId, id) {
      return read(get.get(tenantId, id));
    },
    async prune(idBefore, finishedBefore, limit) {
      return commit(() => {
        const rows = ended.all(idBefore, finishedBefore, limit);
        for (const r of rows) {
          removeSteps.run(r.id);
          removeTurns.run(r.id);
          removeRun.run(r.id);
          if (r.session_id && (r.kind === 'autonomy' || r.kind === 'vibe')) removeOwnSession.run(r.tenant_id, r.session_id, r.tenant_id, r.session_id);
        }
        return rows.length;
      });
    },
    async update(tenantId, id, changes, guard, steps = []) {
      return commit(() => update(tenantId, id, changes, guard, steps));
    },
    async putSteps(tenantId, runId, attempt, steps) {
      if (steps.length) await commit(() => writeSteps(tenantId, runId, attempt, steps));
    },
    async steps(tenantId, runId, attempt) {
      return stepsOf.all(runId, attempt, tenantId).map((r) => JSON.parse(r.doc) as StepRecord);
    },
    async appendTurn(tenantId, runId, attempt, turn) {
      await commit(() => putTurn.run(runId, attempt, turn.index, tenantId, JSON.stringify(turn)));
    },
    async turns(tenantId, runId, attempt) {
      return turnsOf.all(runId, attempt, tenantId).map((r) => JSON.parse(r.doc) as AgentTurn);
    },
    async list(tenantId, q: RunQuery) {
      const given = FILTERS.filter((f) => q[f] !== undefined);
      const live = q.status === 'queued' || q.status === 'running';
      const rows = listStatement(given, live).all(tenantId, ...given.map((f) => q[f]), decodeCursor(q.cursor, 'runs') ?? TOP, q.limit + 1);
      return toPage(
        rows.map((r) => read(r)!),
        q.limit,
        'runs',
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
    async listStale(status, createdBefore, limit, after) {
      return stale.all(status, createdBefore, after?.created_at ?? '', after?.id ?? '', limit).map((r) => read(r)!);
    },
    async statusOf(tenantId, ids) {
      return ids.length ? statuses.all(tenantId, JSON.stringify(ids)) : [];
    },
    async countByKindAndStatus() {
      return byKindStatus.all();
    },
  };
}
