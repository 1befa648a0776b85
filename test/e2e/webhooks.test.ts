import { LinearWebhookClient } from '@linear/sdk/webhooks';
// the verifier alone: the package's index loads @slack/socket-mode, whose undici 7 makes itself the process's
// fetch dispatcher on import, and Node 20's fetch then refuses requests that name their content-length (any
// test file that shares this mocha worker process failed)
import { isValidSlackRequest } from '@slack/bolt/dist/receivers/verify-request.js';
import { verify as octokitVerify } from '@octokit/webhooks-methods';
import { UnrecoverableError, Worker } from 'bullmq';
import { expect } from 'chai';
import { createHash, createHmac, randomBytes, randomUUID } from 'node:crypto';
import { gzipSync } from 'node:zlib';
import fs from 'node:fs';
import path from 'node:path';
import Database from 'better-sqlite3';
import { bodyOfAnswer, rawExchange } from '../support/raw-http.js';
import { ServiceUnavailableError } from '../../engine/platform/errors.js';
import { newId } from '../../engine/platform/ids.js';
import { createSecretBox } from '../../engine/platform/secret-box.js';
import { eventually, finishedRun, KEYS, releasable, scanKeys, startHarness, type Harness, type Reply } from '../support/harness.js';
import * as sign from '../support/signers.js';

type Body = Record<string, any>;

const hmacHex = (secret: string, data: string) => createHmac('sha256', secret).update(data).digest('hex');

const SECRET = {
  codehost: 'codehost-secret-0123456789',
  codehostOld: 'codehost-old-secret-98765',
  chat: '8f742231b10e8888abcd99yyyzzz85a5',
  tracker: 'lin_wh_tracker-secret-0123456789',
  pager: 'pager-secret-new-0123456789',
  pagerOld: 'pager-secret-old-0123456789',
  email: 'email-inbound-password-0123',
  generic: 'generic-secret-0123456789ab',
};

