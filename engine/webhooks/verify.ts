// How each provider kind signs its requests, and what a verified request means: its event type,
// the provider's id for it, what must not be seen twice, and the normalized event runs receive.
// Pure functions over the exact bytes received; every comparison is constant-time.
import { createHash, createHmac, timingSafeEqual } from 'node:crypto';
import { unsafeJson, WebhookRejectedError, type WebhookProvider } from '../platform/index.js';
import { mailgunFieldsOfForm, mailgunFieldsOfMultipart, parseEmail } from './email.js';

export type Headers = Record<string, string | string[] | undefined>;

export type Inbound = { headers: Headers; body: Buffer };

export type VerifyContext = {
  /** the tenant's current secrets for this kind: one, or two while rotating */
  secrets: string[];
  nowMs: number;
  windowSeconds: number;
};

export type Verified = {
  event: string | null;
  action: string | null;
  /** the provider's own id of this event: one delivery per id */
  providerId: string | null;
  /** when a second request carries the same provider id: a replay to refuse (409), or a retry to acknowledge (200) */
  repeatIs: 'replay' | 'retry';
  /** what was signed; seen again within the window it is a replay */
  replayKey: string | null;
  /**
   * the provider's retry is the same request byte for byte (PagerDuty, Linear): seen again, it is its
   * event's duplicate, acknowledged, not a replay; a provider that signs each try anew (Slack, ours) never repeats one
   */
  retriesResend?: boolean;
  /**
   * the delivery id is not signed (GitHub, Linear): the same signed body is looked for in the store, not only in
   * Redis's window, and is the same delivery (a retry, `repeatIs: 'retry'`, naming the same id) or a replay
   */
  signedOnce?: boolean;
  /**
   * the delivery id is not in what was signed (ours: `X-Service-Delivery`, which a captured request can carry
   * changed, added or dropped; Mailgun's: the Message-Id, a field its signature does not cover): what was signed
   * is looked for in the store, so the request sent again under any id is a replay once Redis has forgotten it
   */
  idUnsigned?: boolean;
  /** the normalized event: what matching reads and runs receive */
  event_payload: Record<string, unknown>;
  /** false when the raw body is not worth keeping (email: the event holds what matters, not the attachments) */
  keepBody: boolean;
  /** an answer that is not a delivery: the chat url_verification handshake */
  handshake?: Record<string, unknown>;
  /** Slack shows a slash command's or interaction's response body to the user: answer with none */
  emptyReply?: boolean;
};

/** The chat window is Slack's own five minutes, whatever the configured window of the other kinds. */
const CHAT_WINDOW_SECONDS = 300;

/** How far from now a kind's signed timestamp may be, either way. */
export const windowOf = (kind: WebhookProvider, configuredSeconds: number) => (kind === 'chat' ? CHAT_WINDOW_SECONDS : configuredSeconds);

export function header(headers: Headers, name: string): string | undefined {
  const v = headers[name];
  return Array.isArray(v) ? v[0] : v;
}

/**
 * A delivery id: a blank one (an empty header, a Message-ID of spaces) is none. Kept, it would be one id shared by
 * every delivery that sends it blank, each refused as a replay of the first.
 */
const idOrNull = (v: string | null | undefined): string | null => (v?.trim() ? v : null);

/** The delivery id named in the first of these headers that names one. */
function idHeader(headers: Headers, ...names: string[]): string | null {
  for (const name of names) {
    const id = idOrNull(header(headers, name));
    if (id) return id;
  }
  return null;
}

export function sha256Hex(data: Buffer | string): string {
  return createHash('sha256').update(data).digest('hex');
}

function hmacHex(secret: string, ...parts: (Buffer | string)[]): string {
  const h = createHmac('sha256', secret);
  for (const p of parts) h.update(p);
  return h.digest('hex');
}

const HEX_SHA256 = /^[0-9a-fA-F]{64}$/;

/** Constant-time equality of two hex digests (any case); false for anything that is not one. */
function sameHex(expected: string, given: string): boolean {
  if (!HEX_SHA256.test(given)) return false;
  return timingSafeEqual(Buffer.from(expected, 'hex'), Buffer.from(given, 'hex'));
}

