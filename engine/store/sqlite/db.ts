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