describe('webhook intake', function () {
  this.timeout(30_000);
  let h: Harness;

  const post = (kind: string, signed: sign.Signed, tenant = 'tenant-a'): Promise<Reply<Body>> =>
    h.call<Body>('POST', `/webhooks/${tenant}/${kind}`, { key: null, raw: signed.body, headers: signed.headers });

  const delivery = async (id: string, key = KEYS.a) => (await h.call<Body>('GET', `/api/v1/webhook-deliveries/${id}`, { key })).body;

  before(async () => {
    h = await startHarness();
    const put = async (kind: string, secrets: string[]) => {
      const r = await h.call('PUT', `/api/v1/webhook-secrets/${kind}`, { body: { secrets } });
      expect(r.status, r.text).to.equal(200);
    };
    await put('codehost', [SECRET.codehost, SECRET.codehostOld]);
    await put('chat', [SECRET.chat]);
    await put('tracker', [SECRET.tracker]);
    await put('pager', [SECRET.pager, SECRET.pagerOld]);
    await put('email', [SECRET.email]);
    await put('generic', [SECRET.generic]);
  });
  after(async () => {
    await h.close();
  });

  describe('codehost (GitHub scheme)', () => {
    it('accepts a delivery signed by @octokit/webhooks-methods, stores it before answering, and keeps no signature', async () => {
      const signed = await sign.codehost(SECRET.codehost, { ref: 'refs/heads/main', action: 'synchronize' }, { event: 'push' });
      expect(await octokitVerify(SECRET.codehost, signed.body as string, signed.headers['x-hub-signature-256']!)).to.equal(true);
      const r = await post('codehost', signed);
      expect(r.status, r.text).to.equal(200);
      expect(r.body.status).to.equal('accepted');
      expect(r.headers.get('x-delivery-id')).to.equal(r.body.delivery_id);
      const d = await delivery(r.body.delivery_id);
      expect(d).to.deep.include({
        kind: 'codehost',
        event: 'push',
        action: 'synchronize',
        provider_delivery_id: signed.headers['x-github-delivery'],
        body: signed.body,
      });
      expect(d.headers['x-github-event']).to.equal('push');
      expect(d.headers).to.not.have.property('x-hub-signature-256');
      expect(d.event_payload).to.deep.equal({ ref: 'refs/heads/main', action: 'synchronize' });
    });

    it('answers ping, and takes GitHub’s form content type (payload=)', async () => {
      const ping = await post('codehost', await sign.codehost(SECRET.codehost, { zen: 'Keep it logically awesome.', hook_id: 1 }, { event: 'ping' }));
      expect(ping.status, ping.text).to.equal(200);
      const form = `payload=${encodeURIComponent(JSON.stringify({ action: 'opened', number: 7 }))}`;
      const signed = await sign.codehost(SECRET.codehost, {}, { event: 'pull_request' });
      const r = await post('codehost', {
        body: form,
        headers: { ...signed.headers, 'content-type': 'application/x-www-form-urlencoded', 'x-hub-signature-256': `sha256=${hmacHex(SECRET.codehost, form)}` },
      });
      expect(r.status, r.text).to.equal(200);
      expect((await delivery(r.body.delivery_id)).event_payload).to.deep.equal({ action: 'opened', number: 7 });
    });

    it('takes the old secret while rotating, and refuses a bad signature, a changed byte and a missing header, each with its code', async () => {
      expect((await post('codehost', await sign.codehost(SECRET.codehostOld, { n: 1 }))).status).to.equal(200);
      const wrong = await post('codehost', await sign.codehost('not-the-secret-at-all', { n: 2 }));
      expect(wrong.status).to.equal(401);
      expect(wrong.headers.get('content-type')).to.match(/application\/problem\+json/);
      expect(wrong.body.code).to.equal('webhook-signature-invalid');
      const good = await sign.codehost(SECRET.codehost, { n: 3 });
      const tampered = await post('codehost', { ...good, body: (good.body as string).replace('3', '4') });
      expect(tampered.body.code).to.equal('webhook-signature-invalid');
      const { 'x-hub-signature-256': _dropped, ...unsigned } = good.headers;
      const missing = await post('codehost', { body: good.body, headers: unsigned });
      expect(missing.status).to.equal(401);
      expect(missing.body.code).to.equal('webhook-signature-missing');
      // rejected requests are kept as metadata only
      const rejected = (await h.call<Body>('GET', '/api/v1/webhook-deliveries?kind=codehost&status=rejected')).body.data;
      expect(rejected.map((d: Body) => d.rejection.code)).to.include.members(['webhook-signature-invalid', 'webhook-signature-missing']);
      for (const d of rejected) expect(await delivery(d.id)).to.deep.include({ body: null, event_payload: null, status: 'rejected' });
    });

    it('refuses, unread, a body of a type its kind does not come in (415), though it is signed, and keeps it as a rejected delivery', async () => {
      const signed = await sign.codehost(SECRET.codehost, { ref: 'refs/heads/main' }, { event: 'push' });
      const plain = await post('codehost', { ...signed, headers: { ...signed.headers, 'content-type': 'text/plain' } });
      expect(plain.status, plain.text).to.equal(415);
      expect(plain.headers.get('content-type')).to.match(/application\/problem\+json/);
      expect(plain.body).to.deep.include({ code: 'unsupported-media-type' });
      expect(plain.body.detail).to.equal('a codehost delivery is application/json or application/x-www-form-urlencoded, not "text/plain"');
      const rejected = (await h.call<Body>('GET', '/api/v1/webhook-deliveries?kind=codehost&status=rejected')).body.data;
      expect(rejected.some((d: Body) => d.rejection?.code === 'unsupported-media-type')).to.equal(true);
      const t = Math.floor(Date.now() / 1000);
      const form = await post('generic', {
        body: 'a=b',
        headers: { 'content-type': 'application/x-www-form-urlencoded', 'x-service-signature': `t=${t},v1=${hmacHex(SECRET.generic, `${t}.a=b`)}` },
      });
      expect([form.status, form.body.code]).to.deep.equal([415, 'unsupported-media-type']);
      const none = await post('tracker', { body: Buffer.from('{}'), headers: { 'tracker-signature': hmacHex(SECRET.tracker, '{}') } });
      expect([none.status, none.body.code]).to.deep.equal([415, 'unsupported-media-type']);
      expect(none.body.detail).to.contain('not a body of no Content-Type');
      // the same body as JSON goes in: the type alone refused them
      const ok = await post('codehost', signed);
      expect(ok.status, ok.text).to.equal(200);
    });
  });

  describe('secrets', () => {
    it('refuses a replay: the same delivery, the same id with another body, the same signed body with another id', async () => {
      const signed = await sign.codehost(SECRET.codehost, { replay: randomUUID() });
      expect((await post('codehost', signed)).status).to.equal(200);
      const again = await post('codehost', signed);
      expect(again.status).to.equal(409);
      expect(again.body.code).to.equal('webhook-replay');
      const sameId = await sign.codehost(SECRET.codehost, { other: 1 }, { delivery: signed.headers['x-github-delivery'] });
      expect((await post('codehost', sameId)).body.code).to.equal('webhook-replay');
      const sameBody = { ...signed, headers: { ...signed.headers, 'x-github-delivery': randomUUID() } };
      expect((await post('codehost', sameBody)).body.code).to.equal('webhook-replay');
      // long after: Redis has forgotten the signature (its window is over), the store has not
      for (const key of await scanKeys(h.rt.redis, `${h.config.queuePrefix}:webhook-seen:*`)) await h.rt.redis.del(key);
      const later = { ...signed, headers: { ...signed.headers, 'x-github-delivery': randomUUID() } };
      const replayed = await post('codehost', later);
      expect(replayed.status, replayed.text).to.equal(409);
      expect(replayed.body.detail).to.equal('this signed body was already accepted');
    });

    it('answers 413 over 1 MB, 404 for an unknown kind, 403 for a tenant without a secret for the kind and, alike, for a tenant that does not exist', async () => {
      const big = await sign.codehost(SECRET.codehost, { blob: 'x'.repeat(1024 * 1024) });
      const tooBig = await post('codehost', big);
      expect(tooBig.status).to.equal(413);
      expect(tooBig.body.code).to.equal('payload-too-large');
      const small = await sign.codehost(SECRET.codehost, { n: 1 });
      expect((await post('nosuchkind', small)).status).to.equal(404);
      const unconfigured = await post('codehost', small, 'tenant-b');
      expect(unconfigured.status).to.equal(403);
      expect(unconfigured.body.code).to.equal('webhook-not-configured');
      // no answer tells whether a tenant exists
      const nobody = await post('codehost', small, 'no-such-tenant');
      expect(nobody.status).to.equal(403);
      expect(nobody.body.detail).to.equal(unconfigured.body.detail);
      // a provider's URL reaches the intake in any case, as it always has (the API's own paths are case-sensitive)
      const shouted = await h.call<Body>('POST', '/Webhooks/tenant-b/codehost', { key: null, raw: small.body, headers: small.headers });
      expect(shouted.status, shouted.text).to.equal(403);
      expect(shouted.body.code).to.equal('webhook-not-configured');
    });

    it('refuses a request to a tenant without a secret for the kind before reading its body, and closes the connection', async () => {
      // 20 MB announced (500 KB where the limit is 1 MB), 10 bytes sent: read first, the body was waited for (and buffered whole) to be refused
      const headOnly = async (path: string, length: number) =>
        (
          await rawExchange(
            h.url,
            [[0, `POST ${path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${length}\r\n\r\n{"a":"bcd"`]],
            3000,
          )
        ).text;
      const before = (await h.call<Body>('GET', '/api/v1/webhook-deliveries?status=rejected', { key: KEYS.b })).body.data.length;
      for (const [path, length] of [
        ['/webhooks/no-such-tenant/email', 20_000_000],
        ['/webhooks/tenant-b/email', 20_000_000],
        ['/webhooks/tenant-b/generic', 500_000],
      ] as const) {
        const answer = await headOnly(path, length);
        expect(answer, path).to.match(/^HTTP\/1\.1 403 /);
        expect(answer, path).to.match(/\r\nConnection: close\r\n/i);
        expect(JSON.parse(answer.slice(answer.indexOf('\r\n\r\n') + 4)), path).to.include({ code: 'webhook-not-configured' });
      }
      // recorded for the tenant that exists, as a refusal read whole was
      const after = (await h.call<Body>('GET', '/api/v1/webhook-deliveries?status=rejected', { key: KEYS.b })).body.data;
      expect(after.length - before).to.equal(2);
      expect(after[0]).to.deep.include({ kind: 'generic', status: 'rejected', body_size: 500_000 });
    });
  });

  describe('chat (Slack scheme)', () => {
    const event = (id = `Ev${randomUUID()}`) => JSON.stringify({ type: 'event_callback', event_id: id, event: { type: 'app_mention', text: 'deploy' } });
    const slackValid = (s: sign.Signed, nowMs = Date.now()) =>
      isValidSlackRequest({
        signingSecret: SECRET.chat,
        body: s.body as string,
        headers: {
          'x-slack-signature': s.headers['x-chat-signature'] ?? s.headers['x-slack-signature']!,
          'x-slack-request-timestamp': Number(s.headers['x-chat-request-timestamp'] ?? s.headers['x-slack-request-timestamp']),
        },
        nowMilliseconds: nowMs,
      });

    it('accepts an event that Slack’s own verifier accepts, under our header names and Slack’s', async () => {
      for (const names of ['chat', 'slack'] as const) {
        const signed = sign.chat(SECRET.chat, event(), { names });
        expect(slackValid(signed)).to.equal(true);
        const r = await post('chat', signed);
        expect(r.status, r.text).to.equal(200);
        expect((await delivery(r.body.delivery_id)).event).to.equal('app_mention');
      }
    });

    it('refuses a timestamp more than 5 minutes away, in either direction (Slack’s verifier only checks the past)', async () => {
      // 302, not 301: a second may tick between signing here and checking there
      for (const skew of [-302, 302]) {
        const signed = sign.chat(SECRET.chat, event(), { ts: Math.floor(Date.now() / 1000) + skew });
        expect(slackValid(signed)).to.equal(skew > 0);
        const r = await post('chat', signed);
        expect(r.status).to.equal(401);
        expect(r.body.code).to.equal('webhook-timestamp-outside-window');
      }
      const inside = sign.chat(SECRET.chat, event(), { ts: Math.floor(Date.now() / 1000) - 240 });
      expect((await post('chat', inside)).status).to.equal(200);
    });

    it('answers url_verification with its challenge once the signature checks', async () => {
      const body = JSON.stringify({ type: 'url_verification', token: 'legacy', challenge: 'c-3po' });
      const r = await post('chat', sign.chat(SECRET.chat, body));
      expect(r.status).to.equal(200);
      expect(r.body).to.deep.equal({ challenge: 'c-3po' });
      const forged = await post('chat', sign.chat('not-the-signing-secret', body));
      expect(forged.status).to.equal(401);
      expect(forged.text).to.not.include('c-3po');
    });

    it('takes slash commands and interactions as forms, answering with an empty body', async () => {
      const command = new URLSearchParams({
        command: '/deploy',
        text: 'prod',
        user_id: 'U1',
        trigger_id: 't1',
        token: 'slack-legacy-verification-token',
      }).toString();
      const r = await post('chat', sign.chat(SECRET.chat, command, { contentType: 'application/x-www-form-urlencoded' }));
      expect(r.status, r.text).to.equal(200);
      expect(r.text).to.equal('');
      const d = await delivery(r.headers.get('x-delivery-id')!);
      expect(d).to.deep.include({ event: 'slash_command', action: '/deploy', body: null });
      // Slack's legacy verification token is kept nowhere: not in the body (not kept), not in what runs receive
      expect(JSON.stringify(d)).to.not.contain('slack-legacy-verification-token');
      const interaction = new URLSearchParams({ payload: JSON.stringify({ type: 'block_actions', actions: [{ action_id: 'approve' }] }) }).toString();
      const i = await post('chat', sign.chat(SECRET.chat, interaction, { contentType: 'application/x-www-form-urlencoded' }));
      expect(i.status).to.equal(200);
      expect(await delivery(i.headers.get('x-delivery-id')!)).to.deep.include({ event: 'block_actions', action: 'approve' });
    });

    it('acknowledges a retry of the same event_id without storing it twice, and refuses the same signed request as a replay', async () => {
      const body = event();
      const first = sign.chat(SECRET.chat, body);
      const a = await post('chat', first);
      const retry = sign.chat(SECRET.chat, body, { ts: Math.floor(Date.now() / 1000) + 1 });
      const b = await post('chat', { ...retry, headers: { ...retry.headers, 'x-slack-retry-num': '1' } });
      expect(b.status).to.equal(200);
      expect(b.body).to.deep.equal({ delivery_id: a.body.delivery_id, status: 'duplicate' });
      const replay = await post('chat', first);
      expect(replay.status).to.equal(409);
      expect(replay.body.code).to.equal('webhook-replay');
    });
  });

  describe('tracker (Linear scheme)', () => {
    const linear = new LinearWebhookClient(SECRET.tracker);
    /** the replay claims of tenant a's tracker deliveries in Redis */
    const seenKeys = () => scanKeys(h.rt.redis, `${h.config.queuePrefix}:webhook-seen:tenant-a:tracker:*`);

    it('accepts what @linear/sdk’s webhook client verifies, under both header names', async () => {
      for (const names of ['tracker', 'linear'] as const) {
        const signed = sign.tracker(SECRET.tracker, { type: 'Issue', action: 'create', data: { id: 'i1' } }, { names });
        expect(linear.verify(Buffer.from(signed.body as string), signed.headers[`${names}-signature`]!)).to.equal(true);
        const r = await post('tracker', signed);
        expect(r.status, r.text).to.equal(200);
        expect(await delivery(r.body.delivery_id)).to.deep.include({ event: 'Issue', action: 'create' });
      }
    });

    it('refuses a signed webhookTimestamp outside the window, either way, and a bad signature', async () => {
      for (const skew of [-301_000, 301_000]) {
        const signed = sign.tracker(SECRET.tracker, { type: 'Issue', action: 'update' }, { at: Date.now() + skew });
        expect(() => linear.verify(Buffer.from(signed.body as string), signed.headers['tracker-signature']!)).to.throw(/timestamp/);
        const r = await post('tracker', signed);
        expect(r.status).to.equal(401);
        expect(r.body.code).to.equal('webhook-timestamp-outside-window');
      }
      const bad = sign.tracker('lin_wh_wrong', { type: 'Issue' });
      expect((await post('tracker', bad)).body.code).to.equal('webhook-signature-invalid');
    });

    it('acknowledges a redelivery of the same id once', async () => {
      const id = randomUUID();
      const a = await post('tracker', sign.tracker(SECRET.tracker, { type: 'Comment', action: 'create' }, { delivery: id }));
      const b = await post('tracker', sign.tracker(SECRET.tracker, { type: 'Comment', action: 'create', n: 2 }, { delivery: id }));
      expect(b.body).to.deep.equal({ delivery_id: a.body.delivery_id, status: 'duplicate' });
      // Linear's retry is the same bytes, signature included: acknowledged as the duplicate it is, not a 409
      const same = sign.tracker(SECRET.tracker, { type: 'Comment', action: 'create' }, { delivery: randomUUID() });
      const first = await post('tracker', same);
      const again = await post('tracker', same);
      expect(again.status, again.text).to.equal(200);
      expect(again.body).to.deep.equal({ delivery_id: first.body.delivery_id, status: 'duplicate' });
      // with no delivery header, two events of one webhook (its webhookId, the same for all it sends) are two deliveries
      const unnamed = (n: number) => {
        const signed = sign.tracker(SECRET.tracker, { type: 'Issue', action: 'update', webhookId: 'wh-1', n });
        delete signed.headers['tracker-delivery'];
        return signed;
      };
      const [one, two] = [await post('tracker', unnamed(1)), await post('tracker', unnamed(2))];
      expect([one.body.status, two.body.status]).to.deep.equal(['accepted', 'accepted']);
      expect(two.body.delivery_id).to.not.equal(one.body.delivery_id);
    });

    it('refuses a captured delivery sent again under another delivery id (the header is not signed), also once Redis has lost its claim', async () => {
      const signed = sign.tracker(SECRET.tracker, { type: 'Issue', action: 'create', data: { id: randomUUID() } });
      const first = await post('tracker', signed);
      expect(first.body.status, first.text).to.equal('accepted');
      const renamed = () => ({ body: signed.body, headers: { ...signed.headers, 'tracker-delivery': randomUUID() } });
      const again = await post('tracker', renamed());
      expect(again.status, again.text).to.equal(409);
      expect(again.body.code).to.equal('webhook-replay');
      // Redis restarted without its data: the store still knows the body
      const seen = await scanKeys(h.rt.redis, `${h.config.queuePrefix}:webhook-seen:tenant-a:tracker:*`);
      if (seen.length) await h.rt.redis.del(...seen);
      const afterLoss = await post('tracker', renamed());
      expect(afterLoss.status, afterLoss.text).to.equal(409);
      expect(afterLoss.body.code).to.equal('webhook-replay');
      // Linear's own retry, byte for byte, is still its delivery's duplicate
      const retry = await post('tracker', signed);
      expect(retry.status, retry.text).to.equal(200);
      expect(retry.body).to.deep.equal({ delivery_id: first.body.delivery_id, status: 'duplicate' });
      // in one read: a worker may move the delivery from received to processed between two
      const listed = await h.call<Body>('GET', '/api/v1/webhook-deliveries?kind=tracker&limit=100');
      const digest = createHash('sha256').update(signed.body).digest('hex');
      const stored = listed.body.data.filter((d: Body) => ['received', 'processed'].includes(d.status) && d.body_sha256 === digest);
      expect(stored).to.have.length(1);
    });

    it('takes the retry of a delivery whose process died before storing it once the claim lapses (30 s, not the replay window)', async () => {
      const signed = sign.tracker(SECRET.tracker, { type: 'Issue', action: 'create', data: { id: randomUUID() } }, { delivery: randomUUID() });
      const before = new Set(await seenKeys());
      // the first try's process stops for good between its claim and its commit: its insert never returns, and
      // nothing renews its claim any more
      const deliveries = h.rt.store.deliveries;
      const insert = deliveries.insert;
      let died!: (err: Error) => void;
      deliveries.insert = () => new Promise((_, reject) => (died = reject));
      const redis = h.rt.redis;
      const expire = redis.expire;
      redis.expire = (async () => 0) as unknown as typeof expire;
      const cut = new AbortController();
      const first = fetch(`${h.url}/webhooks/tenant-a/tracker`, { method: 'POST', headers: signed.headers, body: signed.body, signal: cut.signal }).catch(
        () => null,
      );
      try {
        const claim = await eventually(async () => (await seenKeys()).find((k) => !before.has(k)), 'the first try’s claim');
        const ttl = await h.rt.redis.ttl(claim);
        expect(ttl).to.be.within(1, 30);
        cut.abort();
        deliveries.insert = insert;
        // while it is claimed, the same bytes are another try of a delivery being stored
        const during = await post('tracker', signed);
        expect(during.status, during.text).to.equal(409);
        // the claim lapses (as 30 s would): the provider's retry goes in, once, and is then remembered for the window
        await h.rt.redis.pexpire(claim, 1);
        await eventually(async () => (await h.rt.redis.exists(claim)) === 0, 'the claim to lapse');
        const retry = await post('tracker', signed);
        expect(retry.status, retry.text).to.equal(200);
        expect(retry.body.status).to.equal('accepted');
        await eventually(async () => (await h.rt.redis.ttl(claim)) > 300, 'the claim held for the window');
        const again = await post('tracker', signed);
        expect(again.body).to.deep.equal({ delivery_id: retry.body.delivery_id, status: 'duplicate' });
      } finally {
        deliveries.insert = insert;
        redis.expire = expire;
        died?.(new Error('the process is gone'));
        await first;
      }
    });

    it('keeps the claim of a delivery its process is still storing, however long that takes: a replay under another id meanwhile is refused', async () => {
      const signed = sign.tracker(SECRET.tracker, { type: 'Issue', action: 'create', data: { id: randomUUID() } }, { delivery: randomUUID() });
      const before = new Set(await seenKeys());
      // the store is slow (a lock held, a failover): the insert waits until the test lets it go on
      const deliveries = h.rt.store.deliveries;
      const insert = deliveries.insert;
      let goOn!: () => void;
      const held = new Promise<void>((r) => (goOn = r));
      // (the first call only: a refusal is recorded through the same insert)
      let calls = 0;
      deliveries.insert = async (d) => {
        if (calls++ === 0) await held;
        return insert.call(deliveries, d);
      };
      const first = post('tracker', signed);
      try {
        const claim = await eventually(async () => (await seenKeys()).find((k) => !before.has(k)), 'the first try’s claim');
        // with less left than the 30 s it was taken for, the process storing it renews it (every 10 s) before it lapses
        await h.rt.redis.pexpire(claim, 12_000);
        await eventually(async () => (await h.rt.redis.ttl(claim)) > 20, 'the claim renewed', 15_000);
        const replay = await post('tracker', { body: signed.body, headers: { ...signed.headers, 'tracker-delivery': randomUUID() } });
        expect(replay.status, replay.text).to.equal(409);
        expect(replay.body.code).to.equal('webhook-replay');
      } finally {
        deliveries.insert = insert;
        goOn();
      }
      expect((await first).body.status).to.equal('accepted');
    });

    it('gives back the claim of a delivery the store could not look up (503), so the provider’s retry goes in (tracker, codehost, generic)', async () => {
      const deliveries = h.rt.store.deliveries;
      const { findByBody, findBySigned } = deliveries;
      const cases = [
        { kind: 'tracker', signed: sign.tracker(SECRET.tracker, { type: 'Issue', action: 'create', data: { id: randomUUID() } }) },
        { kind: 'codehost', signed: await sign.codehost(SECRET.codehost, { ref: `refs/heads/${randomUUID()}` }) },
        { kind: 'generic', signed: sign.generic([SECRET.generic], { type: 'deploy.finished', n: randomUUID() }, { delivery: `d-${randomUUID()}` }) },
      ];
      for (const { kind, signed } of cases) {
        // the store fails once, after the replay claim is taken and before the delivery is stored
        let failed = false;
        const failOnce = () => {
          if (failed) return false;
          failed = true;
          return true;
        };
        deliveries.findByBody = async (...args) => {
          if (failOnce()) throw new ServiceUnavailableError('the store did not answer', 5);
          return findByBody.apply(deliveries, args);
        };
        deliveries.findBySigned = async (...args) => {
          if (failOnce()) throw new ServiceUnavailableError('the store did not answer', 5);
          return findBySigned.apply(deliveries, args);
        };
        try {
          const first = await post(kind, signed);
          expect(first.status, `${kind}: ${first.text}`).to.equal(503);
          expect(first.headers.get('retry-after')).to.equal('5');
          const retry = await post(kind, signed);
          expect(retry.status, `${kind}: ${retry.text}`).to.equal(200);
          expect(retry.body.status, kind).to.equal('accepted');
        } finally {
          deliveries.findByBody = findByBody;
          deliveries.findBySigned = findBySigned;
        }
      }
    });
  });

  describe('pager (PagerDuty v3 scheme)', () => {
    const incident = (id = randomUUID()) => ({ event: { id, event_type: 'incident.triggered', resource_type: 'incident', data: { id: 'PABC' } } });

    it('passes when any v1 entry matches any current secret (rotation), under both header names', async () => {
      const r1 = await post('pager', sign.pager([SECRET.pagerOld], incident(), { extra: ['v1=deadbeef'] }));
      expect(r1.status, r1.text).to.equal(200);
      expect((await delivery(r1.body.delivery_id)).event).to.equal('incident.triggered');
      const r2 = await post('pager', sign.pager(['some-other-key', SECRET.pager], incident(), { names: 'pagerduty' }));
      expect(r2.status).to.equal(200);
      const none = await post('pager', sign.pager(['k1-not-ours', 'k2-not-ours'], incident()));
      expect(none.status).to.equal(401);
      expect(none.body.code).to.equal('webhook-signature-invalid');
    });

    it('uses event.id as the idempotency key', async () => {
      const id = randomUUID();
      const a = await post('pager', sign.pager([SECRET.pager], incident(id)));
      const b = await post('pager', sign.pager([SECRET.pagerOld], { ...incident(id), retried: true }));
      expect(b.status).to.equal(200);
      expect(b.body).to.deep.equal({ delivery_id: a.body.delivery_id, status: 'duplicate' });
      // PagerDuty's retry is byte for byte the same request: a duplicate, answered from the store and not counted in
      // the minute (nothing time-bound is signed: a captured one sent again and again would spend the budget for good)
      const same = sign.pager([SECRET.pager], incident());
      const first = await post('pager', same);
      const counted = async () => {
        const keys = await scanKeys(h.rt.redis, `${h.config.queuePrefix}:webhook-rate:tenant-a:*`);
        return (await Promise.all(keys.map((k) => h.rt.redis.get(k)))).reduce((n, v) => n + Number(v ?? 0), 0);
      };
      const before = await counted();
      const again = await post('pager', same);
      expect(again.status, again.text).to.equal(200);
      expect(again.body).to.deep.equal({ delivery_id: first.body.delivery_id, status: 'duplicate' });
      expect((await counted()) - before).to.equal(0);
      // nothing time-bound is signed: an event without its id could be sent again once the replay window ends
      const anonymous = await post('pager', sign.pager([SECRET.pager], { event: { event_type: 'incident.triggered' } }));
      expect(anonymous.status).to.equal(400);
      expect(anonymous.body.code).to.equal('webhook-payload-invalid');
    });
  });

  describe('email', () => {
    async function multipart(
      fields: Record<string, string>,
      files: { field: string; name: string; type: string; bytes: number }[] = [],
    ): Promise<{ body: Buffer; contentType: string }> {
      const form = new FormData();
      for (const [k, v] of Object.entries(fields)) form.append(k, v);
      for (const f of files) form.append(f.field, new Blob([Buffer.alloc(f.bytes, 7)], { type: f.type }), f.name);
      const res = new Response(form);
      return { body: Buffer.from(await res.arrayBuffer()), contentType: res.headers.get('content-type')! };
    }

    it('normalizes a SendGrid Inbound Parse multipart post with attachments (Basic auth)', async () => {
      const { body, contentType } = await multipart(
        {
          from: 'Ada <ada@example.com>',
          to: 'ops@in.example.com, "Doe, Jane" <jane@example.com>',
          cc: 'cc@example.com',
          subject: 'Build failed',
          text: 'see log',
          html: '<p>see log</p>',
          headers: 'Received: x\nMessage-ID: <m1@example.com>\nSubject: Build failed',
          'attachment-info': JSON.stringify({ attachment1: { filename: 'log.txt', type: 'text/plain' } }),
          // SendGrid's verdicts: the From address is vouched for by the SPF pass of its envelope sender
          SPF: 'pass',
          envelope: JSON.stringify({ to: ['ops@in.example.com'], from: 'bounces@example.com' }),
        },
        [{ field: 'attachment1', name: 'log.txt', type: 'text/plain', bytes: 2048 }],
      );
      // compressed, with Basic: inflated and read (its credentials were checked before a byte of it was)
      const gz = await post('email', {
        body: gzipSync(body),
        headers: { 'content-type': contentType, 'content-encoding': 'gzip', authorization: sign.basicAuth(SECRET.email) },
      });
      expect(gz.status, gz.text).to.equal(200);
      const r = await post('email', { body, headers: { 'content-type': contentType, authorization: sign.basicAuth(SECRET.email) } });
      expect(r.status, r.text).to.equal(200);
      const d = await delivery(r.body.delivery_id);
      expect(d.event).to.equal('email');
      expect(d.body).to.equal(null);
      expect((await delivery(gz.body.delivery_id)).event_payload, 'the compressed one read as the plain one').to.deep.equal(d.event_payload);
      expect(d.event_payload).to.deep.equal({
        provider: 'sendgrid',
        from: 'Ada <ada@example.com>',
        verified_from: 'ada@example.com',
        to: ['ops@in.example.com', '"Doe, Jane" <jane@example.com>'],
        cc: ['cc@example.com'],
        subject: 'Build failed',
        text: 'see log',
        html: '<p>see log</p>',
        message_id: '<m1@example.com>',
        attachments: [{ name: 'log.txt', type: 'text/plain', size: 2048 }],
      });
    });

    it('decodes a SendGrid post’s text and html in the charsets it names (SendGrid sends them in the mail’s own)', async () => {
      const boundary = 'xYzZY';
      const part = (name: string, value: Buffer | string) =>
        Buffer.concat([Buffer.from(`--${boundary}\r\nContent-Disposition: form-data; name="${name}"\r\n\r\n`), Buffer.from(value), Buffer.from('\r\n')]);
      const body = Buffer.concat([
        part('from', 'Zoé <zoe@example.com>'),
        part('to', 'ops@in.example.com'),
        part('subject', 'Café ☕'),
        part('headers', 'Message-ID: <cs1@example.com>'),
        // the mail's own bytes: ISO-8859-1 for the text, Shift_JIS for the html (日本 is 93 fa 96 7b)
        part('text', Buffer.from('Le café est prêt', 'latin1')),
        part('html', Buffer.from([0x3c, 0x70, 0x3e, 0x93, 0xfa, 0x96, 0x7b, 0x3c, 0x2f, 0x70, 0x3e])),
        part('charsets', JSON.stringify({ to: 'UTF-8', from: 'UTF-8', subject: 'UTF-8', text: 'iso-8859-1', html: 'shift_jis' })),
        Buffer.from(`--${boundary}--\r\n`),
      ]);
      const contentType = `multipart/form-data; boundary=${boundary}`;
      const r = await post('email', { body, headers: { 'content-type': contentType, authorization: sign.basicAuth(SECRET.email) } });
      expect(r.status, r.text).to.equal(200);
      const d = await delivery(r.body.delivery_id);
      expect(d.event_payload).to.deep.include({ from: 'Zoé <zoe@example.com>', subject: 'Café ☕', text: 'Le café est prêt', html: '<p>日本</p>' });
      // a charset no decoder knows leaves the field as UTF-8, as before
      const unknown = Buffer.concat([
        part('from', 'a@example.com'),
        part('to', 'ops@in.example.com'),
        part('headers', 'Message-ID: <cs2@example.com>'),
        part('text', 'déjà vu'),
        part('charsets', JSON.stringify({ text: 'x-no-such-charset' })),
        Buffer.from(`--${boundary}--\r\n`),
      ]);
      const u = await post('email', { body: unknown, headers: { 'content-type': contentType, authorization: sign.basicAuth(SECRET.email) } });
      expect(u.status, u.text).to.equal(200);
      expect((await delivery(u.body.delivery_id)).event_payload.text).to.equal('déjà vu');
    });

    it('normalizes a Postmark inbound JSON post (Basic auth), and refuses a wrong password or none', async () => {
      const body = JSON.stringify({
        From: 'ci@example.com',
        To: 'inbox@in.example.com',
        Cc: '',
        Subject: 'Nightly',
        TextBody: 'ok',
        HtmlBody: '<b>ok</b>',
        MessageID: 'pm-1',
        Attachments: [{ Name: 'r.pdf', ContentType: 'application/pdf', ContentLength: 12, Content: 'AAAA' }],
      });
      const r = await post('email', { body, headers: { 'content-type': 'application/json', authorization: sign.basicAuth(SECRET.email) } });
      expect(r.status, r.text).to.equal(200);
      expect((await delivery(r.body.delivery_id)).event_payload).to.deep.include({
        provider: 'postmark',
        subject: 'Nightly',
        message_id: 'pm-1',
        to: ['inbox@in.example.com'],
        cc: [],
        attachments: [{ name: 'r.pdf', type: 'application/pdf', size: 12 }],
      });
      const wrong = await post('email', { body, headers: { 'content-type': 'application/json', authorization: sign.basicAuth('wrong-password') } });
      expect(wrong.status).to.equal(401);
      expect(wrong.body.code).to.equal('webhook-signature-invalid');
      const none = await post('email', { body, headers: { 'content-type': 'application/json' } });
      expect(none.body.code).to.equal('webhook-signature-missing');
      // what is not an attachment object is not an attachment (it was a 500, to anyone, before any credential was checked)
      const odd = JSON.stringify({ From: 'x@example.com', MessageID: 'pm-odd', Attachments: [null, 'x', 7, { Name: 'a.txt', ContentLength: 1 }] });
      expect((await post('email', { body: odd, headers: { 'content-type': 'application/json' } })).body.code).to.equal('webhook-signature-missing');
      const taken = await post('email', { body: odd, headers: { 'content-type': 'application/json', authorization: sign.basicAuth(SECRET.email) } });
      expect(taken.status, taken.text).to.equal(200);
      expect((await delivery(taken.body.delivery_id)).event_payload.attachments).to.deep.equal([{ name: 'a.txt', type: 'application/octet-stream', size: 1 }]);
      // a mail without a Message-ID is known by its bytes: the provider's retry of it is a duplicate, another mail is not
      const anonymous = JSON.stringify({ From: 'x@example.com', Subject: 'no id', TextBody: 'once' });
      const send = (text: string) =>
        post('email', { body: text, headers: { 'content-type': 'application/json', authorization: sign.basicAuth(SECRET.email) } });
      const first = await send(anonymous);
      expect(first.status, first.text).to.equal(200);
      expect((await delivery(first.body.delivery_id)).provider_delivery_id).to.match(/^body:[0-9a-f]{64}$/);
      const retried = await send(anonymous);
      expect(retried.body).to.deep.equal({ delivery_id: first.body.delivery_id, status: 'duplicate' });
      const other = await send(anonymous.replace('once', 'twice'));
      expect(other.status, other.text).to.equal(200);
      expect(other.body.delivery_id).to.not.equal(first.body.delivery_id);
    });

    it('takes a Mailgun route post by its signature fields; a token is never taken twice; a forged one is refused', async () => {
      const fields = {
        ...sign.mailgunFields(SECRET.email),
        sender: 'bob@example.com',
        from: 'Bob <bob@example.com>',
        recipient: 'in@example.com',
        subject: 'Hi',
        'body-plain': 'hello',
        'Message-Id': '<mg1@example.com>',
      };
      const { body, contentType } = await multipart(fields, [{ field: 'attachment-1', name: 'a.png', type: 'image/png', bytes: 10 }]);
      const r = await post('email', { body, headers: { 'content-type': contentType } });
      expect(r.status, r.text).to.equal(200);
      expect((await delivery(r.body.delivery_id)).event_payload).to.deep.include({
        provider: 'mailgun',
        from: 'Bob <bob@example.com>',
        to: ['in@example.com'],
        text: 'hello',
        attachments: [{ name: 'a.png', type: 'image/png', size: 10 }],
      });
      const again = await post('email', { body: new URLSearchParams(fields).toString(), headers: { 'content-type': 'application/x-www-form-urlencoded' } });
      expect(again.status).to.equal(409);
      expect(again.body.code).to.equal('webhook-replay');
      const forged = { ...sign.mailgunFields('not-the-key'), subject: 'x' };
      const f = await post('email', { body: new URLSearchParams(forged).toString(), headers: { 'content-type': 'application/x-www-form-urlencoded' } });
      expect(f.body.code).to.equal('webhook-signature-invalid');
    });

    it('takes a Mailgun mail sent again (signed anew, the same Message-Id) as a duplicate, as SendGrid’s and Postmark’s', async () => {
      const messageId = `<${randomUUID()}@example.com>`;
      const mail = () =>
        new URLSearchParams({ ...sign.mailgunFields(SECRET.email), from: 'bob@example.com', subject: 'Hi', 'body-plain': 'hello', 'Message-Id': messageId });
      const form = { 'content-type': 'application/x-www-form-urlencoded' };
      const first = await post('email', { body: mail().toString(), headers: form });
      expect(first.status, first.text).to.equal(200);
      expect(first.body.status).to.equal('accepted');
      expect((await delivery(first.body.delivery_id)).provider_delivery_id).to.equal(messageId);
      const again = await post('email', { body: mail().toString(), headers: form });
      expect(again.status, again.text).to.equal(200);
      expect(again.body).to.deep.equal({ delivery_id: first.body.delivery_id, status: 'duplicate' });
    });

    it('refuses a captured Mailgun post sent again under another Message-Id, or none, with forged content once Redis lost its claims (only the token is signed)', async () => {
      const form = { 'content-type': 'application/x-www-form-urlencoded' };
      const captured = [sign.mailgunFields(SECRET.email), sign.mailgunFields(SECRET.email)];
      const first = await post('email', {
        body: new URLSearchParams({
          ...captured[0],
          from: 'bob@example.com',
          subject: 'Hi',
          'body-plain': 'hello',
          'Message-Id': `<${randomUUID()}@example.com>`,
        }).toString(),
        headers: form,
      });
      expect(first.status, first.text).to.equal(200);
      const second = await post('email', {
        body: new URLSearchParams({ ...captured[1], from: 'bob@example.com', subject: 'No id' }).toString(),
        headers: form,
      });
      expect(second.status, second.text).to.equal(200);
      for (const key of await scanKeys(h.rt.redis, `${h.config.queuePrefix}:webhook-seen:*`)) await h.rt.redis.del(key);
      const forged = (fields: Record<string, string>, messageId?: string) => ({
        body: new URLSearchParams({
          ...fields,
          from: 'ceo@example.com',
          subject: 'Wire the money',
          'body-plain': 'now',
          ...(messageId ? { 'Message-Id': messageId } : {}),
        }).toString(),
        headers: form,
      });
      const replays: [string, sign.Signed][] = [
        ['another Message-Id', forged(captured[0]!, `<${randomUUID()}@example.com>`)],
        ['no Message-Id', forged(captured[0]!)],
        ['a Message-Id added', forged(captured[1]!, `<${randomUUID()}@example.com>`)],
      ];
      for (const [what, replayed] of replays) {
        const r = await post('email', replayed);
        expect(r.status, `${what}: ${r.text}`).to.equal(409);
        expect(r.body.code, what).to.equal('webhook-replay');
      }
    });

    it('reads nothing of a body for anyone without credentials, and bounds what it reads: parts, fields and JSON values', async () => {
      // a JSON delivery is Postmark's, signed with Basic: without it nothing is parsed (26 MB of tiny values took 3 s of the thread)
      const notJson = await post('email', { body: '{"From": not json', headers: { 'content-type': 'application/json' } });
      expect(notJson.status, notJson.text).to.equal(401);
      expect(notJson.body.code).to.equal('webhook-signature-missing');
      // a multipart body of many tiny parts is refused past the fields and files kept (400,000 took 3 s); a signed one too
      const parts = Array.from({ length: 1200 }, (_, i) => `--B\r\nContent-Disposition: form-data; name="f${i}"\r\n\r\nx\r\n`);
      const signedFields = Object.entries(sign.mailgunFields(SECRET.email)).map(
        ([k, v]) => `--B\r\nContent-Disposition: form-data; name="${k}"\r\n\r\n${v}\r\n`,
      );
      const many = await post('email', {
        body: [...signedFields, ...parts, '--B--\r\n'].join(''),
        headers: { 'content-type': 'multipart/form-data; boundary=B' },
      });
      expect(many.status, many.text).to.equal(400);
      expect(many.body.code).to.equal('webhook-payload-invalid');
      expect(many.body.detail).to.equal('the multipart body has more than 1100 parts');
      // a urlencoded form of more fields than are kept, signed or not
      const form = new URLSearchParams({ ...sign.mailgunFields(SECRET.email), subject: 'x' });
      for (let i = 0; i < 1000; i++) form.append(`f${i}`, 'x');
      const fields = await post('email', { body: form.toString(), headers: { 'content-type': 'application/x-www-form-urlencoded' } });
      expect(fields.status, fields.text).to.equal(400);
      expect(fields.body.detail).to.equal('the form has more than 1000 fields');
      // a form's Mailgun signature is checked before the rest is decoded; a JSON email holds at most 50,000 values
      const forged = new URLSearchParams({ ...sign.mailgunFields('not-the-key'), 'body-plain': 'x'.repeat(100_000) });
      expect((await post('email', { body: forged.toString(), headers: { 'content-type': 'application/x-www-form-urlencoded' } })).body.code).to.equal(
        'webhook-signature-invalid',
      );
      const values = JSON.stringify({ From: 'a@example.com', MessageID: randomUUID(), Headers: Array.from({ length: 50_001 }, () => 0) });
      const tooMany = await post('email', { body: values, headers: { 'content-type': 'application/json', authorization: sign.basicAuth(SECRET.email) } });
      expect(tooMany.status, tooMany.text).to.equal(400);
      expect(tooMany.body.detail).to.equal('the body holds more than 50000 JSON values');
    });

    it('takes a body between 1 and 25 MB, and refuses one over 25 MB', async () => {
      const { body, contentType } = await multipart({ from: 'a@example.com', to: 'b@example.com', subject: 'big' }, [
        { field: 'attachment1', name: 'big.bin', type: 'application/octet-stream', bytes: 3 * 1024 * 1024 },
      ]);
      const r = await post('email', { body, headers: { 'content-type': contentType, authorization: sign.basicAuth(SECRET.email) } });
      expect(r.status, r.text).to.equal(200);
      const huge = await post('email', {
        body: Buffer.alloc(25 * 1024 * 1024 + 1, 32),
        headers: { 'content-type': 'application/json', authorization: sign.basicAuth(SECRET.email) },
      });
      expect(huge.status).to.equal(413);
    });
  });

  describe('generic', () => {
    it('takes t=,v1= with several v1 entries; refuses t outside the window either way, and the same signature twice', async () => {
      const signed = sign.generic(['wrong-secret-1', SECRET.generic], { type: 'deploy.finished', id: randomUUID() });
      const r = await post('generic', signed);
      expect(r.status, r.text).to.equal(200);
      expect((await delivery(r.body.delivery_id)).event).to.equal('deploy.finished');
      const replay = await post('generic', signed);
      expect(replay.status).to.equal(409);
      expect(replay.body.code).to.equal('webhook-replay');
      // 302, not 301: a second may tick between signing here and checking there
      for (const skew of [-302, 302]) {
        const late = await post('generic', sign.generic([SECRET.generic], { n: skew }, { t: Math.floor(Date.now() / 1000) + skew }));
        expect(late.status).to.equal(401);
        expect(late.body.code).to.equal('webhook-timestamp-outside-window');
      }
      const malformed = await post('generic', { body: '{}', headers: { 'content-type': 'application/json', 'x-service-signature': 'v1=abc' } });
      expect(malformed.body.code).to.equal('webhook-signature-invalid');
    });

    it('refuses a delivery id, an event or a signature header given twice (400 naming it), where Node joined them into one value neither named', async () => {
      const signed = sign.generic([SECRET.generic], { type: 'deploy.finished', n: randomUUID() });
      const head = (extra: string) =>
        `POST /webhooks/tenant-a/generic HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-Service-Signature: ${signed.headers['x-service-signature']}\r\n${extra}Content-Length: ${Buffer.byteLength(String(signed.body))}\r\nConnection: close\r\n\r\n${signed.body}`;
      const before = (await h.call<Body>('GET', '/api/v1/webhook-deliveries?limit=100')).body.data.length;
      for (const [extra, name] of [
        ['X-Service-Delivery: d-1\r\nX-Service-Delivery: d-2\r\n', 'x-service-delivery'],
        ['X-Service-Event: push\r\nx-service-event: evil\r\n', 'x-service-event'],
        [`X-Service-Signature: ${signed.headers['x-service-signature']}\r\n`, 'x-service-signature'],
      ]) {
        const answer = (await rawExchange(h.url, [[0, head(extra!)]])).text;
        expect(answer, name).to.match(/^HTTP\/1\.1 400 /);
        expect(bodyOfAnswer(answer).errors, name).to.deep.equal([{ path: `/header/${name}`, message: 'is given more than once (it holds one value)' }]);
      }
      expect((await h.call<Body>('GET', '/api/v1/webhook-deliveries?limit=100')).body.data.length).to.equal(before);
      // once each, the same request goes in; a header of the API's given twice is none of the intake's
      expect((await rawExchange(h.url, [[0, head('X-Service-Delivery: d-1\r\nIdempotency-Key: a\r\nIdempotency-Key: b\r\n')]])).text).to.match(
        /^HTTP\/1\.1 200 /,
      );
    });

    it('refuses an id-less signed request sent again once Redis forgot its signature (it lost its data): the store knows it by what was signed', async () => {
      const signed = sign.generic([SECRET.generic], { type: 'deploy.finished', n: randomUUID() });
      const first = await post('generic', signed);
      expect(first.status, first.text).to.equal(200);
      expect((await delivery(first.body.delivery_id)).provider_delivery_id).to.match(/^signed:[0-9a-f]{64}$/);
      for (const key of await scanKeys(h.rt.redis, `${h.config.queuePrefix}:webhook-seen:*`)) await h.rt.redis.del(key);
      const again = await post('generic', signed);
      expect(again.status, again.text).to.equal(409);
      expect(again.body.code).to.equal('webhook-replay');
      // the same body signed at another time is another request
      const later = await post('generic', sign.generic([SECRET.generic], JSON.parse(String(signed.body)), { t: Math.floor(Date.now() / 1000) + 2 }));
      expect(later.status, later.text).to.equal(200);
      expect(later.body.delivery_id).not.to.equal(first.body.delivery_id);
    });

    it('refuses a captured request sent again under another X-Service-Delivery (the header is not signed) once Redis lost its claims; a retry signed anew is a duplicate', async () => {
      const payload = { type: 'deploy.finished', n: randomUUID() };
      const t = Math.floor(Date.now() / 1000);
      const signed = sign.generic([SECRET.generic], payload, { t, delivery: `d-${randomUUID()}` });
      const first = await post('generic', signed);
      expect(first.status, first.text).to.equal(200);
      const stored = await delivery(first.body.delivery_id);
      expect(stored.signed_sha256).to.match(/^[0-9a-f]{64}$/);
      for (const key of await scanKeys(h.rt.redis, `${h.config.queuePrefix}:webhook-seen:*`)) await h.rt.redis.del(key);
      for (const id of [`d-${randomUUID()}`, signed.headers['x-service-delivery']!]) {
        const renamed = await post('generic', { body: signed.body, headers: { ...signed.headers, 'x-service-delivery': id } });
        expect(renamed.status, renamed.text).to.equal(409);
        expect(renamed.body.code).to.equal('webhook-replay');
      }
      // the sender's retry of that delivery, signed at another time: the same delivery, acknowledged once
      const retry = await post('generic', sign.generic([SECRET.generic], payload, { t: t + 1, delivery: signed.headers['x-service-delivery'] }));
      expect(retry.status, retry.text).to.equal(200);
      expect(retry.body).to.deep.equal({ delivery_id: first.body.delivery_id, status: 'duplicate' });
      // the same body signed at another time under a new id is another delivery
      const other = await post('generic', sign.generic([SECRET.generic], payload, { t: t + 2, delivery: `d-${randomUUID()}` }));
      expect(other.status, other.text).to.equal(200);
      expect(other.body.status).to.equal('accepted');
    });

    it('refuses a captured request sent again with X-Service-Delivery dropped or added once Redis lost its claims: the store knows what was signed under any id', async () => {
      const withId = sign.generic([SECRET.generic], { type: 'deploy.finished', n: randomUUID() }, { delivery: `d-${randomUUID()}` });
      const withoutId = sign.generic([SECRET.generic], { type: 'deploy.finished', n: randomUUID() });
      for (const signed of [withId, withoutId]) {
        const first = await post('generic', signed);
        expect(first.status, first.text).to.equal(200);
        expect((await delivery(first.body.delivery_id)).signed_sha256).to.match(/^[0-9a-f]{64}$/);
      }
      for (const key of await scanKeys(h.rt.redis, `${h.config.queuePrefix}:webhook-seen:*`)) await h.rt.redis.del(key);
      const { 'x-service-delivery': _dropped, ...headersWithout } = withId.headers;
      const replays: [string, sign.Signed][] = [
        ['dropped', { body: withId.body, headers: headersWithout }],
        ['added', { body: withoutId.body, headers: { ...withoutId.headers, 'x-service-delivery': `d-${randomUUID()}` } }],
      ];
      for (const [what, replayed] of replays) {
        const r = await post('generic', replayed);
        expect(r.status, `${what}: ${r.text}`).to.equal(409);
        expect(r.body.code, what).to.equal('webhook-replay');
      }
    });

    it('refuses a request signed by both secrets of a rotation sent again with one entry, or under another delivery id', async () => {
      const second = 'generic-secret-second-0123456';
      const put = (secrets: string[]) => h.call('PUT', '/api/v1/webhook-secrets/generic', { body: { secrets } });
      expect((await put([SECRET.generic, second])).status).to.equal(200);
      try {
        const both = sign.generic([SECRET.generic, second], { type: 'deploy.finished' }, { delivery: `d-${randomUUID()}` });
        const first = await post('generic', both);
        expect(first.status, first.text).to.equal(200);
        expect(first.body.status).to.equal('accepted');
        const entries = both.headers['x-service-signature']!.split(',');
        // the same t and body, only the second secret's entry, no delivery id: the same signed request
        const { 'x-service-delivery': _id, ...headers } = both.headers;
        const stripped = await post('generic', { body: both.body, headers: { ...headers, 'x-service-signature': [entries[0], entries[2]].join(',') } });
        expect(stripped.status, stripped.text).to.equal(409);
        expect(stripped.body.code).to.equal('webhook-replay');
        const renamed = await post('generic', {
          body: both.body,
          headers: { ...headers, 'x-service-signature': [entries[0], entries[1]].join(','), 'x-service-delivery': 'd-other' },
        });
        expect(renamed.status, renamed.text).to.equal(409);
      } finally {
        expect((await put([SECRET.generic])).status).to.equal(200);
      }
    });

    it('refuses a signed body that is not a JSON object as webhook-payload-invalid', async () => {
      const r = await post('generic', { ...sign.generic([SECRET.generic], {}), body: 'not json' });
      expect(r.status).to.equal(401); // the signature covers the body: a changed body fails it first
      const t = Math.floor(Date.now() / 1000);
      const good = {
        body: 'not json',
        headers: { 'content-type': 'application/json', 'x-service-signature': `t=${t},v1=${hmacHex(SECRET.generic, `${t}.not json`)}` },
      };
      const invalid = await post('generic', good);
      expect(invalid.status).to.equal(400);
      expect(invalid.body.code).to.equal('webhook-payload-invalid');
      // signed, valid JSON, but nested past 64 levels: refused before it is parsed or stored
      const deep = '{"a":'.repeat(5000) + '1' + '}'.repeat(5000);
      const tooDeep = await post('generic', {
        body: deep,
        headers: { 'content-type': 'application/json', 'x-service-signature': `t=${t},v1=${hmacHex(SECRET.generic, `${t}.${deep}`)}` },
      });
      expect(tooDeep.status).to.equal(400);
      expect(tooDeep.body).to.include({ code: 'webhook-payload-invalid', detail: 'the body nests deeper than 64 levels' });
      // signed, valid JSON, but a lone surrogate: stored, it would make every page that shows it unreadable to strict parsers
      const lone = '{"text":"a\\ud800b"}';
      const loneSurrogate = await post('generic', {
        body: lone,
        headers: { 'content-type': 'application/json', 'x-service-signature': `t=${t},v1=${hmacHex(SECRET.generic, `${t}.${lone}`)}` },
      });
      expect(loneSurrogate.status).to.equal(400);
      expect(loneSurrogate.body.code).to.equal('webhook-payload-invalid');
      expect(loneSurrogate.body.detail).to.match(/lone surrogate/);
      const email = await post('email', { body: lone, headers: { 'content-type': 'application/json', authorization: sign.basicAuth(SECRET.email) } });
      expect(email.status).to.equal(400);
      expect(email.body.detail).to.match(/lone surrogate/);
      // signed, but not UTF-8: taken, it was stored as U+FFFD, a body that is not the bytes its size and hash are of
      const bytes = Buffer.concat([Buffer.from('{"type":"'), Buffer.from([0xff, 0xfe]), Buffer.from('"}')]);
      const notUtf8 = await post('generic', {
        body: bytes,
        headers: {
          'content-type': 'application/json',
          'x-service-signature': `t=${t},v1=${createHmac('sha256', SECRET.generic).update(`${t}.`).update(bytes).digest('hex')}`,
        },
      });
      expect(notUtf8.status).to.equal(400);
      expect(notUtf8.body).to.include({ code: 'webhook-payload-invalid', detail: 'the body is not UTF-8, which JSON is (RFC 8259)' });
      const mail = await post('email', { body: bytes, headers: { 'content-type': 'application/json', authorization: sign.basicAuth(SECRET.email) } });
      expect(mail.status).to.equal(400);
      expect(mail.body.detail).to.match(/not UTF-8/);
    });
  });

  describe('bad input', () => {
    it('takes an empty delivery header as none: two deliveries that send it empty are two deliveries (codehost, tracker, generic)', async () => {
      const signers: Record<string, (n: number) => Promise<sign.Signed>> = {
        codehost: async (n) => {
          const s = await sign.codehost(SECRET.codehost, { ref: `refs/heads/${randomUUID()}`, n });
          return { body: s.body, headers: { ...s.headers, 'x-github-delivery': '' } };
        },
        tracker: async (n) => {
          const s = sign.tracker(SECRET.tracker, { type: 'Issue', action: 'create', data: { id: randomUUID() }, n });
          return { body: s.body, headers: { ...s.headers, 'tracker-delivery': '' } };
        },
        generic: async (n) => {
          const s = sign.generic([SECRET.generic], { type: 'deploy.finished', n: `${n}-${randomUUID()}` });
          return { body: s.body, headers: { ...s.headers, 'x-service-delivery': '' } };
        },
      };
      for (const [kind, signed] of Object.entries(signers)) {
        const one = await post(kind, await signed(1));
        const two = await post(kind, await signed(2));
        expect([one.status, two.status], `${kind}: ${two.text}`).to.deep.equal([200, 200]);
        expect([one.body.status, two.body.status], kind).to.deep.equal(['accepted', 'accepted']);
        expect(two.body.delivery_id, kind).to.not.equal(one.body.delivery_id);
        // known by what was signed, as a request that names no id
        expect((await delivery(two.body.delivery_id)).provider_delivery_id, kind).to.match(/^signed:[0-9a-f]{64}$/);
      }
    });

    it('inflates a compressed body; refuses one that does not inflate, or an encoding it does not read, as webhook-payload-invalid, recorded', async () => {
      const signed = await sign.codehost(SECRET.codehost, { ref: 'refs/heads/gz' }, { event: 'push' });
      const gz = await post('codehost', { body: gzipSync(signed.body as string), headers: { ...signed.headers, 'content-encoding': 'gzip' } });
      expect(gz.status, gz.text).to.equal(200);
      expect((await delivery(gz.body.delivery_id)).body).to.equal(signed.body);
      for (const [encoding, body, detail] of [
        ['bogus', Buffer.from('{}'), /Content-Encoding "bogus"/],
        ['gzip', Buffer.from('not gzip at all'), /does not inflate/],
      ] as const) {
        // signed as far as its headers go: without the header it is refused before its body is read
        const headers = { 'content-type': 'application/json', 'content-encoding': encoding, 'x-hub-signature-256': `sha256=${'0'.repeat(64)}` };
        const r = await post('codehost', { body, headers });
        expect(r.status, `${encoding}: ${r.text}`).to.equal(400);
        expect(r.body.code).to.equal('webhook-payload-invalid');
        expect(r.body.detail).to.match(detail);
        const rejected = (await h.call<Body>('GET', '/api/v1/webhook-deliveries?kind=codehost&status=rejected&limit=1')).body.data[0];
        expect(rejected.rejection.message).to.match(detail);
      }
    });

    it('refuses a request its headers refuse (no signature header; email credentials wrong, or none for JSON) before reading its body, and closes the connection', async () => {
      // 20 MB announced for email (500 KB where the limit is 1 MB), 10 bytes sent: read first, the body was waited for (and buffered whole) to be refused
      const headOnly = (kind: string, length: number, headers: string, limitMs = 3000) =>
        rawExchange(h.url, [[0, `POST /webhooks/tenant-a/${kind} HTTP/1.1\r\nHost: x\r\n${headers}Content-Length: ${length}\r\n\r\n{"a":"bcd"`]], limitMs);
      const json = 'Content-Type: application/json\r\n';
      const wrongBasic = `Authorization: ${sign.basicAuth('wrong-password')}\r\n`;
      const cases: [string, number, string, string][] = [
        ['email', 20_000_000, json, 'webhook-signature-missing'],
        // a compressed form without Basic: only its inflated fields could say it is Mailgun's (144 bytes of brotli
        // were inflated to the 25 MB limit to be refused)
        ['email', 20_000_000, 'Content-Type: multipart/form-data; boundary=B\r\nContent-Encoding: br\r\n', 'webhook-signature-missing'],
        ['email', 20_000_000, 'Content-Type: application/x-www-form-urlencoded\r\nContent-Encoding: gzip\r\n', 'webhook-signature-missing'],
        ['email', 20_000_000, json + wrongBasic, 'webhook-signature-invalid'],
        ['email', 20_000_000, `Content-Type: multipart/form-data; boundary=B\r\n${wrongBasic}`, 'webhook-signature-invalid'],
        ['email', 20_000_000, `${json}Authorization: Bearer nope\r\n`, 'webhook-signature-invalid'],
        ...(['codehost', 'chat', 'tracker', 'pager', 'generic'] as const).map((kind): [string, number, string, string] => [
          kind,
          500_000,
          json,
          'webhook-signature-missing',
        ]),
        // Slack's signature without its timestamp
        ['chat', 500_000, `${json}X-Slack-Signature: v0=${'0'.repeat(64)}\r\n`, 'webhook-signature-missing'],
      ];
      for (const [kind, length, headers, code] of cases) {
        const { text, ms } = await headOnly(kind, length, headers);
        const what = `${kind} ${headers.replace(/\r\n/g, '; ')}`;
        expect(text, what).to.match(/^HTTP\/1\.1 401 /);
        expect(text, what).to.match(/\r\nConnection: close\r\n/i);
        expect(text, what).to.match(/\r\nContent-Type: application\/problem\+json/i);
        expect(bodyOfAnswer(text), what).to.include({ code });
        expect(ms, what).to.be.below(1000);
      }
      // recorded, as a refusal read whole was, with the size it announced
      const recorded = (await h.call<Body>('GET', '/api/v1/webhook-deliveries?kind=email&status=rejected&limit=1')).body.data[0];
      expect(recorded).to.deep.include({ body_size: 20_000_000, rejection: { code: 'webhook-signature-invalid', message: recorded.rejection.message } });
      // a form without Basic may be Mailgun's, signed in its fields: its body is waited for
      const mailgun = await headOnly('email', 20_000_000, 'Content-Type: application/x-www-form-urlencoded\r\n', 800);
      expect(mailgun.text).to.equal('');
    });

    it('answers another method than POST on an intake path 405 with Allow: POST, as the API’s paths do; a path that is no intake 404', async () => {
      for (const method of ['GET', 'PUT', 'DELETE', 'PATCH']) {
        const r = await h.call<Body>(method, '/webhooks/tenant-a/codehost', { key: null });
        expect(r.status, `${method}: ${r.text}`).to.equal(405);
        expect(r.headers.get('allow'), method).to.equal('POST');
        expect(r.headers.get('content-type'), method).to.match(/^application\/problem\+json/);
        expect(r.body, method).to.include({ code: 'method-not-allowed', status: 405 });
      }
      // as an API path answers it
      const api = await h.call<Body>('PUT', '/api/v1/webhook-deliveries');
      expect(api.status).to.equal(405);
      expect(api.body.code).to.equal('method-not-allowed');
      expect((await h.call<Body>('GET', '/webhooks/tenant-a/nosuchkind', { key: null })).status).to.equal(404);
      expect((await h.call<Body>('GET', '/webhooks/Not%20A%20Tenant/codehost', { key: null })).status).to.equal(404);
    });

    it('answers every malformed request with a problem and stays up', async () => {
      const t = Math.floor(Date.now() / 1000);
      const cases: [string, sign.Signed][] = [
        ['email', { body: '--x\r\nnot multipart', headers: { 'content-type': 'multipart/form-data', authorization: sign.basicAuth(SECRET.email) } }],
        [
          'email',
          {
            body: Buffer.from([0xff, 0xfe, 0x00, 0x01]),
            headers: { 'content-type': 'multipart/form-data; boundary=zzz', authorization: sign.basicAuth(SECRET.email) },
          },
        ],
        ['email', { body: 'x', headers: { 'content-type': 'text/plain', authorization: sign.basicAuth(SECRET.email) } }],
        ['email', { body: '{}', headers: { 'content-type': 'application/json', authorization: 'Bearer nope' } }],
        [
          'chat',
          { body: 'a=b', headers: { 'content-type': 'application/x-www-form-urlencoded', 'x-chat-signature': 'v0=zz', 'x-chat-request-timestamp': 'soon' } },
        ],
        ['chat', sign.chat(SECRET.chat, 'payload=%7Bnot-json', { contentType: 'application/x-www-form-urlencoded' })],
        ['codehost', { body: '', headers: { 'content-type': 'application/json', 'x-hub-signature-256': 'sha256=' } }],
        ['codehost', { ...(await sign.codehost(SECRET.codehost, {})), body: '' }],
        ['tracker', { body: '[]', headers: { 'content-type': 'application/json', 'tracker-signature': hmacHex(SECRET.tracker, '[]') } }],
        ['pager', { body: '{}', headers: { 'content-type': 'application/json', 'x-pager-signature': ',,,v1=,v2=abc' } }],
        [
          'generic',
          { body: 'null', headers: { 'content-type': 'application/json', 'x-service-signature': `t=${t},v1=${hmacHex(SECRET.generic, `${t}.null`)}` } },
        ],
        // a body of a type its kind does not come in, or of none
        ['pager', { body: '{}', headers: { 'x-pager-signature': ',,,v1=,v2=abc' } }],
      ];
      for (const [kind, req] of cases) {
        const r = await post(kind, req);
        expect(r.status, `${kind}: ${r.text}`).to.be.within(400, 499);
        expect(r.headers.get('content-type'), kind).to.match(/application\/problem\+json/);
        expect(r.body.code, kind).to.match(/^(webhook-|unsupported-media-type$)/);
      }
      expect((await h.call('GET', '/healthz', { key: null })).status).to.equal(200);
    });

    it('lists configured kinds without the secrets, seals them at rest in a 0600-keyed store, never logs them', async () => {
      const list = await h.call('GET', '/api/v1/webhook-secrets');
      expect(list.status).to.equal(200);
      expect(list.body.data.map((s: Body) => s.kind)).to.have.members(['chat', 'codehost', 'email', 'generic', 'pager', 'tracker']);
      expect(list.body.data.find((s: Body) => s.kind === 'pager').secret_count).to.equal(2);
      for (const secret of Object.values(SECRET)) {
        expect(list.text).to.not.include(secret);
        expect(h.logs.join('')).to.not.include(secret);
      }
      const keyFile = path.join(h.config.dataDir, 'secret.key');
      expect(fs.statSync(keyFile).mode & 0o777).to.equal(0o600);
      const db = new Database(path.join(h.config.dataDir, 'service.sqlite'), { readonly: true });
      try {
        const rows = db.prepare('SELECT doc FROM webhook_secrets').all() as { doc: string }[];
        expect(rows).to.have.length(6);
        for (const { doc } of rows) for (const secret of Object.values(SECRET)) expect(doc).to.not.include(secret);
      } finally {
        db.close();
      }
      expect((await h.call('GET', '/api/v1/webhook-secrets', { key: KEYS.b })).body.data).to.deep.equal([]);
    });

    it('refuses a kind whose stored secret no longer opens (SERVICE_SECRET_KEY changed) instead of failing', async () => {
      const other = createSecretBox(randomBytes(32));
      const now = new Date().toISOString();
      // a tenant no request has touched yet, so no process holds its secrets in memory
      await h.rt.store.webhookSecrets.put({
        tenant_id: 'tenant-c',
        kind: 'pager',
        sealed: [other.seal('pager-c-secret-0123', 'webhook-secret:tenant-c:pager')],
        created_at: now,
        updated_at: now,
      });
      const r = await post('pager', sign.pager(['pager-c-secret-0123'], { event: { id: randomUUID(), event_type: 'incident.triggered' } }), 'tenant-c');
      expect(r.status, r.text).to.equal(403);
      expect(r.body.code).to.equal('webhook-not-configured');
      expect(h.logs.join('')).to.include('does not open with SERVICE_SECRET_KEY');
      await h.rt.store.webhookSecrets.delete('tenant-c', 'pager');
    });

    it('validates the body, and after DELETE the kind is refused as not configured', async () => {
      expect((await h.call('PUT', '/api/v1/webhook-secrets/generic', { body: { secrets: [] } })).status).to.equal(400);
      expect((await h.call('PUT', '/api/v1/webhook-secrets/generic', { body: { secrets: ['a', 'b', 'c'] } })).status).to.equal(400);
      expect((await h.call('PUT', '/api/v1/webhook-secrets/nope', { body: { secrets: ['long-enough-secret'] } })).status).to.equal(400);
      // a secret read from a file with its newline (or any control character) would verify no signature
      for (const secret of ['long-enough-secret\n', 'long-enough\u001bsecret']) {
        const refused = await h.call('PUT', '/api/v1/webhook-secrets/generic', { key: KEYS.b, body: { secrets: [secret] } });
        expect(refused.status, JSON.stringify(secret)).to.equal(400);
        expect(refused.body.errors[0].path).to.equal('/body/secrets/0');
      }
      expect((await h.call('PUT', '/api/v1/webhook-secrets/generic', { body: { secrets: ['long-enough-secret'] }, key: null })).status).to.equal(401);
      const b = await h.call('PUT', '/api/v1/webhook-secrets/generic', { body: { secrets: ['tenant-b-generic-secret'] }, key: KEYS.b });
      expect(b.status).to.equal(200);
      expect((await h.call('DELETE', '/api/v1/webhook-secrets/generic', { key: KEYS.b })).status).to.equal(204);
      expect((await h.call('DELETE', '/api/v1/webhook-secrets/generic', { key: KEYS.b })).status).to.equal(404);
      const r = await post('generic', sign.generic(['tenant-b-generic-secret'], { n: 1 }), 'tenant-b');
      expect(r.status).to.equal(403);
      expect(r.body.code).to.equal('webhook-not-configured');
    });
  });

  describe('deliveries and runs', () => {
    it('keeps a delivery whose run its tenant’s full line refused (SERVICE_TENANT_MAX_WAITING) received, with the runs it did start, and starts the rest once the line has room, never the same again', async () => {
      const full = await startHarness({ env: { SERVICE_TENANT_MAX_RUNNING: '1', SERVICE_TENANT_MAX_WAITING: '1' } });
      try {
        expect((await full.call('PUT', '/api/v1/webhook-secrets/codehost', { body: { secrets: [SECRET.codehost] } })).status).to.equal(200);
        const automations: string[] = [];
        for (const name of ['on push 1', 'on push 2']) {
          const made = await full.call<Body>('POST', '/api/v1/automations', {
            body: {
              name,
              steps: [{ tool: 'shell', args: { command: 'echo built' } }],
              triggers: [{ type: 'webhook', provider: 'codehost', events: ['push'] }],
            },
          });
          expect(made.status, made.text).to.equal(201);
          automations.push(made.body.id);
        }
        // one run holds the tenant's slot: the line has room for one run, the delivery's first
        const slot = releasable(full, 'release-line-full');
        const holding = await full.call<Body>('POST', '/api/v1/autonomy/run', { body: { steps: [{ tool: 'shell', args: { command: slot.command } }] } });
        expect(holding.status).to.equal(202);

        const signed = await sign.codehost(SECRET.codehost, { ref: 'refs/heads/main' }, { event: 'push' });
        const r = await full.call<Body>('POST', '/webhooks/tenant-a/codehost', { key: null, raw: signed.body, headers: signed.headers });
        expect(r.status, r.text).to.equal(200);
        const id = r.body.delivery_id;
        // its job was tried and one run refused (a transient failure): the delivery waits, received, with the run it started
        await eventually(async () => {
          const [job] = await full.rt.queues.get('webhooks').getJobs(['delayed', 'failed', 'wait']);
          return (job?.attemptsMade ?? 0) >= 1;
        }, 'the delivery’s first try');
        const held = (await full.call<Body>('GET', `/api/v1/webhook-deliveries/${id}`)).body;
        expect(held.status).to.equal('received');
        expect(held.runs).to.have.length(1);
        // a day passes (the line stays full): the run's idempotency key is gone from Redis and the store
        for (const key of await scanKeys(full.rt.redis, `${full.config.queuePrefix}:idempotency:*`)) await full.rt.redis.del(key);
        const db = new Database(path.join(full.config.dataDir, 'service.sqlite'));
        db.prepare('DELETE FROM idempotency_keys').run();
        db.close();

        await slot.release();
        const processed = await eventually(
          async () => {
            const d = (await full.call<Body>('GET', `/api/v1/webhook-deliveries/${id}`)).body;
            return d.status === 'processed' ? d : null;
          },
          'the delivery to be processed once the line has room',
          20_000,
        );
        expect(processed.runs.map((x: Body) => x.automation_id).sort()).to.deep.equal([...automations].sort());
        expect(processed.runs).to.deep.include(held.runs[0]);
        for (const run of processed.runs) expect((await finishedRun(full, run.run_id)).status).to.equal('succeeded');
        const all = (await full.call<Body>('GET', '/api/v1/runs?limit=100')).body.data as Body[];
        expect(
          all.filter((x) => x.automation_id === held.runs[0].automation_id),
          'the first automation ran once',
        ).to.have.length(1);

        // a replay while the line is full starts nothing: refused as a new run is (429, Retry-After), the delivery
        // as it was, its attempt given back; once the line has room, the replay starts both again
        const again = releasable(full, 'release-line-full-replay');
        try {
          expect((await full.call('POST', '/api/v1/autonomy/run', { body: { steps: [{ tool: 'shell', args: { command: again.command } }] } })).status).to.equal(
            202,
          );
          const waiting = await full.call<Body>('POST', '/api/v1/autonomy/run', { body: { steps: [{ tool: 'message', args: { text: 'waits' } }] } });
          expect(waiting.status, waiting.text).to.equal(202);
          const refused = await full.call<Body>('POST', `/api/v1/webhook-deliveries/${id}/replay`);
          expect(refused.status, refused.text).to.equal(429);
          expect(refused.body.code).to.equal('rate-limited');
          expect(Number(refused.headers.get('retry-after'))).to.be.greaterThan(0);
          const unchanged = (await full.call<Body>('GET', `/api/v1/webhook-deliveries/${id}`)).body;
          expect(unchanged).to.deep.include({ status: 'processed', attempts: 1, error: null });
          expect(unchanged.runs).to.deep.equal(processed.runs);
          await again.release();
          await finishedRun(full, waiting.body.run_id);
        } finally {
          await again.clear();
        }
        const replayed = await full.call<Body>('POST', `/api/v1/webhook-deliveries/${id}/replay`);
        expect(replayed.status, replayed.text).to.equal(200);
        expect(replayed.body).to.deep.include({ status: 'processed', attempts: 2, error: null });
        expect(replayed.body.runs).to.have.length(4);
      } finally {
        await full.close();
      }
    });

    it('starts the run of each matching automation, with the event as input and the delivery as trigger; replay starts it again', async () => {
      const mk = async (name: string, trigger: object) =>
        (
          await h.call<Body>('POST', '/api/v1/automations', {
            body: { name, steps: [{ tool: 'shell', args: { command: 'echo built' } }], triggers: [trigger] },
          })
        ).body;
      const onPush = await mk('on push', { type: 'webhook', provider: 'codehost', events: ['push'] });
      const onPrOpened = await mk('on pr opened', { type: 'webhook', provider: 'codehost', events: ['pull_request.opened'] });
      const onTracker = await mk('on tracker', { type: 'webhook', provider: 'tracker' });

      const r = await post('codehost', await sign.codehost(SECRET.codehost, { ref: 'refs/heads/main', after: 'abc' }, { event: 'push' }));
      const id = r.body.delivery_id;
      const processed = await eventually(async () => {
        const d = await delivery(id);
        return d.status === 'processed' ? d : null;
      }, 'the delivery to be processed');
      expect(processed.runs).to.have.length(1);
      expect(processed.runs[0].automation_id).to.equal(onPush.id);
      const run = await finishedRun(h, processed.runs[0].run_id);
      expect(run.status).to.equal('succeeded');
      expect(run.trigger).to.deep.equal({ type: 'webhook', provider: 'codehost', delivery_id: id, event: 'push' });
      expect(run.inputs.event).to.deep.equal({ ref: 'refs/heads/main', after: 'abc' });
      const history = (await h.call<Body>('GET', `/api/v1/automations/${onPush.id}/history`)).body.data;
      expect(history.map((x: Body) => x.id)).to.include(run.id);

      const pr = await post('codehost', await sign.codehost(SECRET.codehost, { action: 'opened' }, { event: 'pull_request' }));
      const prDone = await eventually(async () => {
        const d = await delivery(pr.body.delivery_id);
        return d.status === 'processed' ? d : null;
      }, 'the pull_request delivery');
      expect(prDone.runs.map((x: Body) => x.automation_id)).to.deep.equal([onPrOpened.id]);
      expect(onTracker.id).to.be.a('string');

      // a client's Idempotency-Key of the text the service's own key for the replay's run would have: it takes
      // nothing from the service, whose keys no header can carry
      const squatter = await h.call<Body>('POST', '/api/v1/autonomy/run', {
        body: { steps: [{ tool: 'message', args: { text: 'mine' } }] },
        headers: { 'idempotency-key': `webhook:${id}:2:${onPush.id}` },
      });
      expect(squatter.status, squatter.text).to.equal(202);
      const replayed = await h.call<Body>('POST', `/api/v1/webhook-deliveries/${id}/replay`);
      expect(replayed.status, replayed.text).to.equal(200);
      expect(replayed.body.error, JSON.stringify(replayed.body)).to.equal(null);
      expect(replayed.body.attempts).to.equal(2);
      expect(replayed.body.runs).to.have.length(2);
      const second = replayed.body.runs[1].run_id;
      expect(second).to.not.equal(run.id);
      expect((await finishedRun(h, second)).status).to.equal('succeeded');
      expect((await h.call<Body>('GET', `/api/v1/automations/${onPush.id}/history`)).body.data.map((x: Body) => x.id)).to.include.members([run.id, second]);
      // five replays at once: five attempts of their own, five new runs, all kept
      const many = await Promise.all(Array.from({ length: 5 }, () => h.call<Body>('POST', `/api/v1/webhook-deliveries/${id}/replay`)));
      expect(many.map((r) => r.status)).to.deep.equal([200, 200, 200, 200, 200]);
      const after = await delivery(id);
      expect(after.attempts).to.equal(7);
      expect(after.runs).to.have.length(7);
      expect(new Set(after.runs.map((r: Body) => r.run_id)).size).to.equal(7);

      const metrics = await h.call('GET', '/metrics', { key: KEYS.admin });
      expect(metrics.text).to.match(/webhook_requests_total\{kind="codehost",outcome="accepted"\} \d+/);
      expect(metrics.text).to.match(/webhook_requests_total\{kind="codehost",outcome="webhook-replay"\} \d+/);

      // a disabled automation is not matched
      await h.call('POST', `/api/v1/automations/${onPush.id}/disable`);
      const later = await post('codehost', await sign.codehost(SECRET.codehost, { ref: 'x' }, { event: 'push' }));
      const none = await eventually(async () => {
        const d = await delivery(later.body.delivery_id);
        return d.status === 'processed' ? d : null;
      }, 'the delivery after disabling');
      expect(none.runs).to.deep.equal([]);
    });

    it('retries an accepted delivery whose run could not be made (Redis or the store did not answer) instead of losing it', async () => {
      const name = `on deploy ${randomUUID()}`;
      const automation = (
        await h.call<Body>('POST', '/api/v1/automations', {
          body: {
            name,
            steps: [{ tool: 'message', args: { text: 'deployed' } }],
            triggers: [{ type: 'webhook', provider: 'codehost', events: ['deployment'] }],
          },
        })
      ).body;
      const runs = h.rt.engine.runs;
      const createIdempotent = runs.createIdempotent;
      let calls = 0;
      // the first try meets an outage, as runs.createIdempotent answers when Redis does not answer in time
      runs.createIdempotent = (async (...args: Parameters<typeof createIdempotent>) => {
        if (args[1]?.startsWith('\0webhook:') && calls++ === 0) throw new ServiceUnavailableError('Redis did not answer', 2);
        return createIdempotent(...args);
      }) as typeof createIdempotent;
      try {
        const r = await post('codehost', await sign.codehost(SECRET.codehost, { deployment: { id: randomUUID() } }, { event: 'deployment' }));
        expect(r.status, r.text).to.equal(200);
        const processed = await eventually(
          async () => {
            const d = await delivery(r.body.delivery_id);
            return d.status === 'processed' ? d : null;
          },
          'the delivery to be processed on its job’s retry',
          10_000,
        );
        expect(calls, 'the refused try and its retry').to.equal(2);
        expect(processed).to.deep.include({ error: null, attempts: 1 });
        expect(processed.runs.map((x: Body) => x.automation_id)).to.deep.equal([automation.id]);
        expect((await finishedRun(h, processed.runs[0].run_id)).status).to.equal('succeeded');
      } finally {
        runs.createIdempotent = createIdempotent;
      }
    });

    it('lists deliveries as summaries, without their bodies and events (up to 1 MB each), which a delivery’s own GET answers', async () => {
      const ids: string[] = [];
      for (let i = 0; i < 3; i++) {
        const r = await post('generic', sign.generic([SECRET.generic], { type: 'bulk.export', n: randomUUID(), blob: 'x'.repeat(900_000) }));
        expect(r.status, r.text).to.equal(200);
        ids.push(r.body.delivery_id);
      }
      const listed = await h.call<Body>('GET', '/api/v1/webhook-deliveries?kind=generic&limit=3');
      expect(listed.status, listed.text.slice(0, 300)).to.equal(200);
      expect(listed.body.data.map((d: Body) => d.id)).to.have.members(ids);
      for (const d of listed.body.data) {
        expect(d).to.not.have.any.keys('body', 'event_payload');
        expect(d).to.include({ kind: 'generic', event: 'bulk.export' });
        expect(d.body_size).to.be.above(900_000);
      }
      // three summaries, not 5.4 MB of bodies and events
      expect(listed.text.length).to.be.below(10_000);
      for (const id of ids) {
        const one = await delivery(id);
        expect(one.body).to.have.length(one.body_size);
        expect(one.event_payload.blob).to.have.length(900_000);
      }
    });

    it('lists with kind and status filters and cursors, hides one tenant’s deliveries from another, and refuses replaying a rejection', async () => {
      const page1 = await h.call<Body>('GET', '/api/v1/webhook-deliveries?kind=pager&limit=2');
      expect(page1.status).to.equal(200);
      expect(page1.body.data).to.have.length(2);
      expect(page1.body.data.every((d: Body) => d.kind === 'pager')).to.equal(true);
      const page2 = await h.call<Body>('GET', `/api/v1/webhook-deliveries?kind=pager&limit=2&cursor=${page1.body.next_cursor}`);
      expect(page2.body.data[0].id < page1.body.data[1].id).to.equal(true);
      const rejected = (await h.call<Body>('GET', '/api/v1/webhook-deliveries?status=rejected&limit=1')).body.data[0];
      expect((await h.call('POST', `/api/v1/webhook-deliveries/${rejected.id}/replay`)).status).to.equal(409);
      expect((await h.call('GET', `/api/v1/webhook-deliveries/${rejected.id}`, { key: KEYS.b })).status).to.equal(404);
      expect((await h.call<Body>('GET', '/api/v1/webhook-deliveries', { key: KEYS.b })).body.data.every((d: Body) => d.tenant_id === 'tenant-b')).to.equal(
        true,
      );
      expect((await h.call('GET', '/api/v1/webhook-deliveries?status=nope')).status).to.equal(400);
    });
  });
});

