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

/** Inserts one record; false when a unique index already holds its id or key. */
export async function insertNew<T extends { id: string }>(model: Model<Stored<T>>, record: T): Promise<boolean> {
  try {
    await model.collection.insertOne(toStored(record) as never);
    return true;
  } catch (err) {
    if (isDuplicateKey(err)) return false;
    throw err;
  }
}

/**
 * Inserts one record. A failure that may have stored it all the same (a connection lost on the way) takes it
 * back: the id is its own, unless the failure is that the id is another's.
 */
export async function insertOneOrNone<T extends { id: string }>(model: Model<Stored<T>>, record: T): Promise<'inserted'> {
  try {
    await model.collection.insertOne(toStored(record) as never);
  } catch (err) {
    if (!isDuplicateKey(err)) await model.deleteOne({ _id: record.id }).catch(() => undefined);
    throw err;
  }
  return 'inserted';
}

export function definedOnly<T extends object>(changes: T): Partial<T> {
  return Object.fromEntries(Object.entries(changes).filter(([, v]) => v !== undefined)) as Partial<T>;
}

/** One page of a filtered collection, newest first, after the cursor's id. */
export async function pageOf<T extends { id: string }>(
  model: Model<Stored<T>>,
  filter: Record<string, unknown>,
  q: { limit: number; cursor?: string },
  /** fields the server leaves out of every document (a list of summaries, whose type, the caller's, omits them) */
  leftOut: (keyof T & string)[] = [],
): Promise<Page<T>> {
  // the list a cursor is of: the collection's
  const list = model.collection.collectionName;
  const after = decodeCursor(q.cursor, list);
  const rows = await model
    .find(after ? { ...filter, _id: { $lt: after } } : filter, Object.fromEntries(leftOut.map((k) => [k, 0])))
    .sort({ _id: -1 })
    .limit(q.limit + 1)
    .lean<Stored<T>[]>();
  return toPage(
    rows.map((r) => fromStored(r)!),
    q.limit,
    list,
  );
}
