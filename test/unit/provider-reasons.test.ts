// What a provider's error says reaches answers, events, notifications and logs: never the credential.
import { expect } from 'chai';
import { reasonOf } from '../../engine/connections/retry.js';
import { maskCredential, maskCredentialCut } from '../../engine/platform/mask.js';

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

describe('provider error reasons and masks of large texts', () => {
  // an 8 KB credential (the most one may be) in a 4 MB text (the most of an answer a provider's SDK reads)
  const long = Array.from({ length: 8192 }, (_, i) => 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789'[(i * 7919) % 62]).join('');
  const big = `${'error: quota exceeded; '.repeat(180_000)}echo ${long} and ${long.slice(100, 136)} end ${Buffer.from(long).toString('base64')}`;

  it('masks a 4 MB text with an 8192-character credential in one pass, as it masks a short one', () => {
    const started = performance.now();
    const masked = maskCredential(big, long);
    // splitting the text once per 12-character piece of the credential took 4 s; one pass takes about 150 ms
    expect(performance.now() - started, 'ms').to.be.below(1000);
    expect(masked.endsWith(`echo [credential] and [credential] end [credential]`), masked.slice(-80)).to.equal(true);
  });

  it('masks a part of the credential whole, its tail too, and two credentials side by side as two', () => {
    const token = 'ghp_SUPERSECRETTOKEN1234567890abcdef';
    expect(maskCredential(`x ${token.slice(3, 18)} y`, token)).to.equal('x [credential] y');
    expect(maskCredential(`${token}${token}`, token)).to.equal('[credential][credential]');
    expect(maskCredential('tok hunter2 hunter2hunter2', 'hunter2')).to.equal('tok [credential] [credential][credential]');
  });

  it('reads a reason from the head of a 4 MB error: at once, the credential masked, 200 characters at most', () => {
    const started = performance.now();
    const reason = reasonOf(`${'x'.repeat(190)} ${long} ${big}`, long);
    expect(performance.now() - started, 'ms').to.be.below(100);
    expect(reason).to.equal(`${'x'.repeat(190)} [credential]`.slice(0, 200));
  });

  it('masks a credential cut by the end of the window a reason is read from, however far folding moved that end', () => {
    const secret = 'S3cr3tPw';
    // folded, the spaces leave the window's end (its second, of 864 characters) at the reason's 200th: the
    // credential begins k characters before it
    for (let k = 1; k < secret.length; k++) {
      const text = `a${' '.repeat(864 - k - 1 - 197)}${'x'.repeat(197)}${secret}${' tail'.repeat(300)}`;
      const reason = reasonOf(text, secret);
      expect(reason, `k = ${k}`).to.equal(`a ${'x'.repeat(197)}[credential]`.slice(0, 200));
    }
    // what ends a window in the credential's start, of either form, is masked; what only looks like one is not
    expect(maskCredentialCut('login ghp_ABCDEFG', 'ghp_ABCDEFGHIJKLMNOP')).to.equal('login [credential]');
    expect(maskCredentialCut('login ghp_ABCDEFG', 'ghp_ABCDEFG')).to.equal('login [credential]');
    expect(maskCredentialCut('a b c', 'c d e')).to.equal('a b [credential]');
    expect(maskCredentialCut('login ghp_ABCDEFX', 'ghp_ABCDEFGHIJKLMNOP')).to.equal('login ghp_ABCDEFX');
    expect(maskCredentialCut('aaaa', 'aab')).to.equal('aa[credential]');
  });

  it('says a header fetch could not send holds characters it cannot carry, never which character or where', () => {
    const said = reasonOf(
      'Cannot convert argument to a ByteString because the character at index 11 has a value of 55357 which is greater than 255.',
      'toké😀',
    );
    expect(said).to.equal("the credential holds characters the provider's HTTP header cannot carry (only visible ASCII)");
    expect(
      reasonOf('A request error occurred: Cannot convert argument to a ByteString because the character at index 3 has a value of 233', 'toké'),
    ).to.not.match(/index|233/);
  });
});
