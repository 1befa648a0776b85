// The tasks of multi-agent sessions, keyed by tenant, session and the task's own id.
import type { TaskRecord, TaskStatus } from '../../platform/index.js';
import { SUMMARY_QUESTION_MAX, type CappedInsert, type TaskBrief, type TaskRepo } from '../port.js';
import { groupCommit, type Db } from './db.js';

type Row = { doc: string; output: string | null };

/** A task as its row keeps it: the document without the output, and the output. */
const stored = (t: TaskRecord): [string, string | null] => {
  const { output, ...doc } = t;
  return [JSON.stringify(doc), output === null || output === undefined ? null : JSON.stringify(output)];
};

export function taskRepo(db: Db): TaskRepo {
  // a task's output (up to 256 KB) is a column of its own, the row's last: a read of the document alone stops before it
  const insert = db.prepare('INSERT INTO tasks (tenant_id, session_id, id, status, created_at, updated_at, doc, output) VALUES (?, ?, ?, ?, ?, ?, ?, ?)');
  const get = db.prepare<[string, string, string], Row>('SELECT doc, output FROM tasks WHERE tenant_id = ? AND session_id = ? AND id = ?');
  const list = db.prepare<[string, string], Row>('SELECT doc, output FROM tasks WHERE tenant_id = ? AND session_id = ? ORDER BY created_at, id');
  // through tasks_by_session_status (an IN list of statuses made SQLite walk the session's rows instead): the few
  // tasks in a status, not every task of the session, documents and all
  const listIn = db.prepare<[string, string, string], Row>(
    'SELECT doc, output FROM tasks WHERE tenant_id = ? AND session_id = ? AND status = ? ORDER BY created_at, id',
  );
  // the output without what makes it large, cut in SQLite: its result and steps never reach the process (an output
  // SQLite's JSON functions refuse, nested over 1,000 deep, gives none rather than fail the whole list)
  const question = "json_extract(output, '$.input_required.question')";
  const summaries = db.prepare<[string, string], Row>(
    `SELECT doc, CASE WHEN NOT json_valid(output) THEN NULL
       WHEN length(${question}) > ${SUMMARY_QUESTION_MAX} THEN json_remove(json_set(output, '$.input_required.question', substr(${question}, 1, ${SUMMARY_QUESTION_MAX}), '$.input_required.question_truncated', json('true')), '$.result', '$.steps')
       ELSE json_remove(output, '$.result', '$.steps') END AS output
     FROM tasks WHERE tenant_id = ? AND session_id = ? ORDER BY created_at, id`,
  );
  // the output column is not read: its pages are not even loaded
  const briefs = db.prepare<[string, string], { doc: string }>('SELECT doc FROM tasks WHERE tenant_id = ? AND session_id = ? ORDER BY created_at, id');
  const some = db.prepare<[string, string, string], Row>(
    'SELECT doc, output FROM tasks WHERE tenant_id = ? AND session_id = ? AND id IN (SELECT value FROM json_each(?)) ORDER BY created_at, id',
  );
  const write = db.prepare('UPDATE tasks SET status = ?, updated_at = ?, doc = ?, output = ? WHERE tenant_id = ? AND session_id = ? AND id = ?');
  const stale = db.prepare<[string, string, string, string, string, string, number], Row>(
    // the partial index's condition, word for word, so that SQLite uses it
    `SELECT doc, output FROM tasks WHERE status IN ('pending', 'queued', 'running', 'input_required') AND status = ? AND updated_at < ? AND (updated_at, tenant_id, session_id, id) > (?, ?, ?, ?)
     ORDER BY updated_at, tenant_id, session_id, id LIMIT ?`,
  );
  const counts = db.prepare<[string, string], { status: TaskStatus; n: number }>(
    'SELECT status, n FROM task_counts WHERE tenant_id = ? AND session_id = ? AND n > 0',
  );
  const held = db.prepare<[string, string], { n: number | null }>('SELECT SUM(n) AS n FROM task_counts WHERE tenant_id = ? AND session_id = ?');
  const sessionStatus = db.prepare<[string, string], { status: string }>('SELECT status FROM sessions WHERE tenant_id = ? AND id = ?');
  // a session that had ended has work again: its outcome goes with the insert (its status, which pending tasks do not
  // move, stays), so no reader finds it succeeded with a task pending. An archived one keeps the outcome its archive gave
  const reopen = db.prepare(
    `UPDATE sessions SET doc = json_set(doc, '$.outcome', NULL, '$.updated_at', ?)
     WHERE tenant_id = ? AND id = ? AND status <> 'archived' AND json_extract(doc, '$.outcome') IS NOT NULL`,
  );
  const read = (row: Row | undefined): TaskRecord | null => {
    if (!row) return null;
    const task = JSON.parse(row.doc) as TaskRecord;
    // a document that holds its output (a row written by hand) keeps it when the column has none
    if (row.output !== null || task.output === undefined) task.output = row.output === null ? null : (JSON.parse(row.output) as TaskRecord['output']);
    return task;
  };
  // writes go in the store's group commit: the writes of one turn of the event loop share a commit
  const commit = groupCommit(db);
  // the session's status and the count are read inside the write's IMMEDIATE transaction: no other write, of
  // this process or another (an archive), comes between
  const insertMany = (tasks: TaskRecord[], cap?: { maxHeld: number; whileLive?: boolean; reopenAt?: string }): CappedInsert | 'reopened' | 'archived' => {
    const first = tasks[0];
    if (cap?.whileLive && first && sessionStatus.get(first.tenant_id, first.session_id)?.status === 'archived') return 'archived';
    if (cap && first) {
      const n = held.get(first.tenant_id, first.session_id)?.n ?? 0;
      if (n + tasks.length > cap.maxHeld) return 'over-cap';
      tasks.forEach((t, i) => (t.position = n + 1 + i));
    }
    for (const t of tasks) insert.run(t.tenant_id, t.session_id, t.id, t.status, t.created_at, t.updated_at, ...stored(t));
    if (cap?.reopenAt && first && reopen.run(cap.reopenAt, first.tenant_id, first.session_id).changes) return 'reopened';
    return 'inserted';
  };
  const update = (tenantId: string, sessionId: string, id: string, changes: Partial<TaskRecord>, ifStatusIn: string[]) => {
    const current = read(get.get(tenantId, sessionId, id));
    if (!current || !ifStatusIn.includes(current.status)) return null;
    const next: TaskRecord = { ...current, ...changes, id, tenant_id: tenantId, session_id: sessionId, created_at: current.created_at };
    write.run(next.status, next.updated_at, ...stored(next), tenantId, sessionId, id);
    return next;
  };
  return {
    async insertMany(tasks, cap) {
      try {
        return await commit(() => insertMany(tasks, cap));
      } catch (err) {
        // the batch's transaction is rolled back: none of it is stored
        if ((err as { code?: string }).code === 'SQLITE_CONSTRAINT_PRIMARYKEY') return 'id-taken';
        throw err;
      }
    },
    async get(tenantId, sessionId, id) {
      return read(get.get(tenantId, sessionId, id));
    },
    async getMany(tenantId, sessionId, ids) {
      return ids.length ? some.all(tenantId, sessionId, JSON.stringify(ids)).map((r) => read(r)!) : [];
    },
    async list(tenantId, sessionId) {
      return list.all(tenantId, sessionId).map((r) => read(r)!);
    },
    async listIn(tenantId, sessionId, status) {
      return listIn.all(tenantId, sessionId, status).map((r) => read(r)!);
    },
    async listSummaries(tenantId, sessionId) {
      return summaries.all(tenantId, sessionId).map((r) => {
        const task = read(r)!;
        // a row whose output stayed in its document (see the migration that moved outputs) is cut here
        if (task.output && ('result' in task.output || 'steps' in task.output)) {
          const { result: _result, steps: _steps, ...summary } = task.output;
          task.output = summary;
        }
        return task;
      });
    },
    async listBriefs(tenantId, sessionId) {
      return briefs.all(tenantId, sessionId).map((r) => {
        const { output: _, ...brief } = JSON.parse(r.doc) as TaskRecord;
        return brief as TaskBrief;
      });
    },
    async update(tenantId, sessionId, id, changes, ifStatusIn) {
      return commit(() => update(tenantId, sessionId, id, changes, ifStatusIn));
    },
    async counts(tenantId, sessionId) {
      return Object.fromEntries(counts.all(tenantId, sessionId).map((r) => [r.status, r.n]));
    },
    async listStale(status, updatedBefore, limit, after) {
      const from = after ? [after.updated_at, after.tenant_id, after.session_id, after.id] : ['', '', '', ''];
      return stale.all(status, updatedBefore, from[0]!, from[1]!, from[2]!, from[3]!, limit).map((r) => read(r)!);
    },
  };
}
