// Inbound mail's sender: the From address a provider vouches for (SPF or DKIM passed for its domain), as
// the email-to-task template checks it, per provider; and the allowlist's match on one address.
import { expect } from 'chai';
import { parseEmail } from '../../engine/webhooks/email.js';
import { senderAllowed } from '../../engine/tools/session.js';

const form = (fields: Record<string, string>) => ['application/x-www-form-urlencoded', Buffer.from(new URLSearchParams(fields).toString())] as const;

describe('engine/webhooks/email verified_from', () => {
  it('SendGrid: a dkim pass for the From domain, or an SPF pass for an envelope sender of it', async () => {
    const sendgrid = async (fields: Record<string, string>) => (await parseEmail(...form({ to: 'in@x.test', ...fields }))).email.verified_from;
    expect(await sendgrid({ from: 'Ops <ops@example.com>', dkim: '{@example.com : pass}', SPF: 'fail' })).to.equal('ops@example.com');
    expect(await sendgrid({ from: 'ops@example.com', SPF: 'pass', envelope: JSON.stringify({ from: 'bounce@mail.example.com', to: [] }) })).to.equal(
      'ops@example.com',
    );
    // the sender's own domain passed, not the From's; SPF passed for another envelope; nothing passed
    expect(await sendgrid({ from: 'ops@example.com', dkim: '{@evil.example : pass, @example.com : fail}', SPF: 'fail' })).to.equal(null);
    expect(await sendgrid({ from: 'ops@example.com', SPF: 'pass', envelope: JSON.stringify({ from: 'mallory@evil.example' }) })).to.equal(null);
    expect(await sendgrid({ from: 'ops@example.com' })).to.equal(null);
  });

  it('Mailgun: an SPF pass for an envelope sender of the From domain; its DKIM verdict names no domain, so it vouches for none', async () => {
    const mailgun = async (fields: Record<string, string>) =>
      (await parseEmail(...form({ token: 't', timestamp: '1', signature: 's', 'body-plain': 'x', ...fields }))).email.verified_from;
    expect(await mailgun({ from: 'ops@example.com', sender: 'ops@example.com', 'X-Mailgun-Spf': 'Pass' })).to.equal('ops@example.com');
    expect(await mailgun({ from: 'ops@example.com', sender: 'mallory@evil.example', 'X-Mailgun-Spf': 'Pass' })).to.equal(null);
    expect(await mailgun({ from: 'ops@example.com', sender: 'ops@example.com', 'X-Mailgun-Spf': 'Fail', 'X-Mailgun-Dkim-Check-Result': 'Pass' })).to.equal(
      null,
    );
  });

  it('matches an allowlist on exactly one address: two @ are no address, and an @domain is the whole domain', () => {
    expect(senderAllowed('Ops <ops@trusted.example>', '@trusted.example')).to.equal(true);
    expect(senderAllowed('mallory@evil.example@trusted.example', '@trusted.example')).to.equal(false);
    expect(senderAllowed('a@nottrusted.example', '@trusted.example')).to.equal(false);
    expect(senderAllowed('', '*')).to.equal(false);
  });
});
