// Leases: one capped insert at a time in a scope (a tenant's automations or notification endpoints, a session's tasks), across
// processes, so what it counts is what it inserts against, without a multi-document transaction. A
// scope's lease is one document of store_leases; taking it is one conditional write.
import { randomUUID } from 'node:crypto';
import { Schema, type Model } from 'mongoose';
import { ServiceUnavailableError } from '../../platform/index.js';
import { isDuplicateKey, loose } from './documents.js';

/** A scope's lease (`_id` the scope): free once `until` has passed, whoever `holder` was. */
export type StoredLease = { _id: string; holder: string; until: Date };

export const leaseSchema = new Schema({ _id: String, holder: String, until: Date }, loose);
// released (until the epoch) or let go, a lease is forgotten by MongoDB's TTL monitor, not kept for every session there was
leaseSchema.index({ until: 1 }, { expireAfterSeconds: 0 });

/** How long a hold lasts unless renewed: a process that dies holding a lease holds it no longer than this. */
export const LEASE_MS = 30_000;
/** While its write runs, a holder renews its hold this often: a slow write keeps it, a dead holder does not. */
const RENEW_MS = LEASE_MS / 3;
/** The insert begins only while the hold is known to last this much longer, so it lands while the hold is ours. */
const LANDING_MS = LEASE_MS / 3;
/** How long a capped insert waits for its scope's lease before it answers 503. */
const WAIT_MS = 5_000;
/** The pause between tries of a held lease: random, so that waiters do not try in step. */
const POLL_MS = 25;
/** As the store's other 503s. */
const RETRY_AFTER_SECONDS = 5;

const busy = () => new ServiceUnavailableError('the store is taking other inserts that count against the same limit; retry shortly', RETRY_AFTER_SECONDS);

export type Leases = {
  /**
   * Under the scope's lease: `check` (what refuses the insert, in the order SQLite's transaction refuses it),
   * then, when it refuses nothing, `insert`, which leaves nothing of itself when it throws. Capped inserts
   * of one scope take turns, so nothing refused is ever stored, not for a moment. A lease not had within
   * WAIT_MS is a ServiceUnavailableError (503, Retry-After): the scope is busy, not full.
   */
  insertHeld<R extends string>(scope: string, check: () => Promise<R | null>, insert: () => Promise<'inserted' | R>): Promise<'inserted' | R>;
};

export function leasesOf(model: Model<StoredLease>): Leases {
  /** Takes the scope's lease for `holder`; the time its hold lasts until. */
  const take = async (scope: string, holder: string): Promise<number> => {
    const deadline = Date.now() + WAIT_MS;
    for (;;) {
      const now = Date.now();
      try {
        // matches a lease that has passed; one still held is not matched, and the upsert's insert of its
        // `_id` is refused (E11000). No lease yet: the upsert makes it, and of two at once one is refused
        await model.updateOne({ _id: scope, until: { $lt: new Date(now) } }, { $set: { holder, until: new Date(now + LEASE_MS) } }, { upsert: true });
        return now + LEASE_MS;
      } catch (err) {
        if (!isDuplicateKey(err)) throw err;
      }
      if (Date.now() >= deadline) throw busy();
      await new Promise((resolve) => setTimeout(resolve, 5 + Math.random() * POLL_MS));
    }
  };

  return {
    async insertHeld(scope, check, insert) {
      const holder = randomUUID();
      let until = await take(scope, holder);
      // each filter names the holder: a hold that expired and was taken since is the new holder's. A renewal
      // matches only a hold not released, so one that lands late does not take the lease back
      let renewing: Promise<unknown> = Promise.resolve();
      const renewal = setInterval(() => {
        const next = Date.now() + LEASE_MS;
        renewing = model.updateOne({ _id: scope, holder, until: { $gt: new Date(0) } }, { $set: { until: new Date(next) } }).then(
          (r) => {
            if (r.matchedCount === 1) until = next;
          },
          () => undefined,
        );
      }, RENEW_MS);
      renewal.unref();
      try {
        const refused = await check();
        if (refused !== null) return refused;
        // the count is good while the hold is: an insert begun as the hold may run out could land after
        // another writer took it and counted without this one
        if (Date.now() + LANDING_MS > until) throw busy();
        return await insert();
      } finally {
        clearInterval(renewal);
        await renewing;
        // a release that fails leaves the lease to expire by itself; the insert's answer stands
        await model.updateOne({ _id: scope, holder }, { $set: { until: new Date(0) } }).catch(() => undefined);
      }
    },
  };
}
