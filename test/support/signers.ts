// Request builders that sign the way each provider does. GitHub's comes from @octokit/webhooks-methods;
// the others are built by hand from the providers' documented schemes and, in the tests, checked
// against the providers' own verifiers (@slack/bolt, @linear/sdk) before they reach the service.
import { sign as octokitSign } from '@octokit/webhooks-methods';
import { createHmac, randomUUID } from 'node:crypto';

export type Signed = { body: string | Buffer; headers: Record<string, string> };

const hmac = (secret: string, data: string) => createHmac('sha256', secret).update(data).digest('hex');
const nowSeconds = () => Math.floor(Date.now() / 1000);

export async function codehost(secret: string, payload: unknown, opts: { event?: string; delivery?: string } = {}): Promise<Signed> {
  const body = JSON.stringify(payload);
  return {
    body,
    headers: {
      'content-type': 'application/json',
      'x-hub-signature-256': await octokitSign(secret, body),
      'x-github-event': opts.event ?? 'push',
      'x-github-delivery': opts.delivery ?? randomUUID(),
      'user-agent': 'GitHub-Hookshot/test',
    },
  };
}

/** Slack's v0 scheme; `names: 'slack'` uses Slack's own header names. */
export function chat(secret: string, body: string, opts: { ts?: number; names?: 'chat' | 'slack'; contentType?: string } = {}): Signed {
  const ts = String(opts.ts ?? nowSeconds());
  const signature = `v0=${hmac(secret, `v0:${ts}:${body}`)}`;
  const [sigName, tsName] = opts.names === 'slack' ? ['x-slack-signature', 'x-slack-request-timestamp'] : ['x-chat-signature', 'x-chat-request-timestamp'];
  return { body, headers: { 'content-type': opts.contentType ?? 'application/json', [sigName]: signature, [tsName]: ts } };
}

/** Linear's scheme: bare hex HMAC of the body, whose webhookTimestamp (ms) is signed with it. */
export function tracker(secret: string, payload: Record<string, unknown>, opts: { at?: number; delivery?: string; names?: 'tracker' | 'linear' } = {}): Signed {
  const body = JSON.stringify({ ...payload, webhookTimestamp: opts.at ?? Date.now() });
  const linear = opts.names === 'linear';
  return {
    body,
    headers: {
      'content-type': 'application/json',
      [linear ? 'linear-signature' : 'tracker-signature']: hmac(secret, body),
      [linear ? 'linear-delivery' : 'tracker-delivery']: opts.delivery ?? randomUUID(),
    },
  };
}

/** PagerDuty v3: one `v1=` entry per secret, comma-separated. */
export function pager(secrets: string[], payload: unknown, opts: { names?: 'pager' | 'pagerduty'; extra?: string[] } = {}): Signed {
  const body = JSON.stringify(payload);
  const entries = [...(opts.extra ?? []), ...secrets.map((s) => `v1=${hmac(s, body)}`)].join(',');
  return { body, headers: { 'content-type': 'application/json', [opts.names === 'pagerduty' ? 'x-pagerduty-signature' : 'x-pager-signature']: entries } };
}

export function generic(secrets: string[], payload: unknown, opts: { t?: number; event?: string; delivery?: string } = {}): Signed {
  const body = JSON.stringify(payload);
  const t = String(opts.t ?? nowSeconds());
  const headers: Record<string, string> = {
    'content-type': 'application/json',
    'x-service-signature': [`t=${t}`, ...secrets.map((s) => `v1=${hmac(s, `${t}.${body}`)}`)].join(','),
  };
  if (opts.event) headers['x-service-event'] = opts.event;
  if (opts.delivery) headers['x-service-delivery'] = opts.delivery;
  return { body, headers };
}

/** Mailgun's route signature fields: hex HMAC of timestamp + token. */
export function mailgunFields(secret: string, opts: { ts?: number; token?: string } = {}): Record<string, string> {
  const timestamp = String(opts.ts ?? nowSeconds());
  const token = opts.token ?? randomUUID().replace(/-/g, '');
  return { timestamp, token, signature: hmac(secret, timestamp + token) };
}

export const basicAuth = (password: string, user = 'inbound') => `Basic ${Buffer.from(`${user}:${password}`).toString('base64')}`;
