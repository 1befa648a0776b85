// Chooses the adapter: MongoDB when a URI is given, else SQLite under the data directory.
import path from 'node:path';
import { openMongoStore } from './mongo/index.js';
import type { Store } from './port.js';
import { openSqliteStore } from './sqlite/index.js';

export type StoreOptions = { mongodbUri: string | undefined; dataDir: string };

export async function openStore(opts: StoreOptions): Promise<Store> {
  if (opts.mongodbUri) return openMongoStore(opts.mongodbUri);
  return openSqliteStore(path.join(opts.dataDir, 'service.sqlite'));
}

export type { Store } from './port.js';
