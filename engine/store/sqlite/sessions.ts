// Sessions, their agents and their message log. A message's seq is the next one of its session,
// taken in the same IMMEDIATE transaction as the insert (the group commit's), so concurrent writers never share one.
import type { Statement } from 'better-sqlite3';
import type { AgentRecord, MessageRecord, Session } from '../../platform/index.js';
import { withMembers } from '../members.js';
import { decodeCursor, toPage, type AgentMembers, type AgentRepo, type CappedInsert, type MessageRepo, type NewMessage, type SessionRepo } from '../port.js';
import { groupCommit, TOP, type Db } from './db.js';

/** Rows of a session's a prune deletes a commit (runs with their steps and turns; messages; tasks; agents). */
const PRUNE_CHUNK = 200;

export function sessionRepo(db: Db): SessionRepo {
  const insert = db.prepare('INSERT INTO sessions (id, tenant_id, kind, status, doc) VALUES (?, ?, ?, ?, ?)');
  const get = db.prepare<[string, string], { doc: string }>('SELECT doc FROM sessions WHERE tenant_id = ? AND id = ?');
  const write = db.prepare('UPDATE sessions SET status = ?, doc = ? WHERE tenant_id = ? AND id = ?');
  // a change that keeps the status does not name it: its index's entry is not rewritten
  const writeDoc = db.prepare('UPDATE sessions SET doc = ? WHERE tenant_id = ? AND id = ?');
  const read = (row: { doc: string } | undefined): Session | null => (row ? (JSON.parse(row.doc) as Session) : null);
  // the reconciler's partial index: its condition is repeated word for word, or SQLite does not use it
  const stale = db.prepare<[string, string, string, string, number], { doc: string }>(
    `SELECT doc FROM sessions WHERE kind = 'multi_agent' AND status IN ('running', 'waiting')
     AND status = ? AND json_extract(doc, '$.updated_at') < ? AND (json_extract(doc, '$.updated_at'), id) > (?, ?)
     ORDER BY json_extract(doc, '$.updated_at'), id LIMIT ?`,
  );
  // the oldest archived multi-agent session whose work has ended, through their partial index (migrations.ts)
  const archivedEnded = db.prepare<[string], { tenant_id: string; id: string }>(
    `SELECT tenant_id, id FROM sessions INDEXED BY sessions_archived_by_updated
     WHERE kind = 'multi_agent' AND status = 'archived' AND json_extract(doc, '$.updated_at') < ? AND json_extract(doc, '$.outcome') IS NOT NULL
     AND NOT EXISTS (SELECT 1 FROM runs WHERE runs.tenant_id = sessions.tenant_id AND runs.session_id = sessions.id AND runs.status IN ('queued', 'running'))
     ORDER BY json_extract(doc, '$.updated_at') LIMIT 1`,
  );
  // a session's rows go a chunk a commit (one session's 10,000 tasks and 200,000 steps in one held the event loop
  // 3 s): its runs with their steps and turns, then the rest of what names it, the session last, so that a prune
  // cut off on the way finds it again. The counts kept by triggers count its runs out.
  const runsOf = db.prepare<{ tenant: string; session: string; n: number }, { id: string }>(
    'SELECT id FROM runs WHERE tenant_id = @tenant AND session_id = @session LIMIT @n',
  );
  const removeRun = ['DELETE FROM run_steps WHERE run_id = ?', 'DELETE FROM run_turns WHERE run_id = ?', 'DELETE FROM runs WHERE id = ?'].map((sql) =>
    db.prepare(sql),
  );
  const removeChunk = [
    'DELETE FROM messages WHERE session_id = @session AND seq IN (SELECT seq FROM messages WHERE session_id = @session LIMIT @n)',
    'DELETE FROM tasks WHERE tenant_id = @tenant AND session_id = @session AND id IN (SELECT id FROM tasks WHERE tenant_id = @tenant AND session_id = @session LIMIT @n)',
    'DELETE FROM agents WHERE tenant_id = @tenant AND session_id = @session AND id IN (SELECT id FROM agents WHERE tenant_id = @tenant AND session_id = @session LIMIT @n)',
  ].map((sql) => db.prepare(sql));
  const removeLast = [
    'DELETE FROM task_counts WHERE tenant_id = @tenant AND session_id = @session',
    'DELETE FROM sessions WHERE tenant_id = @tenant AND id = @session',
  ].map((sql) => db.prepare(sql));
  const listStatements = new Map<string, Statement<unknown[], { doc: string }>>();
  const listStatement = (status: boolean, kind: boolean, multiAgent: boolean, byKind: boolean) => {
    const shape = `${status}:${kind}:${multiAgent}:${byKind}`;
    let stmt = listStatements.get(shape);
    if (!stmt) {
      // the multi-agent sessions by their partial index, whose condition is said word for word (SQLite uses it only then)
      const where = [
        'tenant_id = ?',
        status ? 'status = ?' : "status <> 'archived'",
        ...(kind ? [multiAgent ? "kind = 'multi_agent' AND kind = ?" : byKind ? "kind <> 'autonomy' AND kind = ?" : 'kind = ?'] : []),
        'id < ?',
      ];
      // a kind of few sessions (vibe) by the tenant's kind index, whose condition is said word for word: SQLite read
      // every session of the tenant to find them (`?kind=vibe` among 100,000 autonomy sessions: 167 ms)
      const from = byKind ? 'sessions INDEXED BY sessions_by_tenant_kind' : 'sessions';
      stmt = db.prepare<unknown[], { doc: string }>(`SELECT doc FROM ${from} WHERE ${where.join(' AND ')} ORDER BY id DESC LIMIT ?`);
      listStatements.set(shape, stmt);
    }
    return stmt;
  };
  const update = (tenantId: string, id: string, changes: Partial<Session>, ifStatusIn: string[], ifOutcome?: Session['outcome']) => {
    const current = read(get.get(tenantId, id));
    if (!current || !ifStatusIn.includes(current.status)) return null;
    if (ifOutcome !== undefined && current.outcome !== ifOutcome) return null;
    const next: Session = { ...current, ...changes, id: current.id, tenant_id: current.tenant_id, kind: current.kind, created_at: current.created_at };
    if (next.status === current.status) writeDoc.run(JSON.stringify(next), tenantId, id);
    else write.run(next.status, JSON.stringify(next), tenantId, id);
    return next;
  };
  // in the store's group commit: a run's session goes in the same commit as the run
  const commit = groupCommit(db);
  return {
    async insert(s) {
      await commit(() => insert.run(s.id, s.tenant_id, s.kind, s.status, JSON.stringify(s)));
    },
    async get(tenantId, id) {
      return read(get.get(tenantId, id));
    },
    async list(tenantId, q) {
      const params = [tenantId, ...(q.status ? [q.status] : []), ...(q.kind ? [q.kind] : []), decodeCursor(q.cursor, 'sessions') ?? TOP, q.limit + 1];
      // a status a session leaves (running, waiting, paused) is held by few: its index is the narrower then
      const live = q.status === 'running' || q.status === 'waiting' || q.status === 'paused';
      const multiAgent = q.kind === 'multi_agent';
      const rows = listStatement(Boolean(q.status), Boolean(q.kind), multiAgent, Boolean(q.kind) && !multiAgent && q.kind !== 'autonomy' && !live).all(
        ...params,
      );
      return toPage(
        rows.map((r) => read(r)!),
        q.limit,
        'sessions',
      );
    },
    async update(tenantId, id, changes, ifStatusIn, ifOutcome) {
      return commit(() => update(tenantId, id, changes, ifStatusIn, ifOutcome));
    },
    async listStale(status, updatedBefore, limit, after) {
      return stale.all(status, updatedBefore, after?.updated_at ?? '', after?.id ?? '', limit).map((r) => read(r)!);
    },
    async pruneArchived(updatedBefore, limit) {
      let pruned = 0;
      for (let next; pruned < limit && (next = archivedEnded.get(updatedBefore)); pruned++) {
        const of = { tenant: next.tenant_id, session: next.id, n: PRUNE_CHUNK };
        const runsGone = () => {
          const ids = runsOf.all(of);
          for (const { id } of ids) for (const stmt of removeRun) stmt.run(id);
          return ids.length;
        };
        while ((await commit(runsGone)) === PRUNE_CHUNK);
        for (const stmt of removeChunk) while ((await commit(() => stmt.run(of).changes)) === PRUNE_CHUNK);
        await commit(() => removeLast.forEach((stmt) => stmt.run(of)));
      }
      return pruned;
    },
  };
}

