// Encryption at rest for tenant secrets: AES-256-GCM under SERVICE_SECRET_KEY, a fresh 96-bit nonce
// per seal, and the owner (tenant and kind) as additional data, so a sealed value moved to another
// tenant's row does not open. Outside production a missing key is generated once into the data
// directory (mode 0600); production refuses to start without one (config/env.ts).
import { createCipheriv, createDecipheriv, randomBytes } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';

export type Sealed = { v: 1; iv: string; tag: string; ct: string };

export type SecretBox = {
  seal(plaintext: string, owner: string): Sealed;
  open(sealed: Sealed, owner: string): string;
};

export const SECRET_KEY_FILE = 'secret.key';

/** The 32-byte key: from SERVICE_SECRET_KEY (hex or base64), else the data dir's key file, made when absent. */
export function loadSecretKey(opts: { secretKey: string | undefined; dataDir: string; isProduction: boolean }): {
  key: Buffer;
  source: 'env' | 'file' | 'generated';
} {
  return loadKeyBytes({ value: opts.secretKey, variable: 'SERVICE_SECRET_KEY', file: SECRET_KEY_FILE, dataDir: opts.dataDir, isProduction: opts.isProduction });
}

/**
 * 32 bytes of key material: from the variable (hex or base64), else from a file of the data dir made
 * once (mode 0600) outside production; production requires the variable.
 */
export function loadKeyBytes(opts: { value: string | undefined; variable: string; file: string; dataDir: string; isProduction: boolean }): {
  key: Buffer;
  source: 'env' | 'file' | 'generated';
} {
  if (opts.value) return { key: decodeKey(opts.value, opts.variable), source: 'env' };
  if (opts.isProduction) throw new Error(`${opts.variable} is required when NODE_ENV=production`);
  const file = path.join(opts.dataDir, opts.file);
  fs.mkdirSync(opts.dataDir, { recursive: true });
  try {
    // `wx`: of two processes starting at once, one writes and the other reads what it wrote
    fs.writeFileSync(file, `${randomBytes(32).toString('hex')}\n`, { flag: 'wx', mode: 0o600 });
    return { key: readKeyFile(file, opts.variable), source: 'generated' };
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
    return { key: readKeyFile(file, opts.variable), source: 'file' };
  }
}

function readKeyFile(file: string, variable: string): Buffer {
  for (let attempt = 0; ; attempt++) {
    const text = fs.readFileSync(file, 'utf8').trim();
    if (text || attempt >= 50) return decodeKey(text, variable);
    Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 10); // the other process is mid-write
  }
}

function decodeKey(text: string, variable: string): Buffer {
  const key = /^[0-9a-fA-F]{64}$/.test(text) ? Buffer.from(text, 'hex') : Buffer.from(text, 'base64');
  if (key.length !== 32) throw new Error(`${variable} must be 32 bytes, as 64 hex characters or base64`);
  return key;
}

/** GCM's tag as sealed: 16 bytes. */
const TAG_BYTES = 16;

export function createSecretBox(key: Buffer): SecretBox {
  return {
    seal(plaintext, owner) {
      const iv = randomBytes(12);
      const cipher = createCipheriv('aes-256-gcm', key, iv);
      cipher.setAAD(Buffer.from(owner));
      const ct = Buffer.concat([cipher.update(plaintext, 'utf8'), cipher.final()]);
      return { v: 1, iv: iv.toString('base64'), tag: cipher.getAuthTag().toString('base64'), ct: ct.toString('base64') };
    },
    open(sealed, owner) {
      // the whole 16-byte tag, never a shorter one (GCM would check only the bytes given: 4 of them, 32 bits)
      const decipher = createDecipheriv('aes-256-gcm', key, Buffer.from(sealed.iv, 'base64'), { authTagLength: TAG_BYTES });
      decipher.setAAD(Buffer.from(owner));
      decipher.setAuthTag(Buffer.from(sealed.tag, 'base64'));
      return Buffer.concat([decipher.update(Buffer.from(sealed.ct, 'base64')), decipher.final()]).toString('utf8');
    },
  };
}
