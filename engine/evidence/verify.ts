// Checking evidence with nothing but the data and a public key: each entry's hash over its canonical
// JSON (RFC 8785), the chain of prev_hash links, each entry's signature and each payload's digest.
// The service uses it when it builds a pack; the CLI's `gates verify` uses it offline.
import type { KeyObject } from 'node:crypto';
import { canonicalJson, sha256Hex, type LedgerEntry } from '../platform/index.js';
import { verifySignature } from './keys.js';

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

/**
 * The first problem of a slice of a ledger, oldest first, or null. The first entry's `prev_hash` is
 * taken as given unless `prevHash` is known (the whole ledger starts at the genesis hash).
 */
export function verifyEntries(
  entries: LedgerEntry[],
  opts: { publicKey: KeyObject; keyId: string; prevHash?: string; payloads?: Map<string, string> },
): EvidenceProblem | null {
  let prev = opts.prevHash;
  let seq: number | undefined;
  for (const e of entries) {
    if (seq !== undefined && e.seq !== seq + 1) return { part: 'chain', seq: e.seq, message: `entry ${e.seq} follows entry ${seq}` };
    if (prev !== undefined && e.prev_hash !== prev) return { part: 'chain', seq: e.seq, message: `entry ${e.seq} does not chain to the entry before it` };
    if (entryHash(e) !== e.hash) return { part: 'entry', seq: e.seq, message: `entry ${e.seq} does not match its hash` };
    if (e.key_id !== opts.keyId) return { part: 'signature', seq: e.seq, message: `entry ${e.seq} is signed by key ${e.key_id}, not ${opts.keyId}` };
    if (!verifySignature(opts.publicKey, e.hash, e.sig)) return { part: 'signature', seq: e.seq, message: `entry ${e.seq}'s signature does not verify` };
    if (opts.payloads) {
      const body = opts.payloads.get(e.payload_digest);
      if (body === undefined) return { part: 'payload', seq: e.seq, message: `entry ${e.seq}'s payload ${e.payload_digest} is missing` };
      if (payloadDigest(body) !== e.payload_digest) return { part: 'payload', seq: e.seq, message: `entry ${e.seq}'s payload does not match its digest` };
    }
    prev = e.hash;
    seq = e.seq;
  }
  return null;
}
