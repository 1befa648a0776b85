// Inbound mail from three providers, normalized to one event: SendGrid Inbound Parse
// (multipart/form-data), Postmark inbound (JSON) and Mailgun routes (form or multipart).
// Attachments are counted, never kept: the event lists their name, type and size.
import busboy from 'busboy';
import { Readable } from 'node:stream';
import { TextDecoder } from 'node:util';
import { alignedDomain, bulkyJson, mailAddress, mailDomain, MAX_JSON_VALUES, unsafeJson, WebhookRejectedError } from '../platform/index.js';

export type EmailAttachment = { name: string; type: string; size: number };

export type EmailEvent = {
  provider: 'sendgrid' | 'postmark' | 'mailgun';
  /** the From header as sent: anyone can write any address there */
  from: string | null;
  /**
   * the From header's address when the provider vouches for it: a DKIM signature that passed for its
   * domain, or an SPF pass for an envelope sender of its domain (DMARC's alignment); null otherwise.
   * What a sender allowlist checks, and where an answer may go.
   */
  verified_from: string | null;
  to: string[];
  cc: string[];
  subject: string | null;
  text: string | null;
  html: string | null;
  /** the text or html was cut to EMAIL_BODY_MAX_CHARS (absent when whole) */
  text_truncated?: true;
  html_truncated?: true;
  /** the subject, the From, the Message-ID, an address or an attachment's name was cut, or a list of addresses or attachments (EMAIL_HEADER_LIMITS) */
  headers_truncated?: true;
  message_id: string | null;
  attachments: EmailAttachment[];
};

export type ParsedEmail = { email: EmailEvent; mailgun?: { timestamp?: string; token?: string; signature?: string } };

/** `repeated`: the fields given more than once (`fields` keeps the last): a verdict given twice is no verdict. */
type Form = { fields: Record<string, string>; files: (EmailAttachment & { field: string })[]; repeated?: Set<string> };

/** A form of URL-encoded fields, with those given more than once. */
function urlEncodedForm(text: string): Form {
  const fields: Record<string, string> = {};
  const repeated = new Set<string>();
  for (const [name, value] of new URLSearchParams(text)) {
    if (name in fields) repeated.add(name);
    fields[name] = value;
  }
  return { fields, files: [], repeated };
}

const MAX_FIELDS = 1000;
const MAX_FILES = 100;
/** Parts past the fields and files kept are not read: a body of many tiny parts cost seconds of one thread. */
const MAX_PARTS = MAX_FIELDS + MAX_FILES;

/**
 * The most of a mail's text, and of its html, kept (UTF-16 code units): a delivery keeps its event for days and
 * each run it starts takes it as input, and a 25 MB mail of text was kept whole twice. Past it, the field is cut
 * (never inside a character) and `text_truncated` or `html_truncated` says so.
 */
export const EMAIL_BODY_MAX_CHARS = 1_000_000;

export async function parseEmail(contentType: string, body: Buffer): Promise<ParsedEmail> {
  const parsed = await parsedEmail(contentType, body);
  return { ...parsed, email: keptBodies(parsed.email) };
}

async function parsedEmail(contentType: string, body: Buffer): Promise<ParsedEmail> {
  const media = contentType.split(';')[0]!.trim().toLowerCase();
  if (media === 'application/json') return { email: fromPostmark(parseObject(body)) };
  if (media === 'multipart/form-data') return fromForm(await inTheirCharsets(contentType, body, await parseMultipart(contentType, body)));
  if (media === 'application/x-www-form-urlencoded') {
    refuseManyFields(body);
    return fromForm(urlEncodedForm(body.toString('utf8')));
  }
  throw new WebhookRejectedError('webhook-payload-invalid', 'an email delivery is multipart/form-data, application/x-www-form-urlencoded or application/json');
}

/**
 * The most of a mail's other parts kept: a header line's length (RFC 5322 §2.1.1) for the subject, the From, the
 * Message-ID, each address and each attachment's name and type; so many addresses in To and in Cc, so many
 * attachments. Within them and the bodies' limit a delivery's mail stays a few MB (a 17 MB subject passed the 25 MB
 * intake whole, and MongoDB refuses a document past 16 MB: the provider was answered 5xx and sent it for good).
 */
export const EMAIL_HEADER_LIMITS = { chars: 998, addresses: 500, attachments: 100 } as const;

