// Two processes opening one new SQLite file at once (the Procfile's web and worker on a fresh data
// dir): the second must wait for the first's migrations and find nothing left to do, not apply them
// again from the version it read before it had the lock.
import { spawn } from 'node:child_process';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import Database from 'better-sqlite3';
import { expect } from 'chai';
import { openSqliteStore } from '../../engine/store/sqlite/index.js';
import { BUSY_TIMEOUT_MS } from '../../engine/store/sqlite/db.js';
import { MIGRATIONS } from '../../engine/store/sqlite/migrations.js';

describe('sqlite migrations', function () {
  this.timeout(30_000);

  for (const holdMs of [1500, BUSY_TIMEOUT_MS + 1500])
    it(`are applied once when another process migrates the file while this one waits for the lock (${holdMs} ms${holdMs > BUSY_TIMEOUT_MS ? ', longer than a statement waits' : ''})`, async () => {
      await migratedWhileWaiting(holdMs);
    });

  async function migratedWhileWaiting(holdMs: number) {
    const dir = await fs.mkdtemp(path.join(os.tmpdir(), 'migrate-'));
    const file = path.join(dir, 'service.db');
    const first = new Database(file);
    try {
      first.pragma('journal_mode = WAL');
      first.exec('BEGIN IMMEDIATE'); // the first process has the write lock, its migrations not yet written
      // it says when it opens the file (its start, a second or two, is not counted in the time it waits)
      const script = `import('./engine/store/sqlite/db.ts').then(({ openDatabase }) => { console.log('opening'); openDatabase(${JSON.stringify(file)}).close(); })`;
      const second = spawn(process.execPath, ['--import', 'tsx', '-e', script], { stdio: ['ignore', 'pipe', 'pipe'] });
      let stderr = '';
      second.stderr.on('data', (d) => (stderr += d));
      const exited = new Promise<number | null>((resolve) => second.on('exit', resolve));
      await new Promise((resolve) => second.stdout.once('data', resolve));
      // the second has opened the file and waits for the lock; the first now migrates and commits
      await new Promise((r) => setTimeout(r, holdMs));
      for (const m of MIGRATIONS) first.exec(m);
      first.pragma(`user_version = ${MIGRATIONS.length}`);
      first.exec('COMMIT');
      expect(await exited, stderr).to.equal(0);
      expect(first.pragma('user_version', { simple: true })).to.equal(MIGRATIONS.length);
    } finally {
      first.close();
      await fs.rm(dir, { recursive: true, force: true });
    }
  }

  it('keeps the outputs of the tasks stored before outputs left the task’s document for a column of their own', async () => {
    // the version whose next migration moves the outputs
    const before = MIGRATIONS.findIndex((m) => m.includes('ALTER TABLE tasks ADD COLUMN output'));
    expect(before).to.be.above(0);
    const dir = await fs.mkdtemp(path.join(os.tmpdir(), 'migrate-'));
    const file = path.join(dir, 'service.db');
    try {
      const old = new Database(file);
      old.transaction(() => {
        for (const m of MIGRATIONS.slice(0, before)) old.exec(m);
        old.pragma(`user_version = ${before}`);
      })();
      const doc = (id: string, output: unknown) =>
        JSON.stringify({
          id,
          tenant_id: 't1',
          session_id: 'ses_1',
          status: output ? 'succeeded' : 'pending',
          run_ids: [],
          created_at: id,
          updated_at: id,
          output,
        });
      const put = old.prepare("INSERT INTO tasks (tenant_id, session_id, id, status, created_at, updated_at, doc) VALUES ('t1', 'ses_1', ?, ?, ?, ?, ?)");
      const output = { status: 'succeeded', steps: [{ tool: 'shell', output: { stdout: 'x'.repeat(100_000) } }] };
      put.run('a', 'succeeded', 'a', 'a', doc('a', output));
      put.run('b', 'pending', 'b', 'b', doc('b', null));
      // an output nested deeper than SQLite's JSON functions read (a tool's answer): it stays in its document
      let deep: unknown = 'bottom';
      for (let i = 0; i < 1100; i++) deep = [deep];
      const nested = { status: 'succeeded', steps: [{ tool: 'http', output: deep }] };
      put.run('c', 'succeeded', 'c', 'c', doc('c', nested));
      old.close();

      const store = openSqliteStore(file);
      try {
        expect((await store.tasks.get('t1', 'ses_1', 'a'))!.output).to.deep.equal(output);
        expect((await store.tasks.list('t1', 'ses_1')).map((t) => [t.id, t.output])).to.deep.equal([
          ['a', output],
          ['b', null],
          ['c', nested],
        ]);
        expect((await store.tasks.listBriefs('t1', 'ses_1')).map((t) => [t.id, 'output' in t])).to.deep.equal([
          ['a', false],
          ['b', false],
          ['c', false],
        ]);
        // its summary is read as none, not a failure of the whole list
        expect((await store.tasks.listSummaries('t1', 'ses_1')).map((t) => t.output)).to.deep.equal([{ status: 'succeeded' }, null, { status: 'succeeded' }]);
      } finally {
        await store.close();
      }
      const db = new Database(file, { readonly: true });
      try {
        expect(db.prepare("SELECT json_type(doc, '$.output') AS kept FROM tasks WHERE id = 'a'").get()).to.deep.equal({ kept: null });
      } finally {
        db.close();
      }
    } finally {
      await fs.rm(dir, { recursive: true, force: true });
    }
  });

  it('keeps the ledger payloads of a store from before they left WITHOUT ROWID, found by a unique index on the same key', async () => {
    // the version whose next migration rebuilds ledger_payloads as a rowid table
    const before = 32;
    expect(MIGRATIONS[before]).to.include('ALTER TABLE ledger_payloads_rowid RENAME TO ledger_payloads');
    const dir = await fs.mkdtemp(path.join(os.tmpdir(), 'migrate-'));
    const file = path.join(dir, 'service.db');
    try {
      const old = new Database(file);
      old.pragma('journal_mode = WAL');
      old.transaction(() => {
        for (const m of MIGRATIONS.slice(0, before)) old.exec(m);
        old.pragma(`user_version = ${before}`);
      })();
      const kept = [
        { tenant: 'acme', digest: 'sha256:aa', body: '{"gate":"test"}' },
        { tenant: 'acme', digest: 'sha256:bb', body: JSON.stringify({ artifact: 'x'.repeat(200_000) }) },
        { tenant: 'acme', digest: 'sha256:cc', body: '{"gate":"lint"}' },
        { tenant: 'other', digest: 'sha256:aa', body: '{"gate":"other"}' },
      ];
      const put = old.prepare('INSERT INTO ledger_payloads (tenant_id, digest, body) VALUES (?, ?, ?)');
      for (const p of kept) put.run(p.tenant, p.digest, p.body);
      old.close();

      const store = openSqliteStore(file);
      try {
        const found = await store.evidence.payloads('acme', ['sha256:cc', 'sha256:aa', 'sha256:bb', 'sha256:zz']);
        expect(found).to.deep.equal([
          { digest: 'sha256:cc', body: '{"gate":"lint"}' },
          { digest: 'sha256:aa', body: '{"gate":"test"}' },
          { digest: 'sha256:bb', body: kept[1]!.body },
        ]);
        expect(await store.evidence.payloads('other', ['sha256:aa'])).to.deep.equal([{ digest: 'sha256:aa', body: '{"gate":"other"}' }]);
        // a digest already kept is not written again; a new one is added
        await store.evidence.append('acme', () => [], [
          { digest: 'sha256:aa', body: '{"changed":true}' },
          { digest: 'sha256:dd', body: '{"gate":"new"}' },
        ]);
        expect(await store.evidence.payloads('acme', ['sha256:aa', 'sha256:dd'])).to.deep.equal([
          { digest: 'sha256:aa', body: '{"gate":"test"}' },
          { digest: 'sha256:dd', body: '{"gate":"new"}' },
        ]);
      } finally {
        await store.close();
      }

      const db = new Database(file, { readonly: true });
      try {
        expect(db.pragma('user_version', { simple: true })).to.equal(MIGRATIONS.length);
        const table = db.prepare<[], { sql: string }>("SELECT sql FROM sqlite_schema WHERE type = 'table' AND name = 'ledger_payloads'").get()!;
        expect(table.sql).not.to.match(/WITHOUT ROWID/i);
        expect(db.prepare('SELECT COUNT(*) AS n FROM ledger_payloads').get()).to.deep.equal({ n: 5 });
        const plan = db
          .prepare<[string, string], { detail: string }>('EXPLAIN QUERY PLAN SELECT digest, body FROM ledger_payloads WHERE tenant_id = ? AND digest = ?')
          .all('acme', 'sha256:aa');
        expect(plan.map((p) => p.detail)).to.deep.equal(['SEARCH ledger_payloads USING INDEX ledger_payloads_by_digest (tenant_id=? AND digest=?)']);
        const unique = db.prepare<[], { name: string; unique: number }>('SELECT name, "unique" FROM pragma_index_list(\'ledger_payloads\')').all();
        expect(unique).to.deep.equal([{ name: 'ledger_payloads_by_digest', unique: 1 }]);
        expect(db.prepare("SELECT name FROM pragma_index_info('ledger_payloads_by_digest') ORDER BY seqno").pluck().all()).to.deep.equal([
          'tenant_id',
          'digest',
        ]);
      } finally {
        db.close();
      }
    } finally {
      await fs.rm(dir, { recursive: true, force: true });
    }
  });
});