describe('webhook rate limit', function () {
  this.timeout(30_000);
  let h: Harness;
  /** The limit counts by the clock's minute: a test that spends it starts with 10 s of its minute left at least. */
  const clearOfMinuteEnd = async () => {
    const left = 60_000 - (Date.now() % 60_000);
    if (left < 10_000) await new Promise((r) => setTimeout(r, left + 50));
  };
  before(async () => {
    h = await startHarness({ env: { SERVICE_WEBHOOK_RATE_LIMIT_PER_MINUTE: '3' }, workers: false });
    await h.call('PUT', '/api/v1/webhook-secrets/generic', { body: { secrets: [SECRET.generic] } });
  });
  after(async () => {
    await h.close();
  });

  it('answers 429 with Retry-After past the tenant’s limit, and leaves other tenants alone', async () => {
    await clearOfMinuteEnd();
    const statuses: number[] = [];
    let last: Response | undefined;
    for (let i = 0; i < 4; i++) {
      const s = sign.generic([SECRET.generic], { i });
      last = await fetch(`${h.url}/webhooks/tenant-a/generic`, { method: 'POST', headers: s.headers, body: s.body });
      statuses.push(last.status);
    }
    expect(statuses).to.deep.equal([200, 200, 200, 429]);
    // until the minute's end (and a second more), not a minute from its first request
    const toMinuteEnd = Math.ceil((60_000 - (Date.now() % 60_000)) / 1000);
    const retryAfter = Number(last!.headers.get('retry-after'));
    expect(retryAfter).to.be.within(Math.max(1, toMinuteEnd - 1), toMinuteEnd + 2);
    expect(((await last!.json()) as Body).code).to.equal('rate-limited');
    const other = await fetch(`${h.url}/webhooks/tenant-b/generic`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{}' });
    expect(other.status).to.equal(403);
  });

  it('never lets unsigned requests or replays spend a tenant’s budget: they are refused (401, 409), unsigned ones kept up to the limit, and signed deliveries still go in', async () => {
    await h.call('PUT', '/api/v1/webhook-secrets/generic', { key: KEYS.b, body: { secrets: [SECRET.generic] } });
    const statuses: number[] = [];
    for (let i = 0; i < 10; i++) {
      const r = await fetch(`${h.url}/webhooks/tenant-b/generic`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: `{"i":${i}}` });
      statuses.push(r.status);
    }
    expect(statuses).to.deep.equal(Array(10).fill(401));
    const s = sign.generic([SECRET.generic], { real: true });
    const real = await fetch(`${h.url}/webhooks/tenant-b/generic`, { method: 'POST', headers: s.headers, body: s.body });
    expect(real.status).to.equal(200);
    // nor replays of a captured delivery: refused (409), and they spend nothing (the limit is 3: two more go in)
    for (let i = 0; i < 5; i++)
      expect((await fetch(`${h.url}/webhooks/tenant-b/generic`, { method: 'POST', headers: s.headers, body: s.body })).status).to.equal(409);
    for (const n of [1, 2]) {
      const next = sign.generic([SECRET.generic], { next: n });
      expect((await fetch(`${h.url}/webhooks/tenant-b/generic`, { method: 'POST', headers: next.headers, body: next.body })).status, `delivery ${n}`).to.equal(
        200,
      );
    }
    const rejected = (await h.rt.store.deliveries.list('tenant-b', { status: 'rejected', limit: 100 })).items;
    // the limit a minute (two minutes' worth should the minute turn meanwhile): the rest were answered and not kept
    expect(rejected.length).to.be.within(3, 6);
  });

  it('records at most 60 refused requests a minute, each header cut to 128 characters, whatever the delivery limit', async () => {
    const roomy = await startHarness({ workers: false, env: { SERVICE_WEBHOOK_RATE_LIMIT_PER_MINUTE: '100000' } });
    try {
      await roomy.call('PUT', '/api/v1/webhook-secrets/generic', { body: { secrets: [SECRET.generic] } });
      const answers = await Promise.all(
        Array.from({ length: 80 }, (_, i) =>
          fetch(`${roomy.url}/webhooks/tenant-a/generic`, {
            method: 'POST',
            headers: { 'content-type': 'application/json', 'user-agent': 'x'.repeat(1000) },
            body: `{"i":${i}}`,
          }).then((r) => r.status),
        ),
      );
      expect(answers).to.deep.equal(Array(80).fill(401));
      const kept = (await roomy.rt.store.deliveries.list('tenant-a', { status: 'rejected', limit: 100 })).items;
      // (two minutes' worth should the minute turn meanwhile)
      expect(kept.length).to.be.within(60, 80);
      if (new Date().getUTCSeconds() > 5) expect(kept.length).to.equal(60);
      const one = await roomy.rt.store.deliveries.get('tenant-a', kept[0]!.id);
      expect(one!.headers['user-agent']).to.have.length(128);
    } finally {
      await roomy.close();
    }
  });

  it('keeps an accepted delivery when no worker runs, and the reconciler queues one whose job was lost', async () => {
    const store = h.rt.store;
    const listed = (await store.deliveries.list('tenant-a', { kind: 'generic', status: 'received', limit: 10 })).items;
    expect(listed.length).to.equal(3);
    // a list has summaries: a whole delivery to copy is read by its id
    const d = [(await store.deliveries.get('tenant-a', listed[0]!.id))!];
    await h.rt.queues.get('webhooks').obliterate({ force: true });
    const old = new Date(Date.now() - 60_000).toISOString();
    const orphan = { ...d[0]!, id: newId('whd'), provider_delivery_id: null, received_at: old };
    await store.deliveries.insert(orphan);
    expect(await h.rt.engine.webhooks.reconcile()).to.deep.equal({ requeued: 1, retried: 0, errors: 0 });
    const job = await h.rt.queues.get('webhooks').getJob(`delivery-${orphan.id}`);
    expect(job).to.not.equal(undefined);
    // a job that used up its attempts is retried, not left failed
    const manual = new Worker('webhooks', null, { connection: h.rt.redis, prefix: h.config.queuePrefix });
    try {
      const taken = await manual.getNextJob('test-token');
      expect(taken!.id).to.equal(job!.id);
      await taken!.moveToFailed(new UnrecoverableError('store down'), 'test-token', false);
    } finally {
      await manual.close();
    }
    expect(await job!.isFailed()).to.equal(true);
    expect(await h.rt.engine.webhooks.reconcile()).to.deep.equal({ requeued: 0, retried: 1, errors: 0 });
    expect(await job!.isFailed()).to.equal(false);
    // a refused request's record is kept a week: an older one goes at a reconcile, a newer one stays
    const week = 7 * 86_400_000;
    const refusedOld = {
      ...d[0]!,
      id: newId('whd'),
      provider_delivery_id: null,
      status: 'rejected' as const,
      received_at: new Date(Date.now() - week - 60_000).toISOString(),
    };
    const refusedNew = { ...refusedOld, id: newId('whd'), received_at: new Date(Date.now() - week + 3_600_000).toISOString() };
    for (const r of [refusedOld, refusedNew]) await store.deliveries.insert(r);
    await h.rt.engine.webhooks.reconcile();
    expect(await store.deliveries.get('tenant-a', refusedOld.id)).to.equal(null);
    expect(await store.deliveries.get('tenant-a', refusedNew.id)).to.not.equal(null);
  });

  it('deletes a processed delivery’s body and event SERVICE_WEBHOOK_DELIVERIES_KEPT_DAYS after it arrived, keeps its record, and refuses its replay then', async () => {
    const store = h.rt.store;
    const [first] = (await store.deliveries.list('tenant-a', { kind: 'generic', limit: 1 })).items;
    const d = (await store.deliveries.get('tenant-a', first!.id))!;
    const day = 86_400_000;
    const aged = (days: number) => ({
      ...d,
      id: newId('whd'),
      provider_delivery_id: null,
      status: 'processed' as const,
      processed_at: d.received_at,
      received_at: new Date(Date.now() - days * day).toISOString(),
    });
    const old = aged(31);
    const kept = aged(29);
    for (const x of [old, kept]) await store.deliveries.insert(x);
    await h.rt.engine.webhooks.reconcile();
    const got = await h.call<Body>('GET', `/api/v1/webhook-deliveries/${old.id}`);
    expect(got.status, got.text).to.equal(200);
    expect(got.body).to.deep.include({ body: null, event_payload: null, body_sha256: d.body_sha256, status: 'processed' });
    expect(Date.parse(got.body.payload_pruned_at as string)).to.be.closeTo(Date.now(), 60_000);
    const listed = await h.call<Body>('GET', '/api/v1/webhook-deliveries?kind=generic&limit=100');
    expect((listed.body.data as Body[]).find((x) => x.id === old.id)).to.have.property('payload_pruned_at', got.body.payload_pruned_at);
    const replay = await h.call<Body>('POST', `/api/v1/webhook-deliveries/${old.id}/replay`);
    expect(replay.status, replay.text).to.equal(409);
    expect(replay.body.detail).to.match(/retention/);
    expect((await store.deliveries.get('tenant-a', old.id))!.attempts).to.equal(old.attempts);
    // one a day younger keeps them
    const young = await h.call<Body>('GET', `/api/v1/webhook-deliveries/${kept.id}`);
    expect(young.body).to.deep.include({ body: d.body, event_payload: d.event_payload });
    expect(young.body).to.not.have.property('payload_pruned_at');
  });
});