/** `value` within `max` UTF-16 units: a cut between the halves of a surrogate pair would leave half a character. */
function cut(value: string, max: number): string {
  return value.length <= max ? value : value.slice(0, max - (/[\uD800-\uDBFF]/.test(value[max - 1]!) ? 1 : 0));
}

/** The mail with its text and html within EMAIL_BODY_MAX_CHARS each, its other parts within EMAIL_HEADER_LIMITS, and what was cut said. */
function keptBodies(email: EmailEvent): EmailEvent {
  const kept = { ...email };
  for (const field of ['text', 'html'] as const) {
    const value = email[field];
    if (value === null || value.length <= EMAIL_BODY_MAX_CHARS) continue;
    kept[field] = cut(value, EMAIL_BODY_MAX_CHARS);
    kept[`${field}_truncated`] = true;
  }
  const { chars, addresses, attachments } = EMAIL_HEADER_LIMITS;
  let over = false;
  const line = (v: string) => (v.length > chars ? ((over = true), cut(v, chars)) : v);
  const few = <T>(list: T[], max: number) => (list.length > max ? ((over = true), list.slice(0, max)) : list);
  for (const field of ['from', 'verified_from', 'subject', 'message_id'] as const) if (email[field] !== null) kept[field] = line(email[field]);
  kept.to = few(email.to, addresses).map(line);
  kept.cc = few(email.cc, addresses).map(line);
  kept.attachments = few(email.attachments, attachments).map((a) => ({ ...a, name: line(a.name), type: line(a.type) }));
  if (over) kept.headers_truncated = true;
  return kept;
}

/** True when `byte` occurs in `body` more than `max` times (counted natively, stopping at max + 1). */
function moreThan(body: Buffer, byte: number, max: number): boolean {
  let at = -1;
  for (let n = 0; n <= max; n++) if ((at = body.indexOf(byte, at + 1)) === -1) return false;
  return true;
}

function refuseManyFields(form: Buffer): void {
  if (moreThan(form, 0x26 /* & */, MAX_FIELDS - 1)) throw new WebhookRejectedError('webhook-payload-invalid', `the form has more than ${MAX_FIELDS} fields`);
}

/**
 * Mailgun's signature fields of a urlencoded form, read without decoding the rest (a field of 24 MB took
 * 0.7 s to decode): checked before the form is parsed. The last of a repeated name wins, as in the parse.
 */
export function mailgunFieldsOfForm(form: Buffer): NonNullable<ParsedEmail['mailgun']> {
  refuseManyFields(form);
  const found: Record<string, string> = {};
  for (let start = 0; start < form.length;) {
    let end = form.indexOf(0x26, start);
    if (end === -1) end = form.length;
    const eq = form.indexOf(0x3d, start);
    // a name is short; a pair whose name is long is not one of these
    if ((eq === -1 || eq > end ? end : eq) - start <= 64 && end - start <= 4096) {
      for (const [name, value] of new URLSearchParams(form.toString('utf8', start, end)))
        if (name === 'timestamp' || name === 'token' || name === 'signature') found[name] = value;
    }
    start = end + 1;
  }
  return found;
}

function parseObject(body: Buffer): Record<string, unknown> {
  // the count of its values first: one pass that refuses a 25 MB body of tiny values before the others read it
  const refused = bulkyJson(body, { values: MAX_JSON_VALUES, items: Infinity }) ?? unsafeJson(body);
  if (refused) throw new WebhookRejectedError('webhook-payload-invalid', refused.detail);
  try {
    const v: unknown = JSON.parse(body.toString('utf8'));
    if (v && typeof v === 'object' && !Array.isArray(v)) return v as Record<string, unknown>;
  } catch {
    // answered below
  }
  throw new WebhookRejectedError('webhook-payload-invalid', 'the body is not a JSON object');
}

/** The fields SendGrid sends in the mail's own charset (named in its `charsets` field); it sends the others in UTF-8. */
const OWN_CHARSET_FIELDS = ['text', 'html'] as const;

/**
 * SendGrid's `text` and `html` come in the mail's own charset, which its `charsets` field names (the others in
 * UTF-8): read as UTF-8, an ISO-8859-1 or Shift_JIS mail's every other letter was U+FFFD, and the mail is not
 * kept. When `charsets` names another charset for one of them, the body is read again with each field's bytes
 * as they came (latin1 maps a byte to a character), and those fields are decoded in their charset. A charset
 * no decoder knows leaves the field as it was read.
 */
