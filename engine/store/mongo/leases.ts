// Leases: one capped insert at a time in a scope (a tenant's automations, a session's tasks and agents, a
// tenant's notification endpoints), across processes, so what it counts is what it inserts against, without a
// multi-document transaction. A scope's lease is one document of store_leases; taking it is one conditional
// write. Time is the server's (`$$NOW`): whether a lease has run out is judged by one clock, the same one
// the TTL index forgets released leases by, whatever the clocks of the processes that hold them say.
import { randomUUID } from 'node:crypto';
import { Schema, type Model } from 'mongoose';
import { ServiceUnavailableError } from '../../platform/index.js';
import { isDuplicateKey, loose } from './documents.js';

/** A scope's lease (`_id` the scope): free once `until` has passed on the server's clock, whoever `holder` was. */
export type StoredLease = { _id: string; holder: string; until: Date };

export const leaseSchema = new Schema({ _id: String, holder: String, until: Date }, loose);
// released (until the epoch) or let go, a lease is forgotten by MongoDB's TTL monitor, not kept for every session there was
leaseSchema.index({ until: 1 }, { expireAfterSeconds: 0 });

/** How long a hold lasts unless renewed: a process that dies holding a lease holds it no longer than this. */
const LEASE_MS = 30_000;
/** While its write runs, a holder renews its hold this often: a slow write keeps it, a dead holder does not. */
const RENEW_MS = LEASE_MS / 3;
/** The insert begins only while the hold is known to last this much longer, so it lands while the hold is ours. */
const LANDING_MS = LEASE_MS / 3;
/** How long a capped insert waits for its scope's lease before it answers 503. */
const WAIT_MS = 5_000;
/** The pauses between tries of a held lease: doubling from the first to the last, each drawn at random below it. */
const POLL_FIRST_MS = 10;
const POLL_MOST_MS = 250;
/** As the store's other 503s. */
const RETRY_AFTER_SECONDS = 5;

const busy = () => new ServiceUnavailableError('the store is taking other inserts that count against the same limit; retry shortly', RETRY_AFTER_SECONDS);

/** A lease that has run out on the server's clock (or was never held: no `until`, which sorts below any date). */
const RUN_OUT = { $lt: ['$until', '$$NOW'] };

/**
 * The scope of a session's capped inserts, its task batches and its agents, which take turns in it. Its name is
 * the one task batches had before agents shared it, kept so that in a rolling deploy the processes of both
 * versions take the same lease of a session, not two.
 */
export const sessionScope = (tenantId: string, sessionId: string) => `tasks:${tenantId}:${sessionId}`;

export type Leases = {
  /**
   * Under the scope's lease: `check` (what refuses the insert, in the order SQLite's transaction refuses it),
   * then, when it refuses nothing, `insert`, which leaves nothing of itself when it throws. Capped inserts
   * of one scope take turns, so nothing refused is stored while the holds last (an insert held up on the
   * way for longer than LEASE_MS, by a partition say, can land after the next holder counted). A lease not
   * had within WAIT_MS is a ServiceUnavailableError (503, Retry-After): the scope is busy, not full.
   */
  insertHeld<R extends string>(scope: string, check: () => Promise<R | null>, insert: () => Promise<'inserted' | R>): Promise<'inserted' | R>;
};

export function leasesOf(model: Model<StoredLease>): Leases {
  // the driver's own collection: mongoose takes an update pipeline only when told to, and casts nothing here
  const leases = model.collection;
  const release = (scope: string, holder: string) => leases.updateOne({ _id: scope, holder } as never, { $set: { until: new Date(0) } }).catch(() => undefined);

  /**
   * Takes the scope's lease for `holder`: when the server finds it run out, one write makes it ours until the
   * server's now + LEASE_MS. Answers the local time (`performance.now()`, read before the write was sent,
   * so never later than the server's) the hold lasts until.
   */
  const take = async (scope: string, holder: string): Promise<number> => {
    const deadline = performance.now() + WAIT_MS;
    for (let pause = POLL_FIRST_MS; ; pause = Math.min(POLL_MOST_MS, pause * 2)) {
      const sent = performance.now();
      try {
        const lease = await leases.findOneAndUpdate(
          { _id: scope } as never,
          [{ $set: { holder: { $cond: [RUN_OUT, holder, '$holder'] }, until: { $cond: [RUN_OUT, { $add: ['$$NOW', LEASE_MS] }, '$until'] } } }],
          { upsert: true, returnDocument: 'after' },
        );
        if (lease?.holder === holder) return sent + LEASE_MS;
      } catch (err) {
        // two first takes of a scope at once: one makes the document, the other is refused it and tries again.
        // Anything else may have taken it all the same (a reply lost on the way): it is given back
        if (!isDuplicateKey(err)) {
          await release(scope, holder);
          throw err;
        }
      }
      if (performance.now() >= deadline) throw busy();
      await new Promise((resolve) => setTimeout(resolve, Math.random() * pause));
    }
  };

  return {
    async insertHeld(scope, check, insert) {
      const holder = randomUUID();
      let until = await take(scope, holder);
      // a renewal names the holder and a hold not released: one that lands after the release, or after the
      // lease was lost and taken by another, takes nothing back. One that finds the lease lost says so
      const renewal = setInterval(() => {
        const sent = performance.now();
        leases.updateOne({ _id: scope, holder, until: { $gt: new Date(0) } } as never, [{ $set: { until: { $add: ['$$NOW', LEASE_MS] } } }]).then(
          (r) => (until = r.matchedCount === 1 ? sent + LEASE_MS : 0),
          () => undefined,
        );
      }, RENEW_MS);
      renewal.unref();
      try {
        // (what `check` counts it reads from the primary: a secondary behind it could miss an insert)
        const refused = await check();
        if (refused !== null) return refused;
        // the count is good while the hold is: an insert begun as the hold may run out could land after
        // another writer took it and counted without this one
        if (performance.now() + LANDING_MS > until) throw busy();
        return await insert();
      } finally {
        clearInterval(renewal);
        // a release that fails leaves the lease to run out by itself; the insert's answer stands
        await release(scope, holder);
      }
    },
  };
}
