// What a provider's error says reaches answers, events, notifications and logs: never the credential.
import { expect } from 'chai';
import { reasonOf } from '../../engine/connections/retry.js';
import { maskCredential } from '../../engine/platform/mask.js';

describe('provider error reasons', () => {
  const token = 'ghp_SUPERSECRETTOKEN1234567890abcdef';

  it('masks the credential wherever it appears, before the reason is clipped', () => {
    expect(reasonOf(`Bad credentials: token ${token} rejected`, token)).to.equal('Bad credentials: token [credential] rejected');
    // the credential straddling the 200-character clip: none of it is left
    const long = `${'x'.repeat(180)} token ${token} and more`;
    const reason = reasonOf(long, token);
    expect(reason.length).to.be.at.most(200);
    expect(reason).to.not.contain('ghp_SUPER');
    expect(reason).to.not.contain(token.slice(0, 12));
  });

  it('masks a part of the credential long enough to tell (an echo cut short by the provider)', () => {
    expect(reasonOf(`invalid_auth Bearer ${token.slice(0, 20)}`, token)).to.not.contain(token.slice(0, 12));
    expect(reasonOf('invalid_auth', token)).to.equal('invalid_auth');
  });

  it('masks a credential with whitespace in it (stored before credentials were checked), before whitespace is folded', () => {
    const odd = 'SECRETPART_abcdefgh\nX-Evil: 1';
    const reason = reasonOf(`Bearer ${odd} is not a legal HTTP header value`, odd);
    expect(reason).to.equal('Bearer [credential] is not a legal HTTP header value');
    expect(reasonOf(`Bearer SECRETPART_abcdefgh X-Evil: 1 refused`, odd)).to.not.contain('abcdefgh');
  });

  it('masks the credential echoed in base64 as the service sent it (HTTP Basic for git, SMTP AUTH PLAIN), and leaves other base64 alone', () => {
    const b64 = (text: string) => Buffer.from(text).toString('base64');
    const basic = b64(`x-access-token:${token}`);
    const plain = b64(`\0bot@acme.test\0${token}`);
    const other = b64('nothing secret in this one at all');
    const said = reasonOf(`535 Authentication failed for ${plain} / ${b64(token)}; Basic ${basic}; trace ${other}`, token);
    expect(said).to.equal(`535 Authentication failed for [credential] / [credential]; Basic [credential]; trace ${other}`);
    // in git's output as it is kept and streamed, whatever its length
    const git = `fatal: remote error: access denied for x-access-token:${token} (Basic ${basic})\n`.repeat(3);
    expect(maskCredential(git, token)).to.not.contain(token.slice(0, 12)).and.not.contain(basic.slice(0, 16));
  });
});