async function inTheirCharsets(contentType: string, body: Buffer, form: Form): Promise<Form> {
  let charsets: Record<string, unknown>;
  try {
    charsets = form.fields.charsets ? (JSON.parse(form.fields.charsets) as Record<string, unknown>) : {};
  } catch {
    return form;
  }
  const decoders = new Map<string, TextDecoder>();
  for (const field of OWN_CHARSET_FIELDS) {
    const label = charsets?.[field];
    if (typeof label !== 'string' || form.fields[field] === undefined) continue;
    try {
      const decoder = new TextDecoder(label.trim());
      if (decoder.encoding !== 'utf-8') decoders.set(field, decoder);
    } catch {
      // a label no decoder knows: the field stays as read
    }
  }
  if (!decoders.size) return form;
  const raw = await parseMultipart(contentType, body, 'latin1');
  const fields = { ...form.fields };
  for (const [field, decoder] of decoders) {
    const bytes = raw.fields[field];
    if (bytes !== undefined) fields[field] = decoder.decode(Buffer.from(bytes, 'latin1'));
  }
  return { ...form, fields };
}

/**
 * Mailgun's signature fields of a multipart form, in one bounded pass before the form is read (each field's first
 * 4 KB, no file's bytes kept): a request without credentials is refused after it. Read whole first, a 24 KB gzip
 * that inflated to a 24 MB form (and named another charset, so it was read twice) held the thread 1.4 s and took
 * 45 MB, for anyone who knew a tenant's intake URL.
 */
export async function mailgunFieldsOfMultipart(contentType: string, body: Buffer): Promise<NonNullable<ParsedEmail['mailgun']>> {
  const { fields } = await parseMultipart(contentType, body, 'utf8', { fieldSize: 4096, files: 0 });
  const found: Record<string, string> = {};
  for (const name of ['timestamp', 'token', 'signature'] as const) if (fields[name] !== undefined) found[name] = fields[name];
  return found;
}

/**
 * `charset`: what a field whose part names none is read as (latin1 keeps its bytes, a character each); `bounds`:
 * the most of a field kept, and how many files are read (past them, parts are skipped).
 */
function parseMultipart(
  contentType: string,
  body: Buffer,
  charset = 'utf8',
  bounds: { fieldSize: number; files: number } = { fieldSize: body.length, files: MAX_FILES },
): Promise<Form> {
  return new Promise((resolve, reject) => {
    const form: Form = { fields: {}, files: [], repeated: new Set() };
    let bb: busboy.Busboy;
    try {
      bb = busboy({
        headers: { 'content-type': contentType },
        defCharset: charset,
        limits: { fields: MAX_FIELDS, files: bounds.files, parts: MAX_PARTS, fieldSize: bounds.fieldSize },
      });
    } catch (err) {
      reject(new WebhookRejectedError('webhook-payload-invalid', `the multipart body cannot be read: ${(err as Error).message}`));
      return;
    }
    bb.on('field', (name, value) => {
      if (name in form.fields) form.repeated!.add(name);
      form.fields[name] = value;
    });
    bb.on('file', (field, stream, info) => {
      const file = { field, name: info.filename ?? field, type: info.mimeType || 'application/octet-stream', size: 0 };
      form.files.push(file);
      stream.on('data', (chunk: Buffer) => {
        file.size += chunk.length;
      });
    });
    // the parts past it are skipped unread; the body is refused rather than taken in part
    bb.on('partsLimit', () => reject(new WebhookRejectedError('webhook-payload-invalid', `the multipart body has more than ${MAX_PARTS} parts`)));
    bb.on('error', (err: Error) => reject(new WebhookRejectedError('webhook-payload-invalid', `the multipart body cannot be read: ${err.message}`)));
    bb.on('close', () => resolve(form));
    Readable.from([body]).pipe(bb);
  });
}

/** Splits an address list on commas outside quotes and angle brackets. */
function addresses(list: unknown): string[] {
  if (typeof list !== 'string') return [];
  const out: string[] = [];
  let current = '';
  let quoted = false;
  let angle = 0;
  for (const ch of list) {
    if (ch === '"') quoted = !quoted;
    else if (ch === '<' && !quoted) angle++;
    else if (ch === '>' && !quoted && angle > 0) angle--;
    if (ch === ',' && !quoted && angle === 0) {
      if (current.trim()) out.push(current.trim());
      current = '';
    } else current += ch;
  }
  if (current.trim()) out.push(current.trim());
  return out;
}

const text = (v: unknown): string | null => (typeof v === 'string' && v.length ? v : null);

