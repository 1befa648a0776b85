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

/**
 * Group commit: writes asked for in the same turn of the event loop run in one transaction, so a burst
 * pays for one commit (its WAL write) rather than one each. Each caller learns its result only after
 * the commit. A batch that fails is written again one write a transaction, so a bad write fails only
 * its own caller. A write is a function of what the file holds, so writing it again is safe.
 */
export function groupCommit(db: Db): <T>(write: () => T) => Promise<T> {
  let shared = commits.get(db);
  if (!shared) commits.set(db, (shared = makeGroupCommit(db)));
  return shared;
}

/** one group per file: the repositories of a store share its batches */
const commits = new WeakMap<Db, <T>(write: () => T) => Promise<T>>();

function makeGroupCommit(db: Db): <T>(write: () => T) => Promise<T> {
  type Pending = { write: () => unknown; resolve(v: unknown): void; reject(e: unknown): void };
  let batch: Pending[] = [];
  const all = db.transaction((items: Pending[]) => items.map((p) => p.write()));
  const one = db.transaction((p: Pending) => p.write());
  const flush = () => {
    const items = batch;
    batch = [];
    try {
      const results = all.immediate(items);
      items.forEach((p, i) => p.resolve(results[i]));
    } catch {
      for (const p of items) {
        try {
          p.resolve(one.immediate(p));
        } catch (err) {
          p.reject(err);
        }
      }
    }
  };
  return <T>(write: () => T) =>
    new Promise<T>((resolve, reject) => {
      if (batch.push({ write, resolve: resolve as (v: unknown) => void, reject }) === 1) setImmediate(flush);
    });
}
