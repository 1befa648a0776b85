import { Schema, type Model } from 'mongoose';
import type { ConnectionProvider, ConnectionRecord } from '../../platform/index.js';
import { decodeCursor, toPage, type ConnectionRepo } from '../port.js';
import { fromStored, isDuplicateKey, loose, toStored, type Stored } from './documents.js';
import type { Leases } from './leases.js';

export const connectionSchema = new Schema(
  { _id: String, tenant_id: { type: String, required: true }, provider: { type: String, required: true }, name: { type: String, required: true } },
  loose,
);
connectionSchema.index({ tenant_id: 1, name: 1 }, { unique: true });
connectionSchema.index({ tenant_id: 1, provider: 1, _id: 1 });

export function connectionRepo(model: Model<Stored<ConnectionRecord>>, leases: Leases): ConnectionRepo {
  const rows = async (tenantId: string, provider: ConnectionProvider | undefined, after: string | undefined, limit: number) => {
    const query = model.find({ tenant_id: tenantId, ...(provider ? { provider } : {}), ...(after ? { _id: { $gt: after } } : {}) }).sort({ _id: 1 });
    return (await (limit >= 0 ? query.limit(limit) : query).lean<Stored<ConnectionRecord>[]>()).map((r) => fromStored(r)!);
  };
  /** Whether a duplicate key is the id's (else the name's): the server names the index it met. */
  const onId = (err: unknown) => {
    const pattern = (err as { keyPattern?: object }).keyPattern;
    return pattern ? '_id' in pattern : /index: _id_ /.test(String((err as Error).message));
  };
  /**
   * Inserts one connection: false when the tenant has one of that name. A taken id is an error, as in SQLite, and
   * a failure that may have stored it all the same (a connection lost on the way) takes it back.
   */
  const insertNamed = async (c: ConnectionRecord): Promise<boolean> => {
    try {
      await model.collection.insertOne(toStored(c) as never);
      return true;
    } catch (err) {
      if (isDuplicateKey(err) && !onId(err)) return false;
      if (!isDuplicateKey(err)) await model.deleteOne({ _id: c.id }).catch(() => undefined);
      throw err;
    }
  };
  return {
    async insert(c, cap) {
      if (!cap) return insertNamed(c);
      // counted and inserted under the tenant's lease: its capped inserts take turns, as in SQLite's IMMEDIATE transaction
      const done = await leases.insertHeld(
        `connections:${c.tenant_id}`,
        async () => ((await model.countDocuments({ tenant_id: c.tenant_id }).read('primary')) >= cap.maxHeld ? 'over-cap' : null),
        async () => ((await insertNamed(c)) ? 'inserted' : 'name-taken'),
      );
      return done === 'over-cap' ? 'over-cap' : done === 'inserted';
    },
    async get(tenantId, id) {
      return fromStored(await model.findOne({ _id: id, tenant_id: tenantId }).lean<Stored<ConnectionRecord>>());
    },
    async getByName(tenantId, name) {
      return fromStored(await model.findOne({ tenant_id: tenantId, name }).lean<Stored<ConnectionRecord>>());
    },
    async list(tenantId, provider, limit = -1) {
      return rows(tenantId, provider, undefined, limit);
    },
    async page(tenantId, q) {
      return toPage(await rows(tenantId, q.provider, decodeCursor(q.cursor, 'connections'), q.limit + 1), q.limit, 'connections');
    },
    async update(tenantId, id, changes, when) {
      const unchanged = when ? { base_url: when.base_url, 'sealed.iv': when.sealed.iv, 'sealed.ct': when.sealed.ct, settings: when.settings } : {};
      try {
        const row = await model
          .findOneAndUpdate({ _id: id, tenant_id: tenantId, ...unchanged }, { $set: changes }, { returnDocument: 'after' })
          .lean<Stored<ConnectionRecord>>();
        return fromStored(row);
      } catch (err) {
        if (isDuplicateKey(err)) return 'name-taken';
        throw err;
      }
    },
    async delete(tenantId, id) {
      return (await model.deleteOne({ _id: id, tenant_id: tenantId })).deletedCount === 1;
    },
  };
}