/** The Message-ID line of a raw header block (SendGrid's `headers` field). */
function messageIdOf(rawHeaders: string | undefined): string | null {
  const m = rawHeaders?.match(/^message-id:\s*(.+)$/im);
  return m ? m[1]!.trim() : null;
}

/** What a provider vouches for: the domains whose DKIM signatures passed, and the envelope sender when SPF passed for it. */
type Vouched = { dkimPassed: string[]; spfPassedFor: string | null };

/** The From header's address when a domain the provider vouches for aligns with it; null otherwise. */
function verifiedFrom(from: string | null, vouched: Vouched): string | null {
  const address = from ? mailAddress(from) : null;
  if (!address) return null;
  const domain = mailDomain(address);
  const envelope = vouched.spfPassedFor ? mailAddress(vouched.spfPassedFor) : null;
  if (vouched.dkimPassed.some((d) => alignedDomain(domain, d)) || (envelope && alignedDomain(domain, mailDomain(envelope)))) return address;
  return null;
}

/**
 * The envelope sender of a Received-SPF header that passed, or null: read as RFC 7208 §9.1 writes it, a result,
 * comments, then `key=value` pairs split by `;`, the sender the value of its own `envelope-from` key. Found
 * anywhere in the header, it was taken from the sending server's own words (`helo=envelope-from=ops@example.com;
 * envelope-from=mallory@evil.example`: the HELO is the sender's to choose, and SPF passed for evil.example). A
 * header that does not parse, or names the sender twice, vouches for no one.
 */
function spfPassedIn(receivedSpf: string | undefined): string | null {
  if (!receivedSpf) return null;
  const h = receivedSpf;
  let i = 0;
  /** skips white space and comments (nested, with quoted pairs); false at a comment left open */
  const skipCfws = (): boolean => {
    for (;;) {
      while (i < h.length && /\s/.test(h[i]!)) i++;
      if (h[i] !== '(') return true;
      let depth = 0;
      for (; i < h.length; i++) {
        if (h[i] === '\\') i++;
        else if (h[i] === '(') depth++;
        else if (h[i] === ')' && --depth === 0) break;
      }
      if (depth > 0) return false;
      i++;
    }
  };
  const result = /^\s*([A-Za-z]+)/.exec(h);
  if (!result || result[1]!.toLowerCase() !== 'pass') return null;
  i = result[0].length;
  const found: string[] = [];
  while (skipCfws() && i < h.length) {
    const key = /^[A-Za-z0-9_.-]+/.exec(h.slice(i));
    if (!key) return null;
    i += key[0].length;
    if (!skipCfws() || h[i] !== '=') return null;
    i++;
    if (!skipCfws()) return null;
    let value: string;
    if (h[i] === '"') {
      let v = '';
      for (i++; i < h.length && h[i] !== '"'; i++) v += h[i] === '\\' ? (h[++i] ?? '') : h[i];
      if (h[i] !== '"') return null;
      i++;
      value = v;
    } else {
      const token = /^[^\s;()"]+/.exec(h.slice(i));
      if (!token) return null;
      i += token[0].length;
      value = token[0];
    }
    if (key[0].toLowerCase() === 'envelope-from') found.push(value.replace(/^<(.*)>$/, '$1'));
    if (!skipCfws()) return null;
    if (i < h.length && h[i] !== ';') return null;
    i++;
  }
  return found.length === 1 && found[0] ? found[0] : null;
}

/** The domains a SendGrid `dkim` field says passed (`{@a.example : pass, @b.example : fail}`), each entry read whole. */
function dkimPassedIn(dkim: string | undefined): string[] {
  const list = (dkim ?? '').trim().replace(/^\{(.*)\}$/s, '$1');
  return list
    .split(',')
    .map((entry) => /^\s*@([a-z0-9](?:[a-z0-9-]*[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]*[a-z0-9])?)*)\s*:\s*([a-z]+)\s*$/i.exec(entry))
    .flatMap((m) => (m && m[2]!.toLowerCase() === 'pass' ? [m[1]!] : []));
}

