// Inbound mail's sender: the From address a provider vouches for (SPF or DKIM passed for its domain), as
// the email-to-task template checks it, per provider; and the allowlist's match on one address.
import { expect } from 'chai';
import { EMAIL_BODY_MAX_CHARS, EMAIL_HEADER_LIMITS, mailgunFieldsOfMultipart, parseEmail } from '../../engine/webhooks/email.js';
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

  it('Postmark: its Received-SPF read as RFC 7208 writes it; an envelope-from in the HELO or a comment (the sender’s own words), or named twice, vouches for no one', async () => {
    const postmark = async (spf: string) =>
      (
        await parseEmail(
          'application/json',
          Buffer.from(JSON.stringify({ From: 'Ops <ops@example.com>', To: 'in@x.test', Headers: [{ Name: 'Received-SPF', Value: spf }] })),
        )
      ).email.verified_from;
    // the order policyd-spf writes (Postmark passes it on): helo before envelope-from
    expect(
      await postmark('Pass (sender SPF authorized) identity=mailfrom; client-ip=192.0.2.1; helo=mx.example.com; envelope-from=bounce@example.com; receiver=in'),
    ).to.equal('ops@example.com');
    expect(await postmark('pass (comment (nested)) envelope-from="<bounce@example.com>"; helo=x')).to.equal('ops@example.com');
    for (const forged of [
      'Pass (sender SPF authorized) identity=mailfrom; client-ip=192.0.2.1; helo=envelope-from=ops@example.com; envelope-from=mallory@evil.example; receiver=in',
      'Pass (x envelope-from=ops@example.com;) envelope-from=mallory@evil.example',
      'Pass (x "envelope-from=ops@example.com;"@evil.example) helo=a',
      'Pass envelope-from=ops@example.com; envelope-from=mallory@evil.example',
      'Pass envelope-from=mallory@evil.example; x=(envelope-from=ops@example.com)',
      'Pass (unclosed envelope-from=ops@example.com',
      'Fail envelope-from=ops@example.com',
      'Passed envelope-from=ops@example.com',
    ])
      expect(await postmark(forged), forged).to.equal(null);
  });

  it('Mailgun and SendGrid: a verdict or sender given twice vouches for no one; a dkim entry is read whole', async () => {
    const raw = (pairs: [string, string][]) => ['application/x-www-form-urlencoded', Buffer.from(new URLSearchParams(pairs).toString())] as const;
    const mailgun = ['token', 't', 'timestamp', '1', 'signature', 's', 'body-plain', 'x', 'from', 'ops@example.com'];
    const pairs = (...flat: string[]) => flat.flatMap((v, i) => (i % 2 ? [] : [[v, flat[i + 1]!] as [string, string]]));
    const verified = async (flat: string[]) => (await parseEmail(...raw(pairs(...flat)))).email.verified_from;
    expect(await verified([...mailgun, 'sender', 'ops@example.com', 'X-Mailgun-Spf', 'Pass'])).to.equal('ops@example.com');
    expect(await verified([...mailgun, 'sender', 'ops@example.com', 'X-Mailgun-Spf', 'Fail', 'X-Mailgun-Spf', 'Pass'])).to.equal(null);
    expect(await verified([...mailgun, 'sender', 'mallory@evil.example', 'sender', 'ops@example.com', 'X-Mailgun-Spf', 'Pass'])).to.equal(null);
    const sendgrid = ['to', 'in@x.test', 'from', 'ops@example.com'];
    expect(await verified([...sendgrid, 'dkim', '{@example.com:pass : fail, @evil.example : pass}'])).to.equal(null);
    expect(await verified([...sendgrid, 'dkim', '{@example.com : pass}', 'dkim', '{@evil.example : pass}'])).to.equal(null);
    expect(await verified([...sendgrid, 'dkim', '{@evil.example : pass, @example.com : pass}'])).to.equal('ops@example.com');
  });

  it('keeps a mail’s text and html to their first million characters each, never half a character, and says what it cut', async () => {
    const long = 'a'.repeat(EMAIL_BODY_MAX_CHARS - 1) + '😀' + 'tail';
    const { email } = await parseEmail(...form({ from: 'ops@example.com', text: long, html: '<p>short</p>' }));
    expect(email.text).to.have.length(EMAIL_BODY_MAX_CHARS - 1);
    expect(email.text_truncated).to.equal(true);
    expect(email.html).to.equal('<p>short</p>');
    expect(email).to.not.have.property('html_truncated');
    const whole = await parseEmail(
      'application/json',
      Buffer.from(JSON.stringify({ From: 'ops@example.com', TextBody: 'b'.repeat(EMAIL_BODY_MAX_CHARS), HtmlBody: 'c'.repeat(EMAIL_BODY_MAX_CHARS + 1) })),
    );
    expect(whole.email.text).to.have.length(EMAIL_BODY_MAX_CHARS);
    expect(whole.email).to.not.have.property('text_truncated');
    expect(whole.email.html).to.have.length(EMAIL_BODY_MAX_CHARS);
    expect(whole.email.html_truncated).to.equal(true);
  });

  it('keeps the subject, the addresses and the attachments within a header line’s length and a few hundred each, and says it cut them: a delivery stays a few MB', async () => {
    const { chars, addresses, attachments } = EMAIL_HEADER_LIMITS;
    const postmark = {
      From: 'ops@example.com',
      Subject: 's'.repeat(chars - 1) + '😀' + 's'.repeat(17 * 1024 * 1024),
      To: Array.from({ length: addresses + 20 }, (_, i) => `u${i}@x.test`).join(', '),
      Cc: `${'c'.repeat(5000)}@x.test`,
      MessageID: 'm'.repeat(2000),
      Attachments: Array.from({ length: attachments * 50 }, (_, i) => ({ Name: `${i}`.padEnd(3000, 'n'), ContentType: 'text/plain', ContentLength: 1 })),
    };
    const body = Buffer.from(JSON.stringify(postmark));
    const { email } = await parseEmail('application/json', body);
    expect(email.subject, 'never half a character').to.have.length(chars - 1);
    expect(email.to).to.have.length(addresses);
    expect(email.to.at(-1)).to.equal(`u${addresses - 1}@x.test`);
    expect(email.cc[0]).to.have.length(chars);
    expect(email.message_id).to.have.length(chars);
    expect(email.attachments).to.have.length(attachments);
    expect(email.attachments[0]).to.deep.equal({ name: '0'.padEnd(chars, 'n'), type: 'text/plain', size: 1 });
    expect(email.headers_truncated).to.equal(true);
    expect(Buffer.byteLength(JSON.stringify(email)), 'what a delivery keeps').to.be.below(2 * 1024 * 1024);
    // a mail within them is kept whole, and says nothing was cut
    const small = await parseEmail('application/json', Buffer.from(JSON.stringify({ From: 'ops@example.com', Subject: 'hi', To: 'a@x.test' })));
    expect(small.email).to.deep.include({ subject: 'hi', to: ['a@x.test'] });
    expect(small.email).to.not.have.property('headers_truncated');
  });

  it('matches an allowlist on exactly one address: two @ are no address, and an @domain is the whole domain', () => {
    expect(senderAllowed('Ops <ops@trusted.example>', '@trusted.example')).to.equal(true);
    expect(senderAllowed('mallory@evil.example@trusted.example', '@trusted.example')).to.equal(false);
    expect(senderAllowed('a@nottrusted.example', '@trusted.example')).to.equal(false);
    expect(senderAllowed('', '*')).to.equal(false);
  });
});