/** The first candidate signature that any secret produces, or null. Every pair is compared. */
function matchAny(secrets: string[], candidates: string[], sign: (secret: string) => string): string | null {
  let matched: string | null = null;
  for (const secret of secrets) {
    const expected = sign(secret);
    for (const c of candidates) if (sameHex(expected, c) && matched === null) matched = c.toLowerCase();
  }
  return matched;
}

function missing(what: string): never {
  throw new WebhookRejectedError('webhook-signature-missing', `${what} is missing`);
}

function invalid(what: string): never {
  throw new WebhookRejectedError('webhook-signature-invalid', `${what} does not match any of this tenant's secrets for this kind`);
}

function checkWindow(atMs: number, ctx: VerifyContext, windowSeconds = ctx.windowSeconds): void {
  if (!Number.isFinite(atMs)) throw new WebhookRejectedError('webhook-timestamp-outside-window', 'the signed timestamp is missing or not a number');
  const skew = (atMs - ctx.nowMs) / 1000;
  if (Math.abs(skew) > windowSeconds) {
    throw new WebhookRejectedError(
      'webhook-timestamp-outside-window',
      `the signed timestamp is ${Math.round(Math.abs(skew))} s ${skew < 0 ? 'old' : 'in the future'}; the window is ${windowSeconds} s either way`,
    );
  }
}

function mediaType(headers: Headers): string {
  return (header(headers, 'content-type') ?? '').split(';')[0]!.trim().toLowerCase();
}

function asObject(v: unknown): Record<string, unknown> {
  return v && typeof v === 'object' && !Array.isArray(v) ? (v as Record<string, unknown>) : {};
}

function str(v: unknown): string | null {
  return typeof v === 'string' && v.length ? v : typeof v === 'number' ? String(v) : null;
}

function parseJson(body: Buffer, what = 'the body'): Record<string, unknown> {
  const unsafe = unsafeJson(body, what);
  if (unsafe) throw new WebhookRejectedError('webhook-payload-invalid', unsafe.detail);
  let parsed: unknown;
  try {
    parsed = JSON.parse(body.toString('utf8'));
  } catch {
    throw new WebhookRejectedError('webhook-payload-invalid', `${what} is not valid JSON`);
  }
  if (!parsed || typeof parsed !== 'object' || Array.isArray(parsed))
    throw new WebhookRejectedError('webhook-payload-invalid', `${what} must be a JSON object`);
  return parsed as Record<string, unknown>;
}

function parseForm(body: Buffer): Record<string, string> {
  return Object.fromEntries(new URLSearchParams(body.toString('utf8')));
}

/** A JSON body, or a form whose `payload` field holds the JSON (GitHub's form content type, Slack's interactions). */
function jsonOrFormPayload(inb: Inbound): Record<string, unknown> {
  if (mediaType(inb.headers) === 'application/x-www-form-urlencoded') {
    const form = parseForm(inb.body);
    if (form.payload === undefined) throw new WebhookRejectedError('webhook-payload-invalid', 'a form body must carry the event in its `payload` field');
    return parseJson(Buffer.from(form.payload), 'the `payload` field');
  }
  return parseJson(inb.body);
}

// The headers each kind's signature is in, read the same way before the body (a request without them is refused
// unread) and by its verifier after it.
const codehostSignature = (headers: Headers) => header(headers, 'x-hub-signature-256') ?? missing('X-Hub-Signature-256');

function chatSignature(headers: Headers): { given: string; ts: string } {
  const given = header(headers, 'x-chat-signature') ?? header(headers, 'x-slack-signature') ?? missing('X-Chat-Signature (or X-Slack-Signature)');
  const ts =
    header(headers, 'x-chat-request-timestamp') ??
    header(headers, 'x-slack-request-timestamp') ??
    missing('X-Chat-Request-Timestamp (or X-Slack-Request-Timestamp)');
  return { given, ts };
}

const trackerSignature = (headers: Headers) =>
  header(headers, 'tracker-signature') ?? header(headers, 'linear-signature') ?? missing('Tracker-Signature (or Linear-Signature)');

