// Canonical JSON (RFC 8785) and its digest: the same value gives the same text whatever the order of its
// fields. The evidence ledger hashes entries by it; an Idempotency-Key's request is recognised by it.
import { createHash } from 'node:crypto';
import canonicalizeModule from 'canonicalize';

// a CommonJS module whose types describe an ES default export: at run time the import is the function
const canonicalize = canonicalizeModule as unknown as (value: unknown) => string | undefined;

export const canonicalJson = (value: unknown): string => {
  const text = canonicalize(value);
  if (text === undefined) throw new Error('a value with no JSON form has no canonical JSON');
  return text;
};

export const sha256Hex = (text: string | Buffer): string => createHash('sha256').update(text).digest('hex');
