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

export function definedOnly<T extends object>(changes: T): Partial<T> {
  return Object.fromEntries(Object.entries(changes).filter(([, v]) => v !== undefined)) as Partial<T>;
}
