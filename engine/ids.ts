// Prefixed, time-sortable ids (ULID after the prefix): `aut_01J…`. Sorting ids sorts by creation.
import { monotonicFactory } from 'ulid';

const next = monotonicFactory();

export type IdPrefix = 'aut' | 'key' | 'run' | 'ses' | 'agt' | 'tsk' | 'msg' | 'whd' | 'rep' | 'evd';

export function newId(prefix: IdPrefix, now: number = Date.now()): string {
  return `${prefix}_${next(now).toLowerCase()}`;
}