const pagerSignature = (headers: Headers) =>
  header(headers, 'x-pager-signature') ?? header(headers, 'x-pagerduty-signature') ?? missing('X-Pager-Signature (or X-PagerDuty-Signature)');

const genericSignature = (headers: Headers) => header(headers, 'x-service-signature') ?? missing('X-Service-Signature');

const EMAIL_CREDENTIALS = 'credentials (HTTP Basic, or Mailgun’s timestamp, token and signature fields)';

/**
 * An email request's HTTP Basic password, checked: true when a current secret makes it, false when there is none;
 * refused when it is wrong, or the Authorization not Basic. A JSON delivery is Postmark's, which signs with Basic:
 * without it there is nothing to check (Mailgun's signature is in a form's fields), and it is refused.
 */
function emailBasic(headers: Headers, secrets: string[]): boolean {
  const authorization = header(headers, 'authorization');
  const basic = authorization?.match(/^Basic\s+([A-Za-z0-9+/=]+)\s*$/i);
  if (authorization !== undefined && !basic) invalid('Authorization (expected Basic)');
  let basicOk = false;
  if (basic) {
    const decoded = Buffer.from(basic[1]!, 'base64').toString('utf8');
    const password = decoded.slice(decoded.indexOf(':') + 1);
    basicOk = matchAny(secrets, [sha256Hex(password)], (s) => sha256Hex(s)) !== null;
    if (!basicOk) invalid('the Basic password');
  }
  if (!basicOk && mediaType(headers) === 'application/json') missing(EMAIL_CREDENTIALS);
  // a form without Basic is known to be Mailgun's only from its fields, read after the body is inflated: a
  // compressed one of 144 bytes inflated to the 25 MB limit (40 at once took the process to 2.6 GB). Mailgun does
  // not compress its posts; a sender that does must sign with Basic, which is checked before a byte is read
  const encoding = header(headers, 'content-encoding')?.trim().toLowerCase();
  if (!basicOk && encoding && encoding !== 'identity')
    throw new WebhookRejectedError('webhook-signature-missing', 'HTTP Basic credentials are missing: a compressed email delivery must carry them');
  return basicOk;
}

/** GitHub: `X-Hub-Signature-256: sha256=<hex HMAC of the body>`. No timestamp is signed, so what was signed must never repeat. */
function codehost(inb: Inbound, ctx: VerifyContext): Verified {
  const given = codehostSignature(inb.headers);
  const hex = given.startsWith('sha256=') ? given.slice(7) : '';
  const matched = matchAny(ctx.secrets, [hex], (s) => hmacHex(s, inb.body)) ?? invalid('X-Hub-Signature-256');
  const payload = jsonOrFormPayload(inb);
  const event = header(inb.headers, 'x-github-event') ?? null;
  return {
    event,
    action: str(payload.action),
    providerId: idHeader(inb.headers, 'x-github-delivery'),
    repeatIs: 'replay',
    replayKey: matched,
    signedOnce: true,
    event_payload: payload,
    keepBody: true,
  };
}

