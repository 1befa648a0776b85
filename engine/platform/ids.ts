// Prefixed, time-sortable ids (ULID after the prefix): `aut_01J…`. Sorting ids sorts by creation.
import { randomFillSync } from 'node:crypto';
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
