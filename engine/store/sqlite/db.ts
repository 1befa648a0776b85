// Opens the SQLite file: WAL, a busy timeout for several processes on one file, and the migrations.
import fs from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';
import { Worker } from 'node:worker_threads';
import Database from 'better-sqlite3';
import { MIGRATIONS } from './migrations.js';

export type Db = Database.Database;

/** Larger than any id: a page without a cursor starts below it. */
export const TOP = '\uffff';

/** How long a statement waits for another process's write lock before it fails with SQLITE_BUSY. */
export const BUSY_TIMEOUT_MS = 5000;
/** What the write-ahead log keeps of its file once checkpointed (SQLite truncates it to this). */
const WAL_SIZE_LIMIT_BYTES = 16 * 1024 * 1024;

export function openDatabase(file: string): Db {
  if (file !== ':memory:') fs.mkdirSync(path.dirname(file), { recursive: true });
  const db = new Database(file);
  db.pragma('journal_mode = WAL');
  db.pragma('synchronous = NORMAL');
  db.pragma(`busy_timeout = ${BUSY_TIMEOUT_MS}`);
  db.pragma('foreign_keys = ON');
  // the write-ahead log is cut back to this once checkpointed: a burst of writes does not leave it at its peak for good
  db.pragma(`journal_size_limit = ${WAL_SIZE_LIMIT_BYTES}`);
  migrate(db);
  return db;
}

/** How often the checkpointer copies the write-ahead log into the database file. */
const CHECKPOINT_EVERY_MS = 250;

// The checkpointer's thread: its own connection, a PASSIVE checkpoint now and then (it waits for no
// reader or writer, and copies what it can), until it is told to stop.
const CHECKPOINTER = `
const { parentPort, workerData } = require('node:worker_threads');
const Database = require(workerData.module);
const db = new Database(workerData.file, { fileMustExist: true });
db.pragma('busy_timeout = 100');
const timer = setInterval(() => {
  try { db.pragma('wal_checkpoint(PASSIVE)'); } catch {}
}, workerData.everyMs);
parentPort.once('message', () => {
  clearInterval(timer);
  db.close();
  parentPort.close();
});`;

export type Checkpointer = { stop(): Promise<void> };

/**
 * Moves the write-ahead log's checkpoints off the event loop. By default SQLite checkpoints inside the
 * commit that takes the log past 1,000 pages: that commit then copies the pages and syncs the file, a
 * few milliseconds during which the process answers nothing (the slowest percent of run starts). A
 * thread of its own checkpoints instead; if it cannot run, the connection checkpoints as before.
 */
export function startCheckpointer(db: Db, onFailure: (err: Error) => void): Checkpointer | null {
  if (db.memory) return null;
  db.pragma('wal_autocheckpoint = 0');
  let failed = false;
  const fallBack = (err: Error) => {
    if (failed) return; // an error is followed by the exit
    failed = true;
    if (db.open) db.pragma('wal_autocheckpoint = 1000');
    onFailure(err);
  };
  const module = createRequire(import.meta.url).resolve('better-sqlite3');
  const worker = new Worker(CHECKPOINTER, { eval: true, workerData: { file: db.name, module, everyMs: CHECKPOINT_EVERY_MS } });
  worker.unref();
  let stopped: Promise<unknown> | null = null;
  const exited = new Promise((resolve) => worker.once('exit', resolve));
  worker.once('error', fallBack);
  worker.once('exit', (code) => {
    if (!stopped) fallBack(new Error(`the checkpointer thread exited (${code})`));
  });
  return {
    stop() {
      if (!stopped) {
        worker.ref(); // a process closing its store waits for the thread, even with nothing else left to do
        worker.postMessage('stop');
        stopped = exited;
      }
      return stopped.then(() => undefined);
    },
  };
}

/**
 * Applies the migrations not yet applied. The version is read inside the write transaction: of two
 * processes opening a new file at once (the Procfile's web and worker), the second waits for the first
 * and then finds nothing left to do.
 */
/**
 * How long a process starting waits for another's migrations (the Procfile's web and worker start together):
 * one that rebuilds a table copies it, some 70 MB a second, so BUSY_TIMEOUT_MS alone failed the start of the
 * second process on a store of over 350 MB.
 */
export const MIGRATION_WAIT_MS = 10 * 60_000;

function migrate(db: Db): void {
  const apply = db.transaction(() => {
    const current = db.pragma('user_version', { simple: true }) as number;
    for (let v = current; v < MIGRATIONS.length; v++) {
      db.exec(MIGRATIONS[v]!);
      db.pragma(`user_version = ${v + 1}`);
    }
  });
  for (const started = Date.now(); ;) {
    try {
      return void apply.immediate();
    } catch (err) {
      // each try waits BUSY_TIMEOUT_MS for the lock
      if ((err as { code?: string }).code !== 'SQLITE_BUSY' || Date.now() - started >= MIGRATION_WAIT_MS) throw err;
    }
  }
}

/**
 * Group commit: writes asked for in the same turn of the event loop run in one transaction, so a burst
 * pays for one commit (its WAL write) rather than one each. Each caller learns its result only after
 * the commit. A batch that fails is written again one write a transaction, so a bad write fails only
 * its own caller. A write is a function of what the file holds, so writing it again is safe.
 *
 * The write lock is taken without waiting: while another process (the Procfile's web and workers share
 * the file) holds it, SQLite's own busy timeout would sleep on the event loop, 1 to 100 ms a try, and the
 * process would answer nothing meanwhile. Instead the writes are tried again a moment later, the event
 * loop free in between, and the writes asked for meanwhile join them; a write that has waited
 * BUSY_TIMEOUT_MS fails.
 */