/** Slack: `v0=<hex HMAC of "v0:<timestamp>:<body>">`, five minutes either way; JSON events, or forms for commands and interactions. */
function chat(inb: Inbound, ctx: VerifyContext): Verified {
  const { given, ts } = chatSignature(inb.headers);
  const hex = given.startsWith('v0=') ? given.slice(3) : '';
  const matched = matchAny(ctx.secrets, [hex], (s) => hmacHex(s, `v0:${ts}:`, inb.body)) ?? invalid('X-Chat-Signature');
  checkWindow(/^\d{1,12}$/.test(ts) ? Number(ts) * 1000 : NaN, ctx, windowOf('chat', ctx.windowSeconds));
  // Slack still sends its legacy verification `token` in every body: a secret, kept neither in the stored
  // body (not kept) nor in what runs receive (removed)
  const base = { repeatIs: 'retry' as const, replayKey: `${ts}:${matched}`, keepBody: false };
  const withoutToken = <T extends Record<string, unknown>>(v: T): T => {
    const { token: _token, ...rest } = v;
    return rest as T;
  };

  if (mediaType(inb.headers) === 'application/x-www-form-urlencoded') {
    const form = parseForm(inb.body);
    if (form.payload !== undefined) {
      const payload = parseJson(Buffer.from(form.payload), 'the `payload` field');
      const actions = Array.isArray(payload.actions) ? payload.actions : [];
      return {
        ...base,
        event: str(payload.type) ?? 'interaction',
        action: str(asObject(actions[0]).action_id),
        providerId: null,
        event_payload: withoutToken(payload),
        emptyReply: true,
      };
    }
    if (form.command !== undefined) {
      return { ...base, event: 'slash_command', action: form.command, providerId: null, event_payload: withoutToken(form), emptyReply: true };
    }
    throw new WebhookRejectedError('webhook-payload-invalid', 'a form body must be a slash command (`command`) or an interaction (`payload`)');
  }
  const payload = parseJson(inb.body);
  if (payload.type === 'url_verification') {
    if (typeof payload.challenge !== 'string') throw new WebhookRejectedError('webhook-payload-invalid', 'url_verification carries no challenge');
    return { ...base, event: 'url_verification', action: null, providerId: null, event_payload: payload, handshake: { challenge: payload.challenge } };
  }
  const inner = asObject(payload.event);
  return {
    ...base,
    event: str(inner.type) ?? str(payload.type),
    action: str(inner.subtype),
    providerId: str(payload.event_id),
    event_payload: withoutToken(payload),
  };
}

/** Linear: `Tracker-Signature` (or `Linear-Signature`) is the bare hex HMAC of the body; `webhookTimestamp` (ms) in the body is signed. */
function tracker(inb: Inbound, ctx: VerifyContext): Verified {
  const given = trackerSignature(inb.headers);
  const matched = matchAny(ctx.secrets, [given], (s) => hmacHex(s, inb.body)) ?? invalid('Tracker-Signature');
  const payload = parseJson(inb.body);
  checkWindow(typeof payload.webhookTimestamp === 'number' ? payload.webhookTimestamp : NaN, ctx);
  return {
    event: str(payload.type) ?? header(inb.headers, 'linear-event') ?? null,
    action: str(payload.action),
    // (not the body's webhookId: that names the webhook, the same for every event it sends)
    providerId: idHeader(inb.headers, 'tracker-delivery', 'linear-delivery'),
    repeatIs: 'retry',
    replayKey: matched,
    retriesResend: true,
    // the delivery header is not signed: the same body under another id must not be a new delivery
    signedOnce: true,
    event_payload: payload,
    keepBody: true,
  };
}

/** PagerDuty v3: `v1=<hex>` entries separated by commas; any entry that any current secret makes passes. */
function pager(inb: Inbound, ctx: VerifyContext): Verified {
  const given = pagerSignature(inb.headers);
  const entries = given
    .split(',')
    .map((e) => e.trim())
    .filter((e) => e.startsWith('v1='))
    .map((e) => e.slice(3));
  if (!matchAny(ctx.secrets, entries, (s) => hmacHex(s, inb.body))) invalid('X-Pager-Signature');
  const payload = parseJson(inb.body);
  const event = asObject(payload.event);
  // nothing time-bound is signed: the event's id is what makes it once only, so an event has one
  const id = str(event.id);
  if (!id) throw new WebhookRejectedError('webhook-payload-invalid', 'a pager event names its id (event.id)');
  return {
    event: str(event.event_type),
    action: null,
    providerId: id,
    repeatIs: 'retry',
    // the body signed, not the entry that matched (see generic)
    replayKey: sha256Hex(inb.body),
    retriesResend: true,
    event_payload: payload,
    keepBody: true,
  };
}