describe('webhook rate limit: replays and resends', function () {
  this.timeout(30_000);
  let h: Harness;
  const post = (tenant: string, kind: string, signed: sign.Signed) =>
    h.call<Body>('POST', `/webhooks/${tenant}/${kind}`, { key: null, raw: signed.body, headers: signed.headers });
  /** The limit counts by the clock's minute: a test that spends it starts with 10 s of its minute left at least. */
  const clearOfMinuteEnd = async () => {
    const left = 60_000 - (Date.now() % 60_000);
    if (left < 10_000) await new Promise((r) => setTimeout(r, left + 50));
  };
  before(async () => {
    h = await startHarness({ env: { SERVICE_WEBHOOK_RATE_LIMIT_PER_MINUTE: '3' }, workers: false });
    for (const key of [KEYS.a, KEYS.b])
      for (const [kind, secret] of [
        ['email', SECRET.email],
        ['pager', SECRET.pager],
        ['tracker', SECRET.tracker],
      ] as const)
        expect((await h.call('PUT', `/api/v1/webhook-secrets/${kind}`, { key, body: { secrets: [secret] } })).status).to.equal(200);
  });
  after(async () => {
    await h.close();
  });

  it('never counts a Mailgun replay: the same signed form again is refused (409), recorded within the budget of refusals, and real mail still goes in', async () => {
    await clearOfMinuteEnd();
    // the minute's budget of recorded refusals (the limit, 3) spent by requests without credentials
    for (let i = 0; i < 3; i++) {
      const unsigned = await post('tenant-a', 'email', {
        body: `from=a%40example.com&i=${i}`,
        headers: { 'content-type': 'application/x-www-form-urlencoded' },
      });
      expect(unsigned.status, unsigned.text).to.equal(401);
    }
    const mail = () => ({
      body: new URLSearchParams({ ...sign.mailgunFields(SECRET.email), from: 'bob@example.com', subject: 'Hi', 'body-plain': randomUUID() }).toString(),
      headers: { 'content-type': 'application/x-www-form-urlencoded' },
    });
    const captured = mail();
    const statuses = [(await post('tenant-a', 'email', captured)).status];
    for (let i = 0; i < 3; i++) statuses.push((await post('tenant-a', 'email', captured)).status);
    statuses.push((await post('tenant-a', 'email', mail())).status);
    expect(statuses).to.deep.equal([200, 409, 409, 409, 200]);
    // Redis lost its claims: the store knows the token (the mail names no Message-Id), and the refusal is past the
    // minute's budget of records, as every other refusal is
    for (const key of await scanKeys(h.rt.redis, `${h.config.queuePrefix}:webhook-seen:*`)) await h.rt.redis.del(key);
    const afterLoss = await post('tenant-a', 'email', captured);
    expect(afterLoss.status, afterLoss.text).to.equal(409);
    expect(afterLoss.body.code).to.equal('webhook-replay');
    const rejected = (await h.rt.store.deliveries.list('tenant-a', { status: 'rejected', limit: 100 })).items;
    expect(rejected).to.have.length(3);
  });

  it('never counts the resend of a delivery already stored (PagerDuty, Linear): a captured body sent again is its duplicate, and real deliveries still go in', async () => {
    await clearOfMinuteEnd();
    const pagerEvent = () => sign.pager([SECRET.pager], { event: { id: randomUUID(), event_type: 'incident.triggered' } });
    const resent = [
      { kind: 'pager', signed: pagerEvent() },
      { kind: 'tracker', signed: sign.tracker(SECRET.tracker, { type: 'Issue', action: 'create', data: { id: randomUUID() } }) },
    ];
    for (const { kind, signed } of resent) {
      const first = await post('tenant-b', kind, signed);
      expect(first.status, first.text).to.equal(200);
      const statuses: number[] = [];
      for (let i = 0; i < 3; i++) {
        const again = await post('tenant-b', kind, signed);
        statuses.push(again.status);
        if (again.status === 200) expect(again.body).to.deep.equal({ delivery_id: first.body.delivery_id, status: 'duplicate' });
      }
      expect(statuses, kind).to.deep.equal([200, 200, 200]);
    }
    const next = await post('tenant-b', 'pager', pagerEvent());
    expect(next.status, next.text).to.equal(200);
    expect(next.body.status).to.equal('accepted');
  });
});