export function groupCommit(db: Db): GroupCommit {
  let shared = commits.get(db);
  if (!shared) commits.set(db, (shared = makeGroupCommit(db)));
  return shared;
}

export type GroupCommit = {
  <T>(write: () => T): Promise<T>;
  /** resolves once every write asked for so far has been committed or has failed (before the file is closed) */
  drain(): Promise<void>;
  /** the last write the file itself refused (full, read-only, an I/O error, not a database), or null */
  lastStorageFailure(): { at: number; code: string } | null;
};

/** What a write fails with when the file cannot take it, whatever the write: the disk, its permissions, the file. */
const STORAGE_FAILURE = /^SQLITE_(FULL|IOERR|READONLY|CANTOPEN|CORRUPT|NOTADB|PERM)/;

/** one group per file: the repositories of a store share its batches */
const commits = new WeakMap<Db, GroupCommit>();

const isBusy = (err: unknown) => String((err as { code?: unknown } | null)?.code ?? '').startsWith('SQLITE_BUSY');

function makeGroupCommit(db: Db): GroupCommit {
  type Pending = { write: () => unknown; resolve(v: unknown): void; reject(e: unknown): void; since: number };
  /** the writes not yet tried, in the order asked for */
  let batch: Pending[] = [];
  let scheduled = false;
  const drained: (() => void)[] = [];
  const all = db.transaction((items: Pending[]) => items.map((p) => p.write()));
  const one = db.transaction((p: Pending) => p.write());
  /**
   * Runs the transaction at once, or throws SQLITE_BUSY when another connection holds the write lock.
   * (Not a prepared statement: SQLite sets busy_timeout when the PRAGMA is prepared, not when it runs.)
   */
  const now = <R>(tx: () => R): R => {
    db.pragma('busy_timeout = 0');
    try {
      return tx();
    } finally {
      db.pragma(`busy_timeout = ${BUSY_TIMEOUT_MS}`);
    }
  };
  let storageFailure: { at: number; code: string } | null = null;
  /** how many writes the last flush took: more than one, and writes are coming from several callers at once */
  let lastFlushed = 0;
  /**
   * The flush waits for the end of this pass of the event loop; while the last flush took more than one
   * write, for the end of the next pass too, so the writes of the I/O callbacks read in it (the Redis and
   * BullMQ replies of other runs) join the same commit. A commit's cost grows far slower than its writes
   * (the same index pages, the counts' page, the log's frames and locks: the writes of ten no-op runs
   * took 1.6 times those of one, 250 against 152 µs a commit), so fewer, larger commits cost less a
   * write: over 5,000 no-op runs through the workers, 0.52 commits a run against 0.64. After a flush of
   * one write (a quiet process), the next is not held.
   */
  const schedule = (later: boolean) => {
    scheduled = true;
    if (later) setTimeout(flush, 1);
    else if (lastFlushed > 1) setImmediate(() => setImmediate(flush));
    else setImmediate(flush);
  };
  /**
   * The lock is taken: the writes that have waited their full time fail; the others go back in front of
   * those asked for since, to be tried again in a moment.
   */
  const wait = (items: Pending[], err: unknown): true => {
    const expired = Date.now() - BUSY_TIMEOUT_MS;
    for (const p of items) if (p.since <= expired) p.reject(err);
    batch = items.filter((p) => p.since > expired).concat(batch);
    return true;
  };
  const flush = () => {
    scheduled = false;
    const items = batch;
    batch = [];
    lastFlushed = items.length;
    let locked = false;
    if (!db.open) {
      for (const p of items) p.reject(new Error('the store is closed'));
    } else {
      try {
        const results = now(() => all.immediate(items));
        items.forEach((p, i) => p.resolve(results[i]));
      } catch (err) {
        locked = isBusy(err) ? wait(items, err) : oneByOne(items);
      }
    }
    if (batch.length) schedule(locked);
    else for (const done of drained.splice(0)) done();
  };
  /**
   * A batch that failed for another reason than the lock: each write alone, so a bad one fails only
   * itself. True when the lock was taken meanwhile (the writes left wait for it).
   */
  const oneByOne = (items: Pending[]): boolean => {
    for (const [i, p] of items.entries()) {
      try {
        p.resolve(now(() => one.immediate(p)));
      } catch (err) {
        if (!isBusy(err)) {
          const code = String((err as { code?: unknown } | null)?.code ?? '');
          if (STORAGE_FAILURE.test(code)) storageFailure = { at: Date.now(), code };
          p.reject(err);
          continue;
        }
        return wait(items.slice(i), err);
      }
    }
    return false;
  };
  const commit = <T>(write: () => T) =>
    new Promise<T>((resolve, reject) => {
      batch.push({ write, resolve: resolve as (v: unknown) => void, reject, since: Date.now() });
      if (!scheduled) schedule(false);
    });
  return Object.assign(commit, {
    drain: () => (batch.length || scheduled ? new Promise<void>((resolve) => drained.push(resolve)) : Promise.resolve()),
    lastStorageFailure: () => storageFailure,
  });
}