/** Ours: `X-Service-Signature: t=<unix s>,v1=<hex HMAC of "<t>.<body>">[,v1=…]`, t inside the window. */
function generic(inb: Inbound, ctx: VerifyContext): Verified {
  const given = genericSignature(inb.headers);
  const parts = given.split(',').map((p) => p.trim());
  const t = parts.find((p) => p.startsWith('t='))?.slice(2);
  const entries = parts.filter((p) => p.startsWith('v1=')).map((p) => p.slice(3));
  if (t === undefined || !/^\d{1,12}$/.test(t) || !entries.length) invalid('X-Service-Signature (expected t=<unix seconds>,v1=<hex>)');
  if (!matchAny(ctx.secrets, entries, (s) => hmacHex(s, `${t}.`, inb.body))) invalid('X-Service-Signature');
  checkWindow(Number(t) * 1000, ctx);
  const payload = parseJson(inb.body);
  const delivery = idHeader(inb.headers, 'x-service-delivery');
  return {
    event: header(inb.headers, 'x-service-event') ?? str(payload.type) ?? str(payload.event),
    action: str(payload.action),
    providerId: delivery ?? str(payload.id),
    // with the header or without it: the same signed request can be sent again with it added, changed or dropped
    idUnsigned: true,
    repeatIs: 'retry',
    // what was signed (t and the body), not the entry that matched: a request signed by both secrets of a
    // rotation, sent again with one of its entries, is the same signed request
    replayKey: `${t}:${sha256Hex(inb.body)}`,
    event_payload: payload,
    keepBody: true,
  };
}

/** Inbound mail: HTTP Basic with the tenant's email secret as password (SendGrid, Postmark), or Mailgun's signature fields. */
async function email(inb: Inbound, ctx: VerifyContext): Promise<Verified> {
  // Basic, or none: a JSON body without it is refused unparsed (26 MB of JSON took 3 s of the thread), as the intake refuses it unread
  const basicOk = emailBasic(inb.headers, ctx.secrets);
  // a urlencoded form's signature fields are checked before the rest of it is decoded
  if (!basicOk && mediaType(inb.headers) === 'application/x-www-form-urlencoded') mailgunToken(mailgunFieldsOfForm(inb.body), ctx);
  // and a multipart one's, in a bounded pass, before the whole form is read (and read again in its charsets)
  if (!basicOk && mediaType(inb.headers) === 'multipart/form-data')
    mailgunToken(
      await mailgunFieldsOfMultipart(header(inb.headers, 'content-type') ?? '', inb.body).catch((err: unknown) => {
        throw err instanceof WebhookRejectedError ? err : new WebhookRejectedError('webhook-payload-invalid', 'the email delivery could not be read');
      }),
      ctx,
    );
  // read before its signature is checked (Mailgun's is in the body): what it cannot read is the sender's fault, never a 500
  const parsed = await parseEmail(header(inb.headers, 'content-type') ?? '', inb.body).catch((err: unknown) => {
    throw err instanceof WebhookRejectedError ? err : new WebhookRejectedError('webhook-payload-invalid', 'the email delivery could not be read');
  });
  const base = { event: 'email', action: null, keepBody: false, event_payload: parsed.email as unknown as Record<string, unknown> };
  const messageId = idOrNull(parsed.email.message_id);
  // a mail without a Message-ID is known by its bytes: SendGrid's retry of a post whose answer it did not get sends
  // the same bytes again, which started the automation twice (two tasks of one mail)
  if (basicOk) return { ...base, providerId: messageId ?? `body:${sha256Hex(inb.body)}`, repeatIs: 'retry', replayKey: null };
  // a Mailgun token signs one request: seen again, it is a replay, refused before it is counted. The mail is
  // known by its Message-ID, as SendGrid's and Postmark's are: sent again (signed anew), it is a duplicate; one
  // without a Message-ID is known by its token, in the store too
  const token = mailgunToken(parsed.mailgun ?? {}, ctx);
  return {
    ...base,
    providerId: messageId ?? `mailgun-token:${token}`,
    repeatIs: messageId ? 'retry' : 'replay',
    replayKey: `mailgun:${token}`,
    // the signature covers the timestamp and token only: the Message-Id and the mail can be anything
    idUnsigned: true,
  };
}

