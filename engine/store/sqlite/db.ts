// Opens the SQLite file: WAL, a busy timeout for several processes on one file, and the migrations.
import fs from 'node:fs';
import path from 'node:path';
import Database from 'better-sqlite3';
import { MIGRATIONS } from './migrations.js';

export type Db = Database.Database;

/** Larger than any id: a page without a cursor starts below it. */
export const TOP = '\uffff';

export function openDatabase(file: string): Db {
  if (file !== ':memory:') fs.mkdirSync(path.dirname(file), { recursive: true });
  const db = new Database(file);
  db.pragma('journal_mode = WAL');
  db.pragma('synchronous = NORMAL');
  db.pragma('busy_timeout = 5000');
  db.pragma('foreign_keys = ON');
  migrate(db);
  return db;
}

/**
 * Applies the migrations not yet applied. The version is read inside the write transaction: of two
 * processes opening a new file at once (the Procfile's web and worker), the second waits for the first
 * and then finds nothing left to do.
 */
function migrate(db: Db): void {
  const apply = db.transaction(() => {
    const current = db.pragma('user_version', { simple: true }) as number;
    for (let v = current; v < MIGRATIONS.length; v++) {
      db.exec(MIGRATIONS[v]!);
      db.pragma(`user_version = ${v + 1}`);
    }
  });
  apply.immediate();
}
