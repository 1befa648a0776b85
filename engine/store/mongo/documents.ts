import type { Model } from 'mongoose';
import { decodeCursor, toPage, type Page } from '../port.js';
// How records become MongoDB documents: the id is `_id`; mongoose adds nothing of its own.
export type Stored<T extends { id: string }> = Omit<T, 'id'> & { _id: string };

export function toStored<T extends { id: string }>(doc: T): Stored<T> {
  const { id, ...rest } = doc;
  return { _id: id, ...rest } as Stored<T>;
}

export function fromStored<T extends { id: string }>(doc: Stored<T> | null): T | null {
  if (!doc) return null;
  const { _id, ...rest } = doc as Stored<T> & { __v?: number };
  delete (rest as { __v?: number }).__v;
  return { id: _id, ...rest } as unknown as T;
}

export const loose = { strict: false, versionKey: false, minimize: false } as const;

/** A write refused by a unique index (MongoDB's E11000). */
export const isDuplicateKey = (err: unknown): boolean => (err as { code?: number }).code === 11000;

/** How many times a capped insert that backed off while there was room tries again. */
const CAPPED_TRIES = 3;

/**
 * An insert under a cap without a multi-document transaction: insert, then count what the cap counts;
 * over the cap, take the insert back. A writer stays only when its count, made after its own insert, is
 * within the cap; of writers that race, the last to insert counts every one that stays, so together they
 * never pass it. (Staying by rank, counting only the ids up to one's own, would not hold: a writer with a
 * later id may count, and stay, before an earlier one's insert lands, which then stays too.) Two that see
 * each other both back off; one that then finds room again (the other backed off too) tries again after a
 * random moment, so that one of them gets it. `insert` may refuse for a reason of its own, given back as is.
 */
export async function insertUnderCap<R extends string>(
  size: number,
  max: number,
  op: { insert(): Promise<'inserted' | R>; count(): Promise<number>; remove(): Promise<unknown> },
): Promise<'inserted' | 'over-cap' | R> {
  for (let attempt = 1; ; attempt++) {
    const inserted = await op.insert();
    if (inserted !== 'inserted' || (await op.count()) <= max) return inserted;
    await op.remove();
    if (attempt === CAPPED_TRIES || (await op.count()) + size > max) return 'over-cap';
    await new Promise((resolve) => setTimeout(resolve, Math.random() * 20 * attempt));
  }
}

export function definedOnly<T extends object>(changes: T): Partial<T> {
  return Object.fromEntries(Object.entries(changes).filter(([, v]) => v !== undefined)) as Partial<T>;
}

/** One page of a filtered collection, newest first, after the cursor's id. */
export async function pageOf<T extends { id: string }>(
  model: Model<Stored<T>>,
  filter: Record<string, unknown>,
  q: { limit: number; cursor?: string },
): Promise<Page<T>> {
  const after = decodeCursor(q.cursor);
  const rows = await model
    .find(after ? { ...filter, _id: { $lt: after } } : filter)
    .sort({ _id: -1 })
    .limit(q.limit + 1)
    .lean<Stored<T>[]>();
  return toPage(
    rows.map((r) => fromStored(r)!),
    q.limit,
  );
}