/** Checks Mailgun's signature fields (an HMAC of timestamp and token, the timestamp inside the window): the token. */
function mailgunToken(fields: { timestamp?: string; token?: string; signature?: string }, ctx: VerifyContext): string {
  const { timestamp, token, signature } = fields;
  if (!timestamp || !token || !signature) missing(EMAIL_CREDENTIALS);
  matchAny(ctx.secrets, [signature], (s) => hmacHex(s, timestamp, token)) ?? invalid('the Mailgun signature');
  checkWindow(/^\d{1,12}$/.test(timestamp) ? Number(timestamp) * 1000 : NaN, ctx);
  return token;
}

const VERIFIERS: Record<WebhookProvider, (inb: Inbound, ctx: VerifyContext) => Verified | Promise<Verified>> = {
  codehost,
  chat,
  tracker,
  pager,
  email,
  generic,
};

/** What of each kind's verification its headers alone decide. */
const HEADER_CHECKS: Record<WebhookProvider, (headers: Headers, secrets: string[]) => unknown> = {
  codehost: codehostSignature,
  chat: chatSignature,
  tracker: trackerSignature,
  pager: pagerSignature,
  email: emailBasic,
  generic: genericSignature,
};

/**
 * The media types each kind's body comes in (its operation's in the OpenAPI document): GitHub and Slack send
 * JSON or a form whose `payload` holds it, the mail providers multipart or a form or JSON, the others JSON.
 */
export const WEBHOOK_MEDIA_TYPES: Record<WebhookProvider, readonly string[]> = {
  codehost: ['application/json', 'application/x-www-form-urlencoded'],
  chat: ['application/json', 'application/x-www-form-urlencoded'],
  tracker: ['application/json'],
  pager: ['application/json'],
  email: ['multipart/form-data', 'application/json', 'application/x-www-form-urlencoded'],
  generic: ['application/json'],
};

/**
 * Refuses (throws) a request whose headers already decide its refusal, with the problem verifyDelivery would
 * give once its body is read: a body of a type its kind does not come in (415: a text/plain push was read as
 * JSON and accepted); a signature header missing; for email, credentials that are wrong, or none for JSON (a
 * form without Basic may be Mailgun's, signed in its fields). What passes is verified whole after.
 */
export function checkHeaders(kind: WebhookProvider, headers: Headers, secrets: string[]): void {
  const type = mediaType(headers);
  if (!WEBHOOK_MEDIA_TYPES[kind].includes(type))
    throw new WebhookRejectedError(
      'unsupported-media-type',
      `a ${kind} delivery is ${WEBHOOK_MEDIA_TYPES[kind].join(' or ')}, not ${type ? JSON.stringify(type.slice(0, 100)) : 'a body of no Content-Type'}`,
    );
  HEADER_CHECKS[kind](headers, secrets);
}

export async function verifyDelivery(kind: WebhookProvider, inb: Inbound, ctx: VerifyContext): Promise<Verified> {
  const verified = await VERIFIERS[kind](inb, ctx);
  return { ...verified, providerId: idOrNull(verified.providerId) };
}

/** The headers a delivery keeps: event names, ids and retry counts. Never credentials or signatures. */
const KEPT_HEADERS = [
  'content-type',
  'user-agent',
  'x-github-event',
  'x-github-delivery',
  'x-github-hook-id',
  'x-github-hook-installation-target-type',
  'x-github-hook-installation-target-id',
  'x-slack-retry-num',
  'x-slack-retry-reason',
  'x-chat-request-timestamp',
  'x-slack-request-timestamp',
  'linear-delivery',
  'linear-event',
  'tracker-delivery',
  'tracker-event',
  'x-webhook-id',
  'x-service-event',
  'x-service-delivery',
];

export function keptHeaders(headers: Headers, chars = 512): Record<string, string> {
  const kept: Record<string, string> = {};
  for (const name of KEPT_HEADERS) {
    const v = header(headers, name);
    if (v !== undefined) kept[name] = v.slice(0, chars);
  }
  return kept;
}

/** Does a webhook trigger's event filter take this event? No filter takes all; `push`, `push.opened`-style names and `*` match. */
export function eventMatches(filter: string[] | undefined, event: string | null, action: string | null): boolean {
  if (!filter?.length) return true;
  return filter.some((f) => f === '*' || (event !== null && (f === event || (action !== null && f === `${event}.${action}`))));
}
