// Members of a document's object fields (a budget's `seconds`, a connection per provider) changed by the
// write itself, merged into what is stored (RFC 7396): a member given is set, one given as null is
// removed, the others keep their values. Read, merged and written whole by the caller instead, two changes
// of different members made at once both answered 200 and the first was lost (the second wrote the budget
// it had read before the first landed).

/** Per field, the members to set (a value) or remove (null). */
export type MemberChanges<F extends string> = Partial<Record<F, Record<string, unknown>>>;

/** The document with its fields' members changed (SQLite: applied to the row read inside the write's transaction). */
export function withMembers<T extends object>(doc: T, members: MemberChanges<string> | undefined): T {
  if (!members) return doc;
  const next = { ...doc } as Record<string, unknown>;
  for (const [field, changes] of Object.entries(members)) {
    if (!changes) continue;
    const merged: Record<string, unknown> = { ...(next[field] as Record<string, unknown> | undefined) };
    for (const [member, value] of Object.entries(changes)) {
      if (value === undefined) continue;
      if (value === null) delete merged[member];
      else merged[member] = value;
    }
    next[field] = merged;
  }
  return next as T;
}

/** The same change as MongoDB update operators on the members' paths (the field names and members are the schema's, never a caller's). */
export function memberOperators(members: MemberChanges<string> | undefined): { $set: Record<string, unknown>; $unset?: Record<string, ''> } {
  const $set: Record<string, unknown> = {};
  const $unset: Record<string, ''> = {};
  for (const [field, changes] of Object.entries(members ?? {}))
    for (const [member, value] of Object.entries(changes ?? {})) {
      if (value === null) $unset[`${field}.${member}`] = '';
      else if (value !== undefined) $set[`${field}.${member}`] = value;
    }
  return Object.keys($unset).length ? { $set, $unset } : { $set };
}
