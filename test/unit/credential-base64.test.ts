// A short credential echoed in base64 (an SMTP server's 535 quoting AUTH LOGIN's password line) is masked too.
import { expect } from 'chai';
import { maskCredential } from '../../engine/platform/mask.js';

describe('credential masking in base64', () => {
  const b64 = (text: string) => Buffer.from(text).toString('base64');
  const b64url = (text: string) => Buffer.from(text).toString('base64url');

  for (const password of ['hunter2', 'Tr0ub4dor!']) {
    it(`masks a ${password.length}-character password in base64 as it is sent, alone, in AUTH PLAIN and in Basic, padded or not, url-safe too`, () => {
      for (const user of ['', 'a', 'ab', 'bot@acme.test']) {
        const sent = [b64(password), b64(`\0${user}\0${password}`), b64(`${user}:${password}`), b64url(`${user}:${password}`), b64url(password)];
        for (const form of [...sent, ...sent.map((s) => s.replace(/=+$/, ''))]) {
          const said = maskCredential(`535 5.7.8 Authentication failed for ${form}`, password);
          expect(said, `${JSON.stringify(user)}: ${form}`).to.equal('535 5.7.8 Authentication failed for [credential]');
        }
      }
    });
  }

  it('leaves base64 that does not hold the credential alone', () => {
    const other = b64('nothing secret in this one at all');
    expect(maskCredential(`trace ${other} sha 0123456789abcdef ${b64('hunter')}`, 'hunter2')).to.equal(`trace ${other} sha 0123456789abcdef ${b64('hunter')}`);
  });
});
