import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { expect } from 'chai';
import Database from 'better-sqlite3';
import { groupCommit, openDatabase } from '../../engine/store/sqlite/db.js';
import { openSqliteStore } from '../../engine/store/sqlite/index.js';
import { MIGRATIONS } from '../../engine/store/sqlite/migrations.js';
import { automationFixture, endpointFixture, runFixture, storeContract, taskFixture } from './store-contract.js';

describe('SQLite store', () => {
  let dir: string;
  before(async () => {
    dir = await fs.mkdtemp(path.join(os.tmpdir(), 'svc-sqlite-'));
  });
  after(async () => {
    await fs.rm(dir, { recursive: true, force: true });
  });

  let n = 0;
  storeContract('sqlite', async () => openSqliteStore(path.join(dir, `contract-${n++}.sqlite`)));

  it('uses WAL and records its migrations', async () => {
    const file = path.join(dir, 'wal.sqlite');
    const store = openSqliteStore(file);
    await store.close();
    const db = new Database(file, { readonly: true });
    expect(db.pragma('journal_mode', { simple: true })).to.equal('wal');
    expect(db.pragma('user_version', { simple: true })).to.equal(MIGRATIONS.length);
    db.close();
  });

  it('counts automations and tasks by status, and finds automations by trigger, from the rows stored before those were kept', async () => {
    const file = path.join(dir, 'trigger-counts.sqlite');
    const before = MIGRATIONS.findIndex((m) => m.includes('CREATE TABLE automation_counts'));
    expect(before).to.be.below(MIGRATIONS.findIndex((m) => m.includes('CREATE TABLE task_counts')));
    const db = new Database(file);
    for (const m of MIGRATIONS.slice(0, before)) db.exec(m);
    db.pragma(`user_version = ${before}`);
    const automation = db.prepare('INSERT INTO automations (id, tenant_id, status, doc) VALUES (?, ?, ?, ?)');
    for (const [i, [tenant, status]] of [
      ['t1', 'enabled'],
      ['t1', 'disabled'],
      ['t1', 'archived'],
      ['t2', 'enabled'],
    ].entries()) {
      const triggers = i === 0 ? [{ type: 'cron' }, { type: 'webhook' }, 'junk', null] : [{ type: 'cron' }];
      const a = automationFixture(tenant!, { status: status as 'enabled', triggers: triggers as never });
      automation.run(`aut_${i}`, tenant, status, JSON.stringify({ ...a, id: `aut_${i}` }));
    }
    const task = db.prepare("INSERT INTO tasks (tenant_id, session_id, id, status, created_at, updated_at, doc) VALUES (?, ?, ?, ?, 'a', 'a', ?)");
    for (const [i, [session, status]] of [
      ['ses_1', 'queued'],
      ['ses_1', 'succeeded'],
      ['ses_1', 'succeeded'],
      ['ses_2', 'failed'],
    ].entries())
      task.run(
        't1',
        session,
        `tsk_${i}`,
        status,
        JSON.stringify({ tenant_id: 't1', session_id: session, id: `tsk_${i}`, status, created_at: 'a', updated_at: 'a' }),
      );
    const run = db.prepare(
      "INSERT INTO runs (id, tenant_id, kind, status, automation_id, session_id, created_at, doc) VALUES (?, 't1', 'automation', ?, ?, 'ses_r', 'a', ?)",
    );
    for (const [i, [automationId, status]] of [
      ['aut_0', 'queued'],
      ['aut_0', 'succeeded'],
      ['aut_0', 'succeeded'],
      ['aut_1', 'failed'],
      [null, 'succeeded'],
    ].entries())
      run.run(`run_${i}`, status, automationId, JSON.stringify(runFixture('t1', { id: `run_${i}`, status: status as 'queued', automation_id: automationId })));
    db.close();
    const store = openSqliteStore(file);
    try {
      expect([await store.automations.countLive('t1'), await store.automations.countLive('t2'), await store.automations.countLive('t3')]).to.deep.equal([
        2, 1, 0,
      ]);
      // and finds them by trigger type: a trigger that is not an object (stored before triggers were checked) is none
      expect((await store.automations.listEnabledWithTrigger('cron')).map((a) => a.id)).to.deep.equal(['aut_0', 'aut_3']);
      expect((await store.automations.listEnabledWithTrigger('webhook', 't1')).map((a) => a.id)).to.deep.equal(['aut_0']);
      await store.automations.update('t2', 'aut_3', { status: 'archived' }, ['enabled']);
      expect(await store.automations.countLive('t2')).to.equal(0);
      expect(await store.tasks.counts('t1', 'ses_1')).to.deep.equal({ queued: 1, succeeded: 2 });
      await store.tasks.update('t1', 'ses_1', 'tsk_0', { status: 'succeeded' }, ['queued']);
      expect(await store.tasks.counts('t1', 'ses_1')).to.deep.equal({ succeeded: 3 });
      expect(await store.tasks.counts('t1', 'ses_2')).to.deep.equal({ failed: 1 });
      // an automation's runs by status, counted from the runs stored before, then as they change
      expect((await store.runs.automationStats('t1', 'aut_0', 10)).counts).to.deep.equal({ queued: 1, succeeded: 2 });
      expect((await store.runs.automationStats('t1', 'aut_1', 10)).counts).to.deep.equal({ failed: 1 });
      await store.runs.update('t1', 'run_0', { status: 'running' }, { status: ['queued'] });
      await store.runs.insert(runFixture('t1', { automation_id: 'aut_1' }));
      expect((await store.runs.automationStats('t1', 'aut_0', 10)).counts).to.deep.equal({ running: 1, succeeded: 2 });
      expect((await store.runs.automationStats('t1', 'aut_1', 10)).counts).to.deep.equal({ queued: 1, failed: 1 });
    } finally {
      await store.close();
    }
  });

  it('keeps data across reopen, and sees writes of another connection to the same file', async () => {
    const file = path.join(dir, 'shared.sqlite');
    const one = openSqliteStore(file);
    const two = openSqliteStore(file);
    const a = automationFixture('t1');
    await one.automations.insert(a);
    expect(await two.automations.get('t1', a.id)).to.deep.equal(a);
    await two.automations.update('t1', a.id, { status: 'disabled' }, ['enabled']);
    expect(await one.automations.update('t1', a.id, { status: 'archived' }, ['enabled'])).to.equal(null);
    await one.close();
    await two.close();
    const again = openSqliteStore(file);
    expect((await again.automations.get('t1', a.id))!.status).to.equal('disabled');
    await again.close();
  });

  it('checkpoints in a thread of its own: commits never checkpoint, yet the log reaches the database file', async () => {
    const file = path.join(dir, 'checkpoints.sqlite');
    const store = openSqliteStore(file);
    const before = (await fs.stat(file)).size;
    // about 1.2 MB (some 500 pages): below the 1,000 pages at which a commit would checkpoint by itself, so only
    // the checkpointer's thread can have copied them into the database file
    const a = automationFixture('t1');
    for (let i = 0; i < 60; i++) await store.automations.insert({ ...a, id: `aut_${String(i).padStart(26, '0')}`, description: 'x'.repeat(20_000) });
    const deadline = Date.now() + 5_000;
    while ((await fs.stat(file)).size < before + 1_000_000 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
    expect((await fs.stat(file)).size, 'the pages reached the database file').to.be.greaterThan(before + 1_000_000);
    const reader = new Database(file, { readonly: true });
    expect(reader.prepare('SELECT COUNT(*) AS n FROM automations').get()).to.deep.equal({ n: 60 });
    reader.close();
    await store.close();
  });

  it('waits for another process’s write lock with the event loop free, then commits the writes that queued meanwhile, in order', async () => {
    const file = path.join(dir, 'locked.sqlite');
    const store = openSqliteStore(file);
    const other = new Database(file); // another process's connection: it holds the write lock
    other.exec('BEGIN IMMEDIATE');
    const a = automationFixture('t1');
    const inserted = store.automations.insert(a);
    const renamed = store.automations.update('t1', a.id, { name: 'renamed' }, ['enabled']);
    // SQLite's own busy timeout would sleep on this thread: the timer could not fire, so the lock could
    // not be let go, and the writes would fail as locked after 5 s
    const started = performance.now();
    let ticks = 0;
    const ticker = setInterval(() => ticks++, 5);
    await new Promise((r) => setTimeout(r, 100));
    const waited = performance.now() - started;
    expect(waited, 'the event loop ran while the lock was held').to.be.below(1000);
    expect(ticks).to.be.at.least(5);
    expect(await store.automations.get('t1', a.id), 'nothing written while the lock is held').to.equal(null);
    const late = store.automations.insert(automationFixture('t1', { name: 'late' }));
    other.exec('COMMIT');
    await inserted;
    expect((await renamed)!.name, 'the update ran after the insert it follows').to.equal('renamed');
    await late;
    clearInterval(ticker);
    expect((await store.automations.list('t1', { limit: 10 })).items.map((x) => x.name).sort()).to.deep.equal(['late', 'renamed']);
    other.close();
    await store.close();
  });

  it('checks the caps under the write lock: what another process wrote while this one waited for it counts', async () => {
    const file = path.join(dir, 'caps-locked.sqlite');
    const store = openSqliteStore(file);
    await store.automations.insert(automationFixture('t1'));
    const other = new Database(file); // another process, at the same cap: it writes while this one waits
    other.exec('BEGIN IMMEDIATE');
    const a = automationFixture('t1');
    const insert = store.automations.insert(a, { maxLive: 2 });
    const tasks = store.tasks.insertMany([taskFixture({ session_id: 'ses_1' })], { maxHeld: 1 });
    const e = endpointFixture('t1');
    const endpoint = store.notificationEndpoints.insert(e, { maxHeld: 1 });
    await new Promise((r) => setTimeout(r, 50));
    const theirs = automationFixture('t1');
    other.prepare('INSERT INTO automations (id, tenant_id, status, doc) VALUES (?, ?, ?, ?)').run(theirs.id, 't1', 'enabled', JSON.stringify(theirs));
    other
      .prepare("INSERT INTO tasks (tenant_id, session_id, id, status, created_at, updated_at, doc) VALUES ('t1', 'ses_1', 'theirs', 'pending', 'a', 'a', '{}')")
      .run();
    const their = endpointFixture('t1');
    other.prepare('INSERT INTO notification_endpoints (id, tenant_id, doc) VALUES (?, ?, ?)').run(their.id, 't1', JSON.stringify(their));
    other.exec('COMMIT');
    expect(await insert).to.equal('over-cap');
    expect(await tasks).to.equal('over-cap');
    expect(await endpoint).to.equal('over-cap');
    expect(await store.automations.countLive('t1')).to.equal(2);
    expect(await store.automations.get('t1', a.id)).to.equal(null);
    expect(await store.tasks.counts('t1', 'ses_1')).to.deep.equal({ pending: 1 });
    expect((await store.notificationEndpoints.list('t1')).map((n) => n.id)).to.deep.equal([their.id]);
    other.close();
    await store.close();
  });

  it('fails a write that waited 5 s for the lock, and only that one: a write asked for later keeps its own time', async function () {
    this.timeout(20_000);
    const file = path.join(dir, 'lock-timeout.sqlite');
    const store = openSqliteStore(file);
    const other = new Database(file);
    other.exec('BEGIN IMMEDIATE');
    const early = automationFixture('t1', { name: 'early' });
    const late = automationFixture('t1', { name: 'late' });
    const started = Date.now();
    const first = store.automations.insert(early).then(
      () => null,
      (err: { code?: string }) => ({ code: err.code, after: Date.now() - started }),
    );
    await new Promise((r) => setTimeout(r, 4_000));
    const second = store.automations.insert(late);
    const failed = await first;
    expect(failed, 'the first write gave up').to.include({ code: 'SQLITE_BUSY' });
    expect(failed!.after).to.be.within(4_900, 6_500);
    other.exec('COMMIT');
    await second;
    expect(await store.automations.get('t1', late.id)).to.deep.equal(late);
    expect(await store.automations.get('t1', early.id)).to.equal(null);
    other.close();
    await store.close();
  });

  it('closes only after the writes asked for before it, even one still waiting for the lock', async () => {
    const file = path.join(dir, 'close-waits.sqlite');
    const store = openSqliteStore(file);
    const other = new Database(file);
    other.exec('BEGIN IMMEDIATE');
    const a = automationFixture('t1');
    const inserted = store.automations.insert(a);
    const closed = store.close();
    setTimeout(() => other.exec('COMMIT'), 50);
    await inserted;
    await closed;
    other.close();
    const again = openSqliteStore(file);
    expect(await again.automations.get('t1', a.id)).to.deep.equal(a);
    await again.close();
  });

  it('keeps the last write the file refused for readiness: a full database, not a write that breaks a rule', async () => {
    const db = openDatabase(path.join(dir, 'full.sqlite'));
    const commit = groupCommit(db);
    db.exec('CREATE TABLE filler (id INTEGER PRIMARY KEY, body TEXT NOT NULL)');
    await commit(() => db.prepare('INSERT INTO filler (body) VALUES (?)').run('x'));
    // a rule broken is the write's own fault, not the file's
    await commit(() => db.prepare('INSERT INTO filler (id, body) VALUES (1, ?)').run('again')).catch(() => undefined);
    expect(commit.lastStorageFailure()).to.equal(null);
    // the file can grow no more: as on a full disk, the write that needs a page fails SQLITE_FULL
    db.pragma(`max_page_count = ${db.pragma('page_count', { simple: true }) as number}`);
    const full = await commit(() => db.prepare('INSERT INTO filler (body) VALUES (?)').run('y'.repeat(64 * 1024))).catch((err: { code?: string }) => err);
    expect((full as { code?: string }).code).to.equal('SQLITE_FULL');
    expect(commit.lastStorageFailure()).to.deep.include({ code: 'SQLITE_FULL' });
    db.close();
  });

  it('fails ping once closed', async () => {
    const store = openSqliteStore(path.join(dir, 'closed.sqlite'));
    await store.close();
    let failed = false;
    await store.ping().catch(() => (failed = true));
    expect(failed).to.equal(true);
  });

  it('answers the reconcilers from partial indexes that hold only runs, sessions and tasks that have not ended, and an automation’s counts as they are kept', async () => {
    // the reconcilers' statements, as the repositories prepare them
    const prepared: string[] = [];
    const prepare = Database.prototype.prepare;
    Database.prototype.prepare = function (this: Database.Database, sql: string) {
      prepared.push(sql);
      return prepare.call(this, sql);
    } as typeof prepare;
    let store;
    try {
      store = openSqliteStore(path.join(dir, 'partial.sqlite'));
    } finally {
      Database.prototype.prepare = prepare;
    }
    await store.close();
    const db = new Database(path.join(dir, 'partial.sqlite'), { readonly: true });
    const plan = (table: string) => {
      const sql = prepared.find((q) => new RegExp(`^SELECT doc(, output)? FROM ${table} WHERE`).test(q) && q.includes('status IN ('));
      expect(sql, `the reconciler's statement on ${table}`).to.be.a('string');
      // the status, the time, then the page (tasks page on by their last one): any values do for a plan
      const params = (sql!.match(/\?/g) ?? []).map((_, i, all) => (i === 0 ? 'running' : i === all.length - 1 ? 10 : '2026-01-01'));
      return (db.prepare(`EXPLAIN QUERY PLAN ${sql}`).all(...params) as { detail: string }[]).map((r) => r.detail).join(' ');
    };
    expect(plan('runs')).to.contain('USING INDEX runs_live_by_created');
    // in the index's order: runs made in the same millisecond are not sorted apart
    expect(plan('runs')).not.to.contain('TEMP B-TREE');
    expect(plan('sessions')).to.contain('USING INDEX sessions_live_by_updated');
    expect(plan('tasks')).to.contain('USING INDEX tasks_live_by_updated');
    // a session's tasks in one status (the waiting ones a message may answer), through an index of their own
    const inStatus = prepared.find((q) => q.includes('FROM tasks WHERE tenant_id = ? AND session_id = ? AND status = ?'));
    expect(inStatus, 'the statement of a session’s tasks in a status').to.be.a('string');
    expect((db.prepare(`EXPLAIN QUERY PLAN ${inStatus}`).all('t1', 'ses_1', 'input_required') as { detail: string }[]).map((r) => r.detail).join(' ')).to.match(
      /USING (COVERING )?INDEX tasks_by_session_status/,
    );
    // an automation's counts are kept as its runs are written, not counted from them
    expect(prepared.filter((q) => q.includes('COUNT(') && q.includes('FROM runs'))).to.deep.equal([]);
    // a run that ends leaves the index: only the live one is in it
    db.close();
    const writable = openSqliteStore(path.join(dir, 'partial.sqlite'));
    const at = new Date(Date.now() - 60_000).toISOString();
    const live = runFixture('t1', { id: 'run_live', created_at: at });
    const done = runFixture('t1', { id: 'run_done', created_at: at });
    await writable.runs.insert(live);
    await writable.runs.insert(done);
    await writable.runs.update('t1', 'run_done', { status: 'running' }, { status: ['queued'] });
    await writable.runs.update('t1', 'run_done', { status: 'succeeded', finished_at: at, duration_ms: 1 }, { status: ['running'] });
    expect((await writable.runs.listStale('queued', new Date().toISOString(), 10)).map((r) => r.id)).to.deep.equal(['run_live']);
    expect(await writable.runs.listStale('running', new Date().toISOString(), 10)).to.deep.equal([]);
    expect(await writable.runs.get('t1', 'run_done')).to.include({ status: 'succeeded', finished_at: at, duration_ms: 1 });
    // the metrics' counts by kind and status, kept as runs are written, agree with a count of the runs
    expect((await writable.runs.countByKindAndStatus()).sort((a, b) => a.status.localeCompare(b.status))).to.deep.equal([
      { kind: 'automation', status: 'queued', count: 1 },
      { kind: 'automation', status: 'succeeded', count: 1 },
    ]);
    await writable.close();
    const check = new Database(path.join(dir, 'partial.sqlite'), { readonly: true });
    expect(check.prepare('SELECT kind, status, n AS count FROM run_counts WHERE n > 0 ORDER BY status').all()).to.deep.equal(
      check.prepare('SELECT kind, status, COUNT(*) AS count FROM runs GROUP BY kind, status ORDER BY status').all(),
    );
    expect(check.prepare('SELECT automation_id, status, n FROM automation_run_counts WHERE n > 0 ORDER BY automation_id, status').all()).to.deep.equal(
      check
        .prepare(
          'SELECT automation_id, status, COUNT(*) AS n FROM runs WHERE automation_id IS NOT NULL GROUP BY automation_id, status ORDER BY automation_id, status',
        )
        .all(),
    );
    expect(check.prepare("SELECT COUNT(*) AS n FROM runs INDEXED BY runs_live_by_created WHERE status IN ('queued', 'running')").get()).to.deep.equal({ n: 1 });
    check.close();
  });
  it('reads a page of a tenant’s multi-agent sessions, of its live runs, of a workspace’s gate runs and its gates’ latest results from indexes, not by walking the tenant’s history', async () => {
    const file = path.join(dir, 'pages.sqlite');
    const prepared: string[] = [];
    const prepare = Database.prototype.prepare;
    Database.prototype.prepare = function (this: Database.Database, sql: string) {
      prepared.push(sql);
      return prepare.call(this, sql);
    } as typeof prepare;
    try {
      const store = openSqliteStore(file);
      // the list statements are made at their first use, one per shape of query
      await store.runs.list('t1', { automation_id: 'aut_1', status: 'queued', limit: 1 });
      await store.runs.list('t1', { session_id: 'ses_1', status: 'running', limit: 1 });
      await store.sessions.list('t1', { kind: 'multi_agent', limit: 1 });
      // ended statuses and kinds: a session's, an automation's or a kind's runs by their own index, not the tenant's status index
      await store.runs.list('t1', { session_id: 'ses_1', status: 'succeeded', limit: 1 });
      await store.runs.list('t1', { kind: 'vibe', status: 'failed', limit: 1 });
      await store.runs.list('t1', { kind: 'vibe', limit: 1 });
      await store.sessions.list('t1', { kind: 'vibe', limit: 1 });
      await store.runs.prune('run_~', '2026-01-01T00:00:00.000Z', 10);
      await store.gateRuns.list('t1', { workspace: 'app', limit: 1 });
      await store.gateRuns.latestResults('t1', 'app');
      await store.close();
    } finally {
      Database.prototype.prepare = prepare;
    }
    const db = new Database(file, { readonly: true });
    const plan = (needle: (sql: string) => boolean, params: unknown[]) => {
      const sql = prepared.find(needle);
      expect(sql, 'the statement').to.be.a('string');
      // a statement of named parameters takes them as one object
      const values = sql!.includes('@') ? [Object.fromEntries(['tenant', 'workspace'].map((k, i) => [k, params[i]]))] : params;
      return (db.prepare(`EXPLAIN QUERY PLAN ${sql}`).all(...values) as { detail: string }[]).map((r) => r.detail).join(' | ');
    };
    const runsWhere =
      (...filters: string[]) =>
      (q: string) =>
        q.startsWith('SELECT doc FROM runs') &&
        q.includes('ORDER BY id DESC') &&
        filters.every((f) => q.includes(`${f} = ?`)) &&
        (q.match(/= \?/g) ?? []).length === filters.length + 1;
    try {
      // a status that has not ended: the few live runs of the tenant, not every run of the automation or session
      expect(plan(runsWhere('status', 'automation_id'), ['t1', 'queued', 'aut_1', '~', 2])).to.contain('USING INDEX runs_by_tenant_status');
      expect(plan(runsWhere('status', 'session_id'), ['t1', 'running', 'ses_1', '~', 2])).to.contain('USING INDEX runs_by_tenant_status');
      expect(plan((q) => q.startsWith('SELECT doc FROM sessions') && q.includes('kind = ?'), ['t1', 'multi_agent', '~', 2])).to.contain(
        'USING INDEX sessions_multi_agent',
      );
      // the last prepared of each shape is the ended status's (the live one's came first)
      const last = (needle: (sql: string) => boolean) => (q: string) => q === prepared.filter(needle).at(-1);
      expect(plan(last(runsWhere('status', 'session_id')), ['t1', 'succeeded', 'ses_1', '~', 2])).to.contain('USING INDEX runs_by_session');
      expect(plan(runsWhere('kind', 'status'), ['t1', 'vibe', 'failed', '~', 2])).to.contain('USING INDEX runs_by_tenant_kind');
      expect(plan(runsWhere('kind'), ['t1', 'vibe', '~', 2])).to.contain('USING INDEX runs_by_tenant_kind');
      expect(
        plan((q) => q.startsWith('SELECT doc FROM sessions') && q.includes('kind = ?') && !q.includes("'multi_agent'"), ['t1', 'vibe', '~', 2]),
      ).to.contain('USING INDEX sessions_by_tenant_kind');
      // the prune walks the runs it may delete, not the task runs and live runs it keeps
      expect(plan((q) => q.startsWith('SELECT id, tenant_id, kind, session_id FROM runs'), ['run_~', '2026-01-01', 10])).to.contain(
        'USING INDEX runs_prunable',
      );
      expect(plan((q) => q.startsWith('SELECT doc FROM gate_runs') && q.includes('workspace = ?'), ['t1', 'app', '~', 2])).to.contain(
        'USING INDEX gate_runs_by_workspace (tenant_id=? AND workspace=? AND id<?)',
      );
      // one seek per gate: the next gate id above the last, then that gate's latest result (no GROUP BY over them all)
      const latest = plan((q) => q.includes('FROM gate_results') && q.includes('workspace = ') && !q.startsWith('INSERT'), ['t1', 'app']);
      expect(latest).to.contain('gate_results_latest (tenant_id=? AND workspace=? AND gate_id>?)');
      expect(latest).to.contain('gate_results_latest (tenant_id=? AND workspace=? AND gate_id=?)');
    } finally {
      db.close();
    }
  });
});