/** Whether a session is archived, read inside the caller's write transaction (no archive comes between). */
function archivedCheck(db: Db): (tenantId: string, sessionId: string) => boolean {
  const status = db.prepare<[string, string], { status: string }>('SELECT status FROM sessions WHERE tenant_id = ? AND id = ?');
  return (tenantId, sessionId) => status.get(tenantId, sessionId)?.status === 'archived';
}

export function agentRepo(db: Db): AgentRepo {
  const insert = db.prepare('INSERT INTO agents (id, tenant_id, session_id, doc) VALUES (?, ?, ?, ?)');
  const get = db.prepare<[string, string, string], { doc: string }>('SELECT doc FROM agents WHERE tenant_id = ? AND session_id = ? AND id = ?');
  const list = db.prepare<[string, string], { doc: string }>('SELECT doc FROM agents WHERE tenant_id = ? AND session_id = ? ORDER BY id');
  const write = db.prepare('UPDATE agents SET doc = ? WHERE tenant_id = ? AND session_id = ? AND id = ?');
  const held = db.prepare<[string, string], { n: number }>('SELECT COUNT(*) AS n FROM agents WHERE tenant_id = ? AND session_id = ?');
  const archived = archivedCheck(db);
  const commit = groupCommit(db);
  const update = (tenantId: string, sessionId: string, id: string, changes: Partial<AgentRecord>, members?: AgentMembers): AgentRecord | null => {
    if (archived(tenantId, sessionId)) return null;
    const row = get.get(tenantId, sessionId, id);
    if (!row) return null;
    const current = JSON.parse(row.doc) as AgentRecord;
    const next: AgentRecord = withMembers({ ...current, ...changes, id, tenant_id: tenantId, session_id: sessionId, created_at: current.created_at }, members);
    write.run(JSON.stringify(next), tenantId, sessionId, id);
    return next;
  };
  return {
    async insert(a, cap) {
      // the status and the count read inside the write's IMMEDIATE transaction: no archive or other insert comes between
      return commit((): CappedInsert | 'archived' => {
        if (archived(a.tenant_id, a.session_id)) return 'archived';
        if (cap && (held.get(a.tenant_id, a.session_id)?.n ?? 0) >= cap.maxHeld) return 'over-cap';
        insert.run(a.id, a.tenant_id, a.session_id, JSON.stringify(a));
        return 'inserted';
      });
    },
    async get(tenantId, sessionId, id) {
      const row = get.get(tenantId, sessionId, id);
      return row ? (JSON.parse(row.doc) as AgentRecord) : null;
    },
    async list(tenantId, sessionId) {
      return list.all(tenantId, sessionId).map((r) => JSON.parse(r.doc) as AgentRecord);
    },
    async update(tenantId, sessionId, id, changes, members) {
      return commit(() => update(tenantId, sessionId, id, changes, members));
    },
  };
}

