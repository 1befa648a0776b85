// Two processes opening one new SQLite file at once (the Procfile's web and worker on a fresh data
// dir): the second must wait for the first's migrations and find nothing left to do, not apply them
// again from the version it read before it had the lock.
import { spawn } from 'node:child_process';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import Database from 'better-sqlite3';
import { expect } from 'chai';
import { MIGRATIONS } from '../../engine/store/sqlite/migrations.js';

describe('sqlite migrations', function () {
  this.timeout(30_000);

  it('are applied once when another process migrates the file while this one waits for the lock', async () => {
    const dir = await fs.mkdtemp(path.join(os.tmpdir(), 'migrate-'));
    const file = path.join(dir, 'service.db');
    const first = new Database(file);
    try {
      first.pragma('journal_mode = WAL');
      first.exec('BEGIN IMMEDIATE'); // the first process has the write lock, its migrations not yet written
      const script = `import('./engine/store/sqlite/db.ts').then(({ openDatabase }) => { openDatabase(${JSON.stringify(file)}).close(); })`;
      const second = spawn(process.execPath, ['--import', 'tsx', '-e', script], { stdio: ['ignore', 'ignore', 'pipe'] });
      let stderr = '';
      second.stderr.on('data', (d) => (stderr += d));
      const exited = new Promise<number | null>((resolve) => second.on('exit', resolve));
      // the second has opened the file and waits for the lock; the first now migrates and commits
      await new Promise((r) => setTimeout(r, 1500));
      for (const m of MIGRATIONS) first.exec(m);
      first.pragma(`user_version = ${MIGRATIONS.length}`);
      first.exec('COMMIT');
      expect(await exited, stderr).to.equal(0);
      expect(first.pragma('user_version', { simple: true })).to.equal(MIGRATIONS.length);
    } finally {
      first.close();
      await fs.rm(dir, { recursive: true, force: true });
    }
  });
});
