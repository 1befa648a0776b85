// Checking evidence with nothing but the data and a public key: each entry's hash over its canonical
// JSON (RFC 8785), the chain of prev_hash links, each entry's signature and each payload's digest.
// The service uses it when it builds a pack; the CLI's `gates verify` uses it offline.
import type { KeyObject } from 'node:crypto';
import { canonicalJson, sha256Hex, type LedgerEntry } from '../platform/index.js';
import { verifySignature, verifySignatureAsync } from './keys.js';

export { canonicalJson, sha256Hex };

export const GENESIS_HASH = '0'.repeat(64);

/** `sha256:<hex>` of a payload's canonical JSON text. */
export const payloadDigest = (body: string) => `sha256:${sha256Hex(body)}`;

/** The hash of an entry: every field but the hash, the key id and the signature. */
export function entryHash(e: Omit<LedgerEntry, 'hash' | 'key_id' | 'sig'>): string {
  return sha256Hex(
    canonicalJson({ tenant_id: e.tenant_id, seq: e.seq, at: e.at, kind: e.kind, subject: e.subject, payload_digest: e.payload_digest, prev_hash: e.prev_hash }),
  );
}

export type EvidenceProblem = { part: 'entry' | 'chain' | 'signature' | 'payload' | 'envelope' | 'statement'; seq?: number; message: string };

type VerifyOptions = {
  publicKey: KeyObject;
  keyId: string;
  /** earlier keys of the ledger, by id, that the key vouches for: their entries verify too (a key rotated) */
  earlier?: ReadonlyMap<string, KeyObject>;
  /** the tenant whose ledger the slice must be: an entry of another's is refused (one key signs every tenant's) */
  tenantId?: string;
  prevHash?: string;
  payloads?: Map<string, string>;
};

/** The key an entry is checked with: the ledger's, or an earlier one it vouches for (entryProblem has made sure it is one). */
const keyOf = (e: LedgerEntry, opts: VerifyOptions): KeyObject => (e.key_id === opts.keyId ? opts.publicKey : opts.earlier!.get(e.key_id)!);

/**
 * Where the walk of a slice stands: the hash and seq of the entry before, the key that signed it and the keys
 * that signed before that one (a rotation moves the ledger to a new key for good: a key another followed, and
 * an earlier key once the ledger's own key has signed, sign nothing more; an earlier key's seed is what leaks).
 */
type Walk = { prev: string | undefined; seq: number | undefined; key: string | undefined; retired: Set<string> };

const newWalk = (prev: string | undefined): Walk => ({ prev, seq: undefined, key: undefined, retired: new Set() });

/** What is wrong with an entry besides its signature (its place in the chain, its hash, its key, its payload), or null. */
function entryProblem(e: LedgerEntry, walk: Walk, opts: VerifyOptions): EvidenceProblem | null {
  if (walk.seq !== undefined && e.seq !== walk.seq + 1) return { part: 'chain', seq: e.seq, message: `entry ${e.seq} follows entry ${walk.seq}` };
  if (walk.prev !== undefined && e.prev_hash !== walk.prev)
    return { part: 'chain', seq: e.seq, message: `entry ${e.seq} does not chain to the entry before it` };
  if (entryHash(e) !== e.hash) return { part: 'entry', seq: e.seq, message: `entry ${e.seq} does not match its hash` };
  if (opts.tenantId !== undefined && e.tenant_id !== opts.tenantId)
    return { part: 'chain', seq: e.seq, message: `entry ${e.seq} is tenant ${e.tenant_id}'s ledger, not ${opts.tenantId}'s` };
  if (e.key_id !== opts.keyId && !opts.earlier?.has(e.key_id))
    return {
      part: 'signature',
      seq: e.seq,
      message: `entry ${e.seq} is signed by key ${e.key_id}, not ${opts.keyId}${opts.earlier?.size ? ' nor an earlier key it vouches for' : ''}`,
    };
  if (walk.key !== undefined && e.key_id !== walk.key) {
    if (walk.key === opts.keyId || walk.retired.has(e.key_id))
      return {
        part: 'signature',
        seq: e.seq,
        message: `entry ${e.seq} is signed by key ${e.key_id} after key ${walk.key} took over from it: a key rotated out signs nothing more`,
      };
    walk.retired.add(walk.key);
  }
  walk.key = e.key_id;
  if (opts.payloads) {
    const body = opts.payloads.get(e.payload_digest);
    if (body === undefined) return { part: 'payload', seq: e.seq, message: `entry ${e.seq}'s payload ${e.payload_digest} is missing` };
    if (payloadDigest(body) !== e.payload_digest) return { part: 'payload', seq: e.seq, message: `entry ${e.seq}'s payload does not match its digest` };
  }
  walk.prev = e.hash;
  walk.seq = e.seq;
  return null;
}

const badSignature = (e: LedgerEntry): EvidenceProblem => ({ part: 'signature', seq: e.seq, message: `entry ${e.seq}'s signature does not verify` });

/**
 * The first problem of a slice of a ledger, oldest first, or null. The first entry's `prev_hash` is
 * taken as given unless `prevHash` is known (the whole ledger starts at the genesis hash).
 */
export function verifyEntries(entries: LedgerEntry[], opts: VerifyOptions): EvidenceProblem | null {
  const walk = newWalk(opts.prevHash);
  for (const e of entries) {
    const problem = entryProblem(e, walk, opts) ?? (verifySignature(keyOf(e, opts), e.hash, e.sig) ? null : badSignature(e));
    if (problem) return problem;
  }
  return null;
}

/** How many entries the service checks between two turns of its event loop, their signatures at once. */
const CHUNK = 256;

/**
 * verifyEntries for the service: the same checks and the same first problem, but the signatures (about
 * 60 µs each) are checked on libuv's thread pool, a chunk at a time, so that a slice of 10,000 entries
 * does not hold the event loop for the half second it takes in one go.
 */
export async function verifyEntriesAsync(
  entries: LedgerEntry[],
  opts: VerifyOptions & {
    /** the payloads of a chunk's entries, read for that chunk alone (a slice's payloads may be hundreds of megabytes together) */
    payloadsOf?: (chunk: LedgerEntry[]) => Promise<Map<string, string>>;
  },
): Promise<EvidenceProblem | null> {
  const walk = newWalk(opts.prevHash);
  for (let i = 0; i < entries.length; i += CHUNK) {
    const chunk = entries.slice(i, i + CHUNK);
    const chunkOpts = opts.payloadsOf ? { ...opts, payloads: await opts.payloadsOf(chunk) } : opts;
    let problem: EvidenceProblem | null = null;
    let whole = 0; // the entries of the chunk before its first problem
    for (; whole < chunk.length && !(problem = entryProblem(chunk[whole]!, walk, chunkOpts)); whole++);
    const signed = await Promise.all(chunk.slice(0, whole).map((e) => verifySignatureAsync(keyOf(e, opts), e.hash, e.sig)));
    const unsigned = signed.indexOf(false);
    if (unsigned !== -1) return badSignature(chunk[unsigned]!);
    if (problem) return problem;
  }
  return null;
}
