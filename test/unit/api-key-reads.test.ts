// Where the MongoDB store reads a request's API key from (no MongoDB needed: the query is stopped by a
// hook before it is sent, and its options read). The contract suite runs the store itself when MONGODB_URI is set.
import { expect } from 'chai';
import mongoose from 'mongoose';
import { apiKeySchema, apiKeyRepo } from '../../engine/store/mongo/api-keys.js';
import type { Leases } from '../../engine/store/mongo/leases.js';

describe('MongoDB api key reads', () => {
  it('reads a key by its hash from the primary, so a key revoked there is not let in by a lagging secondary', async () => {
    const conn = mongoose.createConnection(); // never opened: nothing is sent
    const schema = apiKeySchema.clone();
    const seen: unknown[] = [];
    schema.pre('findOne', function () {
      seen.push(this.getOptions().readPreference);
      throw new Error('stopped before it was sent');
    });
    try {
      const repo = apiKeyRepo(conn.model('ApiKeyReads', schema) as never, {} as Leases);
      expect(await repo.findByHash('ab'.repeat(32)).catch((err: Error) => err.message)).to.equal('stopped before it was sent');
      expect(seen.map((p) => (p as { mode?: string } | undefined)?.mode)).to.deep.equal(['primary']);
    } finally {
      await conn.close();
    }
  });
});
