// Chooses the adapter: MongoDB when a URI is given, else SQLite under the data directory.
import path from 'node:path';
import type { Store } from './port.js';
import { openSqliteStore } from './sqlite/index.js';

export type StoreOptions = {
  mongodbUri: string | undefined;
  dataDir: string;
  /** told when SQLite's checkpointer thread cannot run (its connection then checkpoints itself) */
  onCheckpointerFailure?: (err: Error) => void;
};

export async function openStore(opts: StoreOptions): Promise<Store> {
  // mongoose (about 10 MB of heap, which every full collection walks) is loaded only when it is used
  if (opts.mongodbUri) return (await import('./mongo/index.js')).openMongoStore(opts.mongodbUri);
  return openSqliteStore(path.join(opts.dataDir, 'service.sqlite'), opts.onCheckpointerFailure);
}

export type { Store } from './port.js';
