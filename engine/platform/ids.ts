// Prefixed, time-sortable ids (ULID after the prefix): `aut_01J…`. Sorting ids sorts by creation.
import { createHash, randomFillSync } from 'node:crypto';
import { encodeTime, monotonicFactory } from 'ulid';

// ulid asks for one random byte per character; drawing them from a pool refilled by the CSPRNG
// 4 KB at a time keeps the same randomness without a native call and an allocation per character
const pool = new Uint8Array(4096);
let used = pool.length;
const next = monotonicFactory(() => {
  if (used === pool.length) {
    randomFillSync(pool);
    used = 0;
  }
  return pool[used++]! / 256;
});

export type IdPrefix = 'aut' | 'key' | 'run' | 'ses' | 'whd' | 'agt' | 'msg' | 'tsk' | 'grn' | 'aud' | 'con' | 'nep' | 'ntf';

export function newId(prefix: IdPrefix, now: number = Date.now()): string {
  return `${prefix}_${next(now).toLowerCase()}`;
}

/**
 * The smallest id of `prefix` made at `now`: every id made before it sorts before it (its time leads). Not
 * through newId, whose ids never go back in time (monotonic: an earlier `now` gives the last time again).
 */
export function idBefore(prefix: IdPrefix, now: number): string {
  return `${prefix}_${encodeTime(now, 10).toLowerCase()}${'0'.repeat(16)}`;
}

const CROCKFORD = '0123456789abcdefghjkmnpqrstvwxyz';

/**
 * The id of `prefix` made at `at` for `what`, the same each time it is asked for: its time leads, as a new id's
 * does, and its random part is `what`'s digest. What is made again (an event offered again after a crash) gets
 * the id it got the first time, which the store keeps once.
 */
export function idOf(prefix: IdPrefix, at: number, what: string): string {
  const digest = createHash('sha256').update(what).digest();
  let tail = '';
  for (let i = 0; i < 16; i++) tail += CROCKFORD[digest[i]! & 31];
  return `${prefix}_${encodeTime(at, 10).toLowerCase()}${tail}`;
}
