// The evidence capability: the signed ledger, packs of evidence, and their offline verification.
/** The seed's file in the data dir when SERVICE_EVIDENCE_KEY is unset (outside production). */
export const EVIDENCE_KEY_FILE = 'evidence.key';

export { keyIdOf, publicKeyFromPem, publicKeyFromText, signerOf, verifySignature, type EvidenceSigner, type LedgerKey } from './keys.js';
export { assertSignsAfter, ledgerOf, LedgerKeyRefused, type Ledger, type LedgerItem } from './ledger.js';
export { canonicalJson, entryHash, GENESIS_HASH, payloadDigest, sha256Hex, verifyEntries, verifyEntriesAsync, type EvidenceProblem } from './verify.js';
export {
  envelopeOf,
  IN_TOTO_PAYLOAD_TYPE,
  packTar,
  pae,
  readPack,
  STATEMENT_TYPE,
  verifyPack,
  type DsseEnvelope,
  type PackFiles,
  type PackJson,
  type PackVerdict,
  type Statement,
} from './pack.js';
