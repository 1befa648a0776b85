// The ledger's signing key: Ed25519 from a 32-byte seed (SERVICE_EVIDENCE_KEY, or a file of the data
// dir made once outside production). Its id is the first 16 hex characters of the sha256 of the raw
// public key; the public key travels with every pack so that anyone can check it offline.
import { createHash, createPrivateKey, createPublicKey, sign, verify, type KeyObject } from 'node:crypto';

// PKCS#8 DER of an Ed25519 private key, up to the 32 bytes of its seed (RFC 8410)
const PKCS8_PREFIX = Buffer.from('302e020100300506032b657004220420', 'hex');
// SPKI DER of an Ed25519 public key, up to its 32 raw bytes (RFC 8410)
const SPKI_PREFIX = Buffer.from('302a300506032b6570032100', 'hex');

/** A public key of the ledger: its id and its PEM (SPKI). */
export type LedgerKey = { key_id: string; pem: string };

export type EvidenceSigner = {
  keyId: string;
  publicKeyPem: string;
  /** base64 Ed25519 signature of the bytes */
  sign(data: Buffer | string): string;
  /** the ledger's earlier keys (SERVICE_EVIDENCE_PREVIOUS_KEYS), by id: entries they signed before a rotation verify, and packs name them */
  earlier: ReadonlyMap<string, KeyObject>;
};

export function signerOf(seed: Buffer, earlier: KeyObject[] = []): EvidenceSigner {
  if (seed.length !== 32) throw new Error('an Ed25519 seed is 32 bytes');
  const privateKey = createPrivateKey({ key: Buffer.concat([PKCS8_PREFIX, seed]), format: 'der', type: 'pkcs8' });
  const publicKey = createPublicKey(privateKey);
  const keyId = keyIdOf(publicKey);
  return {
    keyId,
    publicKeyPem: pemOf(publicKey),
    sign: (data) => sign(null, typeof data === 'string' ? Buffer.from(data) : data, privateKey).toString('base64'),
    earlier: new Map(earlier.map((k) => [keyIdOf(k), k] as const).filter(([id]) => id !== keyId)),
  };
}

export const pemOf = (publicKey: KeyObject): string => publicKey.export({ format: 'pem', type: 'spki' }).toString();

/**
 * An Ed25519 public key written as its 32 raw bytes (64 hex characters or base64), or as the base64 line of
 * its PEM (the SPKI DER, 44 bytes); null when the text is none of those.
 */
export function publicKeyFromText(text: string): KeyObject | null {
  const t = text.trim();
  const bytes = /^[0-9a-fA-F]{64}$/.test(t) ? Buffer.from(t, 'hex') : /^[A-Za-z0-9+/]+={0,2}$/.test(t) ? Buffer.from(t, 'base64') : null;
  const der =
    bytes?.length === 32
      ? Buffer.concat([SPKI_PREFIX, bytes])
      : bytes?.length === 44 && bytes.subarray(0, SPKI_PREFIX.length).equals(SPKI_PREFIX)
        ? bytes
        : null;
  if (!der) return null;
  try {
    const key = createPublicKey({ key: der, format: 'der', type: 'spki' });
    return key.asymmetricKeyType === 'ed25519' ? key : null;
  } catch {
    return null;
  }
}

export function keyIdOf(publicKey: KeyObject): string {
  const raw = publicKey.export({ format: 'der', type: 'spki' }).subarray(-32);
  return createHash('sha256').update(raw).digest('hex').slice(0, 16);
}

/** The public key of a PEM text, or null when it is not an Ed25519 public key. */
export function publicKeyFromPem(pem: string): KeyObject | null {
  try {
    const key = createPublicKey(pem);
    return key.asymmetricKeyType === 'ed25519' ? key : null;
  } catch {
    return null;
  }
}

export function verifySignature(publicKey: KeyObject, data: Buffer | string, signature: string): boolean {
  try {
    return verify(null, typeof data === 'string' ? Buffer.from(data) : data, publicKey, Buffer.from(signature, 'base64'));
  } catch {
    return false;
  }
}

/** verifySignature on libuv's thread pool: the event loop goes on meanwhile. */
export function verifySignatureAsync(publicKey: KeyObject, data: string, signature: string): Promise<boolean> {
  return new Promise((resolve) => {
    try {
      verify(null, Buffer.from(data), publicKey, Buffer.from(signature, 'base64'), (err, ok) => resolve(!err && ok));
    } catch {
      resolve(false);
    }
  });
}
