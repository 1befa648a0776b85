// The evidence ledger: append-only per tenant, each entry chained to the one before and signed
// (verify.ts says how). Payloads are canonical JSON kept by digest; an entry carries only the digest.
import type { Platform } from '../deps.js';
import { ConflictError, type LedgerEntry, type LedgerSubject } from '../platform/index.js';
import type { LedgerHead } from '../store/index.js';
import { pemOf, publicKeyFromPem, verifySignatureAsync, type EvidenceSigner, type LedgerKey } from './keys.js';
import { envelopeOf, type Statement } from './pack.js';
import { canonicalJson, entryHash, GENESIS_HASH, payloadDigest, verifyEntriesAsync, type EvidenceProblem } from './verify.js';

/** Entries read at a time on the way from a slice to the first entry of the current key after it (see anchored). */
const ANCHOR_PAGE = 500;

export type LedgerItem = { kind: string; subject: LedgerSubject; payload: unknown };

/** The ledger's refusal of this key (see assertSignsAfter): it holds until the key is set right, not for a retry. */
export class LedgerKeyRefused extends ConflictError {}

/**
 * Refuses to chain entries signed by this key after a head signed by a key it does not know: one that is neither
 * this key nor an earlier one (SERVICE_EVIDENCE_PREVIOUS_KEYS). Written, such an entry broke every pack whose slice
 * holds it, for good (a CLI's `gates run --record` with a key from before a rotation, another folder's key file,
 * a typo; a service started with the wrong SERVICE_EVIDENCE_KEY).
 */
export function assertSignsAfter(head: LedgerHead, signer: Pick<EvidenceSigner, 'keyId' | 'earlier'>): void {
  if (!head || head.key_id === signer.keyId || signer.earlier.has(head.key_id)) return;
  throw new LedgerKeyRefused(
    `the tenant's evidence ledger ends with entry ${head.seq}, signed by key ${head.key_id}; this key is ${signer.keyId}: sign with the service's key (SERVICE_EVIDENCE_KEY), or name ${head.key_id} in SERVICE_EVIDENCE_PREVIOUS_KEYS if it is the key this one took over from`,
  );
}

export function ledgerOf(deps: Pick<Platform, 'store' | 'clock'> & { signer: EvidenceSigner }) {
  const { store, clock, signer } = deps;
  const verifyingKey = publicKeyFromPem(signer.publicKeyPem)!;
  return {
    publicKey: { key_id: signer.keyId, pem: signer.publicKeyPem },

    /**
     * What is wrong with a slice of the tenant's ledger as stored (a chain, a hash, a signature, a payload, an
     * entry of another tenant's ledger), or null: what `gates verify` checks of a pack's entries. The payloads
     * are read a chunk of entries at a time (`payloadsOf`), and each chunk's let go before the next is read.
     */
    verify: (tenantId: string, entries: LedgerEntry[], payloadsOf: (chunk: LedgerEntry[]) => Promise<Map<string, string>>): Promise<EvidenceProblem | null> =>
      verifyEntriesAsync(entries, { publicKey: verifyingKey, keyId: signer.keyId, earlier: signer.earlier, tenantId, payloadsOf }),

    /**
     * What is wrong with the entries from `last` (a slice's last entry, verified) up to the first one this key signed:
     * each must chain to the one before, and that one's signature hold. A slice signed by earlier keys alone is
     * vouched for by this key only through its own entry that chains to it: rewritten whole and signed again with a
     * leaked earlier seed, the slice verified by itself, and the service signed a pack of the forgery. Null also when
     * no entry of this key follows yet (nothing to hold it to: the ledger's own head).
     */
    async anchored(tenantId: string, last: LedgerEntry): Promise<EvidenceProblem | null> {
      let prev = last;
      while (prev.key_id !== signer.keyId) {
        const next = await store.evidence.list(tenantId, { afterSeq: prev.seq, limit: ANCHOR_PAGE });
        if (!next.length) return null;
        for (const e of next) {
          if (e.seq !== prev.seq + 1 || e.prev_hash !== prev.hash || e.tenant_id !== tenantId || entryHash(e) !== e.hash)
            return { part: 'chain', seq: e.seq, message: `entry ${e.seq}, after the slice, does not chain to entry ${prev.seq}` };
          if (e.key_id === signer.keyId)
            return (await verifySignatureAsync(verifyingKey, e.hash, e.sig))
              ? null
              : { part: 'signature', seq: e.seq, message: `entry ${e.seq}'s signature does not verify` };
          prev = e;
        }
      }
      return null;
    },

    /** The earlier keys (SERVICE_EVIDENCE_PREVIOUS_KEYS) that signed some of these entries, by id: a pack of them names them. */
    earlierKeysOf: (entries: LedgerEntry[]): LedgerKey[] =>
      [...new Set(entries.map((e) => e.key_id))]
        .filter((id) => signer.earlier.has(id))
        .sort()
        .map((id) => ({ key_id: id, pem: pemOf(signer.earlier.get(id)!) })),

    /** Appends the items in order, after the tenant's head, in one atomic write. */
    async append(tenantId: string, items: LedgerItem[]): Promise<LedgerEntry[]> {
      const now = clock.now().toISOString();
      const bodies = items.map((i) => canonicalJson(i.payload));
      const payloads = bodies.map((body) => ({ digest: payloadDigest(body), body }));
      return store.evidence.append(
        tenantId,
        (head, from) => {
          assertSignsAfter(head, signer);
          let prev = head?.hash ?? GENESIS_HASH;
          let seq = head?.seq ?? 0;
          // never earlier than the head: an append that read the clock first can commit after another one
          const at = head && head.at > now ? head.at : now;
          return items.slice(from).map((item, k) => {
            const i = from + k;
            const fields = {
              tenant_id: tenantId,
              seq: ++seq,
              at,
              kind: item.kind,
              subject: item.subject,
              payload_digest: payloads[i]!.digest,
              prev_hash: prev,
            };
            const hash = entryHash(fields);
            prev = hash;
            return { ...fields, hash, key_id: signer.keyId, sig: signer.sign(hash) };
          });
        },
        payloads,
      );
    },

    /** A statement in a DSSE envelope signed with the ledger's key. */
    envelope: (statement: Statement) => envelopeOf(statement, signer),

    head: (tenantId: string) => store.evidence.head(tenantId),
    list: (tenantId: string, q: { afterSeq?: number; since?: string; limit: number }) => store.evidence.list(tenantId, q),
    payloads: (tenantId: string, digests: string[]) => store.evidence.payloads(tenantId, digests),
    /** The tenant's first entry of `kind` about this report; null when the ledger has none. */
    firstOfReport: (tenantId: string, kind: string, reportId: string) => store.evidence.firstOfReport(tenantId, kind, reportId),
  };
}

export type Ledger = ReturnType<typeof ledgerOf>;