describe('engine/webhooks/email mailgunFieldsOfMultipart', () => {
  it("reads a form's Mailgun signature fields in a bounded pass: no field kept past 4 KB, no file kept", async () => {
    const boundary = 'b0undary';
    const part = (name: string, value: string, file = false) =>
      `--${boundary}\r\nContent-Disposition: form-data; name="${name}"${file ? '; filename="a.bin"' : ''}\r\n\r\n${value}\r\n`;
    const body = Buffer.from(
      part('body-plain', 'x'.repeat(3_000_000)) +
        part('attachment-1', 'y'.repeat(1_000_000), true) +
        part('timestamp', '1700000000') +
        part('token', 't'.repeat(50)) +
        part('signature', 's'.repeat(64)) +
        part('charsets', '{"body-plain":"shift_jis"}') +
        `--${boundary}--\r\n`,
    );
    const fields = await mailgunFieldsOfMultipart(`multipart/form-data; boundary=${boundary}`, body);
    expect(fields).to.deep.equal({ timestamp: '1700000000', token: 't'.repeat(50), signature: 's'.repeat(64) });
    // no field is kept past its first 4 KB (the 3 MB one was scanned, not kept)
    const long = Buffer.from(part('signature', 'z'.repeat(10_000)) + `--${boundary}--\r\n`);
    expect((await mailgunFieldsOfMultipart(`multipart/form-data; boundary=${boundary}`, long)).signature).to.have.length(4096);
  });
});