function fromPostmark(p: Record<string, unknown>): EmailEvent {
  // what is not an attachment object (null, a string) is not an attachment
  const attachments = (Array.isArray(p.Attachments) ? (p.Attachments as unknown[]) : []).filter(
    (a): a is Record<string, unknown> => typeof a === 'object' && a !== null && !Array.isArray(a),
  );
  // Postmark passes the message's headers on, its own Received-SPF first: one further down, or any
  // Authentication-Results, may be the sender's own writing
  const headers = (Array.isArray(p.Headers) ? (p.Headers as unknown[]) : []).filter(
    (h): h is { Name: string; Value: string } => typeof h === 'object' && h !== null && typeof (h as { Name?: unknown }).Name === 'string',
  );
  const receivedSpf = headers.find((h) => h.Name.toLowerCase() === 'received-spf');
  const vouched: Vouched = { dkimPassed: [], spfPassedFor: spfPassedIn(receivedSpf ? String(receivedSpf.Value ?? '') : undefined) };
  return {
    provider: 'postmark',
    from: text(p.From),
    verified_from: verifiedFrom(text(p.From), vouched),
    to: addresses(p.To),
    cc: addresses(p.Cc),
    subject: text(p.Subject),
    text: text(p.TextBody),
    html: text(p.HtmlBody),
    message_id: text(p.MessageID),
    attachments: attachments.map((a) => ({
      name: text(a.Name) ?? 'attachment',
      type: text(a.ContentType) ?? 'application/octet-stream',
      size: typeof a.ContentLength === 'number' ? a.ContentLength : typeof a.Content === 'string' ? Buffer.from(a.Content, 'base64').length : 0,
    })),
  };
}

function fromForm(form: Form): ParsedEmail {
  const f = form.fields;
  if (f.signature !== undefined || f.token !== undefined || f['body-plain'] !== undefined) {
    // Mailgun's SPF verdict is for the envelope sender (`sender`); its DKIM verdict names no domain (a
    // signature of the sender's own domain passes it), so it vouches for none
    // (a verdict or a sender given twice is no verdict: the form kept the last, which the sender's own fields could be)
    const repeated = (name: string) => form.repeated?.has(name) ?? false;
    const spfPassed = /^pass$/i.test(f['X-Mailgun-Spf'] ?? '') && !repeated('X-Mailgun-Spf') && !repeated('sender');
    const mailgunVouched: Vouched = { dkimPassed: [], spfPassedFor: spfPassed ? (f.sender ?? null) : null };
    const mailgunFrom = text(f.from ?? f.From ?? f.sender);
    return {
      email: {
        provider: 'mailgun',
        from: mailgunFrom,
        verified_from: verifiedFrom(mailgunFrom, mailgunVouched),
        to: addresses(f.To ?? f.recipient),
        cc: addresses(f.Cc),
        subject: text(f.subject ?? f.Subject),
        text: text(f['body-plain']),
        html: text(f['body-html']),
        message_id: text(f['Message-Id'] ?? f['message-id']),
        attachments: form.files.map(({ name, type, size }) => ({ name, type, size })),
      },
      mailgun: { timestamp: f.timestamp, token: f.token, signature: f.signature },
    };
  }
  // SendGrid names attachment files attachment1..N and describes them in `attachment-info`
  let info: Record<string, { filename?: string; name?: string; type?: string }> = {};
  try {
    info = f['attachment-info'] ? (JSON.parse(f['attachment-info']) as typeof info) : {};
  } catch {
    info = {};
  }
  // SendGrid's verdicts: `SPF` for the envelope sender (in `envelope`), `dkim` as {@domain : pass, ...}
  let envelopeFrom: string | null = null;
  try {
    const envelope: unknown = f.envelope ? JSON.parse(f.envelope) : null;
    envelopeFrom = typeof (envelope as { from?: unknown } | null)?.from === 'string' ? (envelope as { from: string }).from : null;
  } catch {
    envelopeFrom = null;
  }
  const sendgridVouched: Vouched = {
    dkimPassed: form.repeated?.has('dkim') ? [] : dkimPassedIn(f.dkim),
    spfPassedFor: /^\s*pass\b/i.test(f.SPF ?? '') && !form.repeated?.has('SPF') && !form.repeated?.has('envelope') ? envelopeFrom : null,
  };
  return {
    email: {
      provider: 'sendgrid',
      from: text(f.from),
      verified_from: verifiedFrom(text(f.from), sendgridVouched),
      to: addresses(f.to),
      cc: addresses(f.cc),
      subject: text(f.subject),
      text: text(f.text),
      html: text(f.html),
      message_id: messageIdOf(f.headers),
      attachments: form.files.map((file) => ({
        name: info[file.field]?.filename ?? info[file.field]?.name ?? file.name,
        type: info[file.field]?.type ?? file.type,
        size: file.size,
      })),
    },
  };
}
