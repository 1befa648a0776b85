import { expect } from 'chai';
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createSecretBox, loadSecretKey } from '../../engine/platform/secret-box.js';

describe('secret box', () => {
  const box = createSecretBox(randomBytes(32));

  it('opens what it sealed, with a fresh nonce each time, and never holds the plaintext', () => {
    const a = box.seal('s3cret-value', 'webhook-secret:t1:codehost');
    const b = box.seal('s3cret-value', 'webhook-secret:t1:codehost');
    expect(a.iv).to.not.equal(b.iv);
    expect(JSON.stringify(a)).to.not.include('s3cret');
    expect(box.open(a, 'webhook-secret:t1:codehost')).to.equal('s3cret-value');
  });

  it('refuses a value moved to another owner, a changed byte, or another key', () => {
    const sealed = box.seal('s3cret-value', 'webhook-secret:t1:codehost');
    expect(() => box.open(sealed, 'webhook-secret:t2:codehost')).to.throw();
    const ct = Buffer.from(sealed.ct, 'base64');
    ct[0] = ct[0]! ^ 1;
    expect(() => box.open({ ...sealed, ct: ct.toString('base64') }, 'webhook-secret:t1:codehost')).to.throw();
    expect(() => createSecretBox(randomBytes(32)).open(sealed, 'webhook-secret:t1:codehost')).to.throw();
    // a tag cut short checks only the bytes left (32 bits of 128): refused, whatever its length
    for (const bytes of [4, 8, 12, 15])
      expect(() =>
        box.open({ ...sealed, tag: Buffer.from(sealed.tag, 'base64').subarray(0, bytes).toString('base64') }, 'webhook-secret:t1:codehost'),
      ).to.throw();
  });

  it('generates a 0600 key file once outside production, reads it after, and takes SERVICE_SECRET_KEY as hex or base64', () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'secret-box-'));
    try {
      const first = loadSecretKey({ secretKey: undefined, dataDir: dir, isProduction: false });
      expect(first.source).to.equal('generated');
      expect(fs.statSync(path.join(dir, 'secret.key')).mode & 0o777).to.equal(0o600);
      const second = loadSecretKey({ secretKey: undefined, dataDir: dir, isProduction: false });
      expect(second).to.deep.equal({ key: first.key, source: 'file' });
      const key = randomBytes(32);
      expect(loadSecretKey({ secretKey: key.toString('hex'), dataDir: dir, isProduction: true }).key.equals(key)).to.equal(true);
      expect(loadSecretKey({ secretKey: key.toString('base64'), dataDir: dir, isProduction: true }).key.equals(key)).to.equal(true);
      expect(() => loadSecretKey({ secretKey: undefined, dataDir: dir, isProduction: true })).to.throw(/SERVICE_SECRET_KEY/);
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});
