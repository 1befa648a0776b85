// Inbound mail from three providers, normalized to one event: SendGrid Inbound Parse
// (multipart/form-data), Postmark inbound (JSON) and Mailgun routes (form or multipart).
// Attachments are counted, never kept: the event lists their name, type and size.
import busboy from 'busboy';
import { Readable } from 'node:stream';
import { unsafeJson, WebhookRejectedError } from '../platform/index.js';

export type EmailAttachment = { name: string; type: string; size: number };

export type EmailEvent = {
  provider: 'sendgrid' | 'postmark' | 'mailgun';
  from: string | null;
  to: string[];
  cc: string[];
  subject: string | null;
  text: string | null;
  html: string | null;
  message_id: string | null;
  attachments: EmailAttachment[];
};

export type ParsedEmail = { email: EmailEvent; mailgun?: { timestamp?: string; token?: string; signature?: string } };

type Form = { fields: Record<string, string>; files: (EmailAttachment & { field: string })[] };

const MAX_FIELDS = 1000;
const MAX_FILES = 100;

export async function parseEmail(contentType: string, body: Buffer): Promise<ParsedEmail> {
  const media = contentType.split(';')[0]!.trim().toLowerCase();
  if (media === 'application/json') return { email: fromPostmark(parseObject(body)) };
  if (media === 'multipart/form-data') return fromForm(await parseMultipart(contentType, body));
  if (media === 'application/x-www-form-urlencoded') return fromForm({ fields: Object.fromEntries(new URLSearchParams(body.toString('utf8'))), files: [] });
  throw new WebhookRejectedError('webhook-payload-invalid', 'an email delivery is multipart/form-data, application/x-www-form-urlencoded or application/json');
}

function parseObject(body: Buffer): Record<string, unknown> {
  const unsafe = unsafeJson(body);
  if (unsafe) throw new WebhookRejectedError('webhook-payload-invalid', unsafe.detail);
  try {
    const v: unknown = JSON.parse(body.toString('utf8'));
    if (v && typeof v === 'object' && !Array.isArray(v)) return v as Record<string, unknown>;
  } catch {
    // answered below
  }
  throw new WebhookRejectedError('webhook-payload-invalid', 'the body is not a JSON object');
}

function parseMultipart(contentType: string, body: Buffer): Promise<Form> {
  return new Promise((resolve, reject) => {
    const form: Form = { fields: {}, files: [] };
    let bb: busboy.Busboy;
    try {
      bb = busboy({ headers: { 'content-type': contentType }, limits: { fields: MAX_FIELDS, files: MAX_FILES, fieldSize: body.length } });
    } catch (err) {
      reject(new WebhookRejectedError('webhook-payload-invalid', `the multipart body cannot be read: ${(err as Error).message}`));
      return;
    }
    bb.on('field', (name, value) => {
      form.fields[name] = value;
    });
    bb.on('file', (field, stream, info) => {
      const file = { field, name: info.filename ?? field, type: info.mimeType || 'application/octet-stream', size: 0 };
      form.files.push(file);
      stream.on('data', (chunk: Buffer) => {
        file.size += chunk.length;
      });
    });
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

function fromPostmark(p: Record<string, unknown>): EmailEvent {
  // what is not an attachment object (null, a string) is not an attachment
  const attachments = (Array.isArray(p.Attachments) ? (p.Attachments as unknown[]) : []).filter(
    (a): a is Record<string, unknown> => typeof a === 'object' && a !== null && !Array.isArray(a),
  );
  return {
    provider: 'postmark',
    from: text(p.From),
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
    return {
      email: {
        provider: 'mailgun',
        from: text(f.from ?? f.From ?? f.sender),
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
  return {
    email: {
      provider: 'sendgrid',
      from: text(f.from),
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