export function messageRepo(db: Db): MessageRepo {
  const last = db.prepare<[string], { seq: number | null }>('SELECT MAX(seq) AS seq FROM messages WHERE session_id = ?');
  const insert = db.prepare('INSERT INTO messages (session_id, seq, tenant_id, id, doc) VALUES (?, ?, ?, ?, ?)');
  const list = db.prepare<[string, string, number, number], { doc: string }>(
    'SELECT doc FROM messages WHERE session_id = ? AND tenant_id = ? AND seq > ? ORDER BY seq LIMIT ?',
  );
  const lastOfTenant = db.prepare<[string, string], { seq: number | null }>('SELECT MAX(seq) AS seq FROM messages WHERE session_id = ? AND tenant_id = ?');
  const one = db.prepare<[string, string, string], { doc: string }>('SELECT doc FROM messages WHERE id = ? AND session_id = ? AND tenant_id = ?');
  // the seq is read and taken inside the write, and the group commit's writes run one after another in
  // one IMMEDIATE transaction: concurrent writers (another process) wait for the file's write lock
  const archived = archivedCheck(db);
  const commit = groupCommit(db);
  const append = (m: NewMessage): MessageRecord | null => {
    if (archived(m.tenant_id, m.session_id)) return null;
    const record: MessageRecord = { ...m, seq: (last.get(m.session_id)?.seq ?? 0) + 1 };
    insert.run(record.session_id, record.seq, record.tenant_id, record.id, JSON.stringify(record));
    return record;
  };
  return {
    async append(m) {
      return commit(() => append(m));
    },
    async list(tenantId, sessionId, q) {
      return list.all(sessionId, tenantId, q.afterSeq ?? 0, q.limit).map((r) => JSON.parse(r.doc) as MessageRecord);
    },
    async lastSeq(tenantId, sessionId) {
      return lastOfTenant.get(sessionId, tenantId)?.seq ?? 0;
    },
    async get(tenantId, sessionId, id) {
      const row = one.get(id, sessionId, tenantId);
      return row ? (JSON.parse(row.doc) as MessageRecord) : null;
    },
  };
}
