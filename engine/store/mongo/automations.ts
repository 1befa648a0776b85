import { Schema, type Model } from 'mongoose';
import type { Automation } from '../../platform/index.js';
import type { AutomationRepo, CappedInsert, IdempotencyKeyRepo } from '../port.js';
import { memberOperators } from '../members.js';
import { definedOnly, fromStored, insertOneOrNone, isDuplicateKey, loose, pageOf, type Stored } from './documents.js';
import type { Leases } from './leases.js';

export const automationSchema = new Schema({ _id: String, tenant_id: { type: String, required: true }, status: { type: String, required: true } }, loose);
automationSchema.index({ tenant_id: 1, _id: -1 });
automationSchema.index({ tenant_id: 1, status: 1, _id: -1 });
// the enabled automations with a trigger of a type, of every tenant (the file watcher, the cron reconcile) or of one (a webhook)
automationSchema.index({ 'triggers.type': 1, status: 1, _id: 1 });
automationSchema.index({ tenant_id: 1, 'triggers.type': 1, status: 1, _id: 1 });

/** `keys`: where a create's Idempotency-Key is taken, before its automation is stored (MongoDB has no transaction here). */
export function automationRepo(model: Model<Stored<Automation>>, leases: Leases, keys: IdempotencyKeyRepo): AutomationRepo {
  // an empty list of statuses is none given, as in SQLite (an `$in` of nothing would match nothing)
  const list: AutomationRepo['list'] = (tenantId, q) =>
    pageOf(model, { tenant_id: tenantId, status: q.statuses?.length ? { $in: q.statuses } : { $ne: 'archived' } }, q);
  const countLive = (tenantId: string) => model.countDocuments({ tenant_id: tenantId, status: { $ne: 'archived' } });

  const insert = (a: Automation, cap?: { maxLive: number }): Promise<CappedInsert> => {
    if (!cap || a.status === 'archived') return insertOneOrNone(model, a);
    // counted and inserted under the tenant's lease: its capped inserts take turns, as in SQLite's IMMEDIATE transaction
    return leases.insertHeld(
      `automations:${a.tenant_id}`,
      async () => ((await countLive(a.tenant_id).read('primary')) >= cap.maxLive ? 'over-cap' : null),
      () => insertOneOrNone(model, a),
    );
  };

  return {
    insert,
    async insertWithKey(a, key, cap) {
      // as the runs' insert: the key first, then the automation, and the key let go when the automation is not stored
      const held = await keys.claim(key.record, key.since, key.pendingSince);
      if (held) return held;
      const letGo = () => keys.release(a.tenant_id, key.record.key_digest, a.id).catch(() => undefined);
      try {
        const done = await insert(a, cap);
        if (done === 'over-cap') await letGo();
        return done;
      } catch (err) {
        // a failure that may have stored the automation all the same: it is taken back, then the key let go (if
        // it cannot be taken back, its record stays: a claim sees the automation and answers it). A process that
        // dies here leaves a record that a later claim takes over once the claim's lifetime is past.
        if (!isDuplicateKey(err)) {
          const gone = await model
            .deleteOne({ _id: a.id, tenant_id: a.tenant_id })
            .then(() => true)
            .catch(() => false);
          if (gone) await letGo();
        }
        throw err;
      }
    },
    async get(tenantId, id) {
      return fromStored(await model.findOne({ _id: id, tenant_id: tenantId }).lean<Stored<Automation>>());
    },
    list,
    async listJson(tenantId, q) {
      const page = await list(tenantId, q);
      return { items: page.items.map((a) => ({ id: a.id, json: JSON.stringify(a) })), next_cursor: page.next_cursor };
    },
    async update(tenantId, id, changes, ifStatusIn, members) {
      const { $set, ...unset } = memberOperators(members);
      const updated = await model
        .findOneAndUpdate(
          { _id: id, tenant_id: tenantId, status: { $in: ifStatusIn } },
          { $set: { ...definedOnly(changes), ...$set }, ...unset },
          { returnDocument: 'after' },
        )
        .lean<Stored<Automation>>();
      return fromStored(updated);
    },
    countLive,
    async listEnabledWithTrigger(type, tenantId) {
      const filter: Record<string, unknown> = { status: 'enabled', 'triggers.type': type, ...(tenantId === undefined ? {} : { tenant_id: tenantId }) };
      const rows = await model.find(filter).sort({ _id: 1 }).lean<Stored<Automation>[]>();
      return rows.map((r) => fromStored(r)!);
    },
  };
}
