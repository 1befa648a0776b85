// Chooses the adapter: MongoDB when a URI is given, else SQLite under the data directory.
import path from 'node:path';
import type { Store } from './port.js';

export type StoreOptions = { mongodbUri: string | undefined; dataDir: string };

export async function openStore(opts: StoreOptions): Promise<Store> {
  if (opts.mongodbUri) {
    const { openMongoStore } = await import('./mongo/index.js');
    return openMongoStore(opts.mongodbUri);
  }
  const { openSqliteStore } = await import('./sqlite/index.js');
  return openSqliteStore(path.join(opts.dataDir, 'service.sqlite'));
}

export type { Store } from './port.js';
