// Runs the store contract against MongoDB when MONGODB_URI is set; otherwise says it skipped.
import { randomBytes } from 'node:crypto';
import mongoose from 'mongoose';
import { openMongoStore } from '../../engine/store/mongo/index.js';
import { storeContract } from './store-contract.js';

const uri = process.env.MONGODB_URI;

if (!uri) {
  describe('MongoDB store', () => {
    it('runs the store contract against MongoDB (skipped: MONGODB_URI is not set)', function () {
      console.log('      MongoDB contract suite skipped: set MONGODB_URI to run it against a MongoDB server');
      this.skip();
    });
  });
} else {
  describe('MongoDB store', () => {
    const databases: string[] = [];
    after(async () => {
      for (const db of databases) {
        const conn = await mongoose.createConnection(withDatabase(uri, db)).asPromise();
        await conn.dropDatabase();
        await conn.close();
      }
    });
    storeContract('mongo', async () => {
      const db = `svc_test_${randomBytes(4).toString('hex')}`;
      databases.push(db);
      return openMongoStore(withDatabase(uri, db));
    });
  });
}

function withDatabase(base: string, db: string): string {
  const u = new URL(base);
  u.pathname = `/${db}`;
  return u.toString();
}
