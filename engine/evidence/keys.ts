// The ledger's signing key: Ed25519 from a 32-byte seed (SERVICE_EVIDENCE_KEY, or a file of the data
// dir made once outside production). Its id is the first 16 hex characters of the sha256 of the raw
// public key; the public key travels with every pack so that anyone can check it offline.
import { createHash, createPrivateKey, createPublicKey, sign, verify, type KeyObject } from 'node:crypto';

// PKCS#8 DER of an Ed25519 private key, up to the 32 bytes of its seed (RFC 8410)
const PKCS8_PREFIX = Buffer.from('302e020100300506032b657004220420', 'hex');

export type EvidenceSigner = {
  keyId: string;
  publicKeyPem: string;
  /** base64 Ed25519 signature of the bytes */
  sign(data: Buffer | string): string;
};

export function signerOf(seed: Buffer): EvidenceSigner {
  if (seed.length !== 32) throw new Error('an Ed25519 seed is 32 bytes');
  const privateKey = createPrivateKey({ key: Buffer.concat([PKCS8_PREFIX, seed]), format: 'der', type: 'pkcs8' });
  const publicKey = createPublicKey(privateKey);
  return {
    keyId: keyIdOf(publicKey),
    publicKeyPem: publicKey.export({ format: 'pem', type: 'spki' }).toString(),
    sign: (data) => sign(null, typeof data === 'string' ? Buffer.from(data) : data, privateKey).toString('base64'),
  };
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
