// Outbound notifications: endpoints subscribed to event types get each event as a Standard Webhooks
// delivery (checked with the standardwebhooks package's own verifier), retried with backoff, logged,
// replayable, and an endpoint that keeps failing is disabled and the tenant told.
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import path from 'node:path';
import { expect } from 'chai';
import { Webhook } from 'standardwebhooks';
import { TRY_CUT_OFF } from '../../engine/connections/index.js';
import { newId, type NotificationDelivery } from '../../engine/platform/index.js';
import { createSecretBox } from '../../engine/platform/secret-box.js';
import { eventually, finishedRun, heldTogether, KEYS, sameDeployment, startHarness, type Harness } from '../support/harness.js';

// eslint-disable-next-line @typescript-eslint/no-explicit-any
type Body = Record<string, any>;

type Received = { path: string; headers: http.IncomingHttpHeaders; body: string; at: number };

/**
 * A receiver on loopback: records every POST, and answers each path with the status set for it (200 by
 * default); `/hang` never answers, and `/drip` answers 200 with a body that never ends, a byte at a time.
 */
async function startReceiver() {
  const received: Received[] = [];
  const status = new Map<string, number>();
  /** a path's answer chosen by the request's body (its status, and how long it is held first), before `status` */
  const plans = new Map<string, (body: string) => { status: number; delayMs: number }>();
  const server = http.createServer((req, res) => {
    let body = '';
    req.on('data', (d) => (body += d));
    req.on('end', () => {
      received.push({ path: req.url ?? '/', headers: req.headers, body, at: Date.now() });
      if (req.url === '/hang') return;
      if (req.url === '/drip') {
        res.writeHead(200);
        const drip = setInterval(() => res.write('.'), 200);
        res.on('close', () => clearInterval(drip));
        return;
      }
      const plan = plans.get(req.url ?? '/')?.(body);
      if (plan) setTimeout(() => res.writeHead(plan.status).end(), plan.delayMs);
      else res.writeHead(status.get(req.url ?? '/') ?? 200).end();
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return {
    url,
    received,
    status,
    plans,
    close: () =>
      new Promise<void>((r) => {
        server.close(() => r());
        server.closeAllConnections();
      }),
  };
}

describe('outbound notifications', function () {
  this.timeout(30_000);
  let h: Harness;
  let receiver: Awaited<ReturnType<typeof startReceiver>>;

  before(async () => {
    receiver = await startReceiver();
    h = await startHarness({
      env: { SERVICE_HTTP_ALLOW_PRIVATE: '1', SERVICE_NOTIFY_ATTEMPTS: '3', SERVICE_NOTIFY_BACKOFF_MS: '100', SERVICE_NOTIFY_DISABLE_AFTER: '2' },
    });
  });
  after(async () => {
    await h?.close();
    await receiver?.close();
  });

  const endpoint = async (body: Body, key = KEYS.a) => {
    const res = await h.call<Body>('POST', '/api/v1/notification-endpoints', { body, key });
    expect(res.status, res.text).to.equal(201);
    return res.body as { secret: string; endpoint: Body };
  };
  /** A run.finished delivery of tenant A's endpoint written straight to the store, made at `at`. */
  const storeDelivery = (id: string, endpointId: string, runId: string, at: string, rest: Pick<NotificationDelivery, 'status' | 'attempts'>) =>
    h.rt.store.notificationDeliveries.insert({
      id,
      tenant_id: 'tenant-a',
      endpoint_id: endpointId,
      event_type: 'run.finished',
      payload: { type: 'run.finished', timestamp: at, data: { run_id: runId } },
      ...rest,
      replays: 0,
      created_at: at,
      updated_at: at,
    });
  const run = async (key = KEYS.a) => {
    const res = await h.call<Body>('POST', '/api/v1/autonomy/run', { key, body: { steps: [{ tool: 'message', args: { text: 'hi' } }], tools: ['message'] } });
    return finishedRun(h, res.body.run_id, key);
  };

  it('signs each subscribed event with the Standard Webhooks scheme, under a secret shown once, and logs the delivery', async () => {
    const made = await endpoint({ url: `${receiver.url}/runs`, description: 'CI dashboard', event_types: ['run.finished'] });
    expect(made.secret).to.match(/^whsec_/);
    expect(made.endpoint).to.deep.include({ status: 'enabled', event_types: ['run.finished'], consecutive_failures: 0 });
    const got = await h.call<Body>('GET', `/api/v1/notification-endpoints/${made.endpoint.id}`);
    expect(got.text).not.to.contain(made.secret);
    expect(got.body).not.to.have.property('secret');

    const finished = await run();
    const mine = await eventually(() => receiver.received.find((r) => r.path === '/runs' && r.body.includes(finished.id)), 'the delivery');
    // the package's own verifier takes it: id, timestamp, signature, body
    const verified = new Webhook(made.secret).verify(mine.body, mine.headers as Record<string, string>) as Body;
    expect(verified).to.deep.include({ type: 'run.finished' });
    expect(verified.data).to.deep.include({ run_id: finished.id, status: 'succeeded' });
    expect(mine.headers['webhook-id']).to.match(/^ntf_/);
    expect(() => new Webhook(made.secret).verify(mine.body.replace('succeeded', 'failed'), mine.headers as Record<string, string>)).to.throw();

    const log = await eventually(async () => {
      const page = (await h.call<Body>('GET', `/api/v1/notification-endpoints/${made.endpoint.id}/deliveries`)).body.data as Body[];
      return page.find((d) => d.id === mine.headers['webhook-id'] && d.status === 'succeeded');
    }, 'the delivery logged as succeeded');
    expect(log).to.deep.include({ event_type: 'run.finished', replays: 0 });
    expect(log.attempts).to.have.length(1);
    expect(log.attempts[0]).to.deep.include({ status_code: 200, error: null });
    // only what it subscribed to, and only its tenant's
    await run(KEYS.b);
    await new Promise((r) => setTimeout(r, 300));
    const sent = receiver.received.filter((r) => r.path === '/runs').map((r) => JSON.parse(r.body).type);
    expect(sent.every((t) => t === 'run.finished')).to.equal(true);
    expect(receiver.received.filter((r) => r.path === '/runs')).to.have.length(1);
    // sealed at rest, never logged
    expect(fs.readFileSync(path.join(h.config.dataDir, 'service.sqlite')).includes(made.secret.slice(6))).to.equal(false);
    expect(h.logs.join('')).not.to.contain(made.secret.slice(6));
  });

  it('sends the workers’ events to an endpoint made or changed in the web process from the next event on, not 5 s later', async () => {
    // the Procfile's web process, apart from this one's workers, on the same store and Redis
    const web = await startHarness({ workers: false, env: { ...sameDeployment(h), SERVICE_HTTP_ALLOW_PRIVATE: '1' } });
    try {
      await run(); // the workers have read this tenant's endpoints: their copy is warm
      const made = await web.call<Body>('POST', '/api/v1/notification-endpoints', { body: { url: `${receiver.url}/fresh`, event_types: ['run.finished'] } });
      expect(made.status, made.text).to.equal(201);
      const first = await run();
      await eventually(() => receiver.received.find((r) => r.path === '/fresh' && r.body.includes(first.id)), 'the new endpoint’s first delivery');
      // no longer subscribed: the next run.finished is not sent (nor delivered, had it been made from an older copy)
      const narrowed = await web.call('PATCH', `/api/v1/notification-endpoints/${made.body.endpoint.id}`, { body: { event_types: ['gate.finished'] } });
      expect(narrowed.status, narrowed.text).to.equal(200);
      const second = await run();
      await new Promise((r) => setTimeout(r, 300));
      expect(receiver.received.filter((r) => r.path === '/fresh' && r.body.includes(second.id))).to.deep.equal([]);
      // a delivery made before the change (an event of the old copy's time), tried after it: failed, not sent
      const id = `ntf_${'1'.repeat(10)}${Date.now().toString(36).padStart(16, '0')}`.slice(0, 30);
      const now = new Date().toISOString();
      await h.rt.store.notificationDeliveries.insert({
        id,
        tenant_id: 'tenant-a',
        endpoint_id: made.body.endpoint.id,
        event_type: 'run.finished',
        payload: { type: 'run.finished', timestamp: now, data: { run_id: 'run_before' } },
        status: 'pending',
        attempts: [],
        replays: 0,
        created_at: now,
        updated_at: now,
      });
      const tried = await h.rt.engine.notifications.deliver('tenant-a', id, false);
      expect(tried).to.deep.include({ status: 'failed' });
      expect((tried as Body).attempts[0].error).to.equal('the endpoint no longer subscribes to run.finished');
      expect(receiver.received.filter((r) => r.body.includes('run_before'))).to.deep.equal([]);
      await web.call('DELETE', `/api/v1/notification-endpoints/${made.body.endpoint.id}`);
    } finally {
      await web.close();
    }
  });

  it('reads the endpoints’ version in the script call of the event’s own append, after the event: no round trip of its own', async () => {
    const { notificationsOf } = await import('../../engine/connections/index.js');
    const { rt } = h;
    const notifications = notificationsOf(
      { store: rt.store, clock: rt.clock, log: rt.log, queues: rt.queues, redis: rt.redis, secretBox: createSecretBox(randomBytes(32)) },
      { ...rt.config.notify, httpAllowPrivate: true },
    );
    const events = notifications.wrap(rt.events);
    const tenant = `tenant-rt-${randomBytes(4).toString('hex')}`;
    const scope = `session:ses_${randomBytes(6).toString('hex')}`;
    const event = { type: 'task.updated' as const, tenant_id: tenant, data: { task_id: 't1', status: 'running' as const, attempt: 1, run_id: null } };
    await events.append(scope, event); // the script is loaded, and the tenant's (empty) endpoints copied
    // the commands sent on the engine's connection that name this event's log or this tenant's endpoints' version
    const sent: string[][] = [];
    const redis = rt.redis as unknown as { sendCommand(cmd: { args: unknown[] }): unknown };
    const send = redis.sendCommand;
    redis.sendCommand = function (this: unknown, cmd: { args: unknown[] }) {
      const args = cmd.args.map(String);
      if (args.some((a) => a.endsWith(`:events:${scope}`) || a.endsWith(`:notify-endpoints:{${tenant}}`))) sent.push(args);
      return send.call(this, cmd);
    };
    try {
      await events.append(scope, event);
    } finally {
      redis.sendCommand = send;
    }
    expect(sent, 'one script call').to.have.length(1);
    const keys = sent[0]!.filter((a) => a.endsWith(`:events:${scope}`) || a.endsWith(`:notify-endpoints:{${tenant}}`));
    expect(
      keys.map((k) => k.split(':').at(-1)),
      'the append, then the version',
    ).to.deep.equal([scope.split(':')[1], `{${tenant}}`]);
  });

  it('retries a failing endpoint with backoff, disables it after repeated failure and tells the tenant, then replays with the same webhook-id', async () => {
    const watcher = await endpoint({ url: `${receiver.url}/ops`, event_types: ['notification.*'] });
    const failing = await endpoint({ url: `${receiver.url}/down`, event_types: ['run.*'] });
    receiver.status.set('/down', 503);
    await run();
    await run();
    const disabled = await eventually(
      async () => {
        const e = (await h.call<Body>('GET', `/api/v1/notification-endpoints/${failing.endpoint.id}`)).body;
        return e.status === 'disabled' ? e : null;
      },
      'the endpoint to be disabled',
      15_000,
    );
    expect(disabled.consecutive_failures).to.equal(2);
    expect(disabled.disabled_reason).to.contain('2 deliveries in a row failed').and.contain('HTTP 503');
    const tries = receiver.received.filter((r) => r.path === '/down');
    expect(tries, 'two deliveries, three tries each').to.have.length(6);
    const first = tries.filter((t) => t.headers['webhook-id'] === tries[0]!.headers['webhook-id']);
    expect(first).to.have.length(3);
    expect(first[2]!.at - first[0]!.at, 'backoff of 100 then 200 ms').to.be.greaterThanOrEqual(250);
    // the tenant is told, through its other endpoint
    const told = await eventually(() => receiver.received.find((r) => r.path === '/ops'), 'the endpoint_disabled notification');
    const event = new Webhook(watcher.secret).verify(told.body, told.headers as Record<string, string>) as Body;
    expect(event).to.deep.include({ type: 'notification.endpoint_disabled' });
    expect(event.data).to.deep.include({ endpoint_id: failing.endpoint.id, consecutive_failures: 2, url: new URL(failing.endpoint.url).origin });
    // a disabled endpoint gets nothing more
    await run();
    await new Promise((r) => setTimeout(r, 300));
    expect(receiver.received.filter((r) => r.path === '/down')).to.have.length(6);

    const log = (await h.call<Body>('GET', `/api/v1/notification-endpoints/${failing.endpoint.id}/deliveries`)).body.data as Body[];
    const failed = log.find((d) => d.status === 'failed')!;
    expect(failed.attempts.map((a: Body) => a.status_code)).to.deep.equal([503, 503, 503]);
    expect((await h.call<Body>('POST', `/api/v1/notification-deliveries/${failed.id}/replay`)).status, 'disabled: 409').to.equal(409);
    receiver.status.set('/down', 200);
    expect((await h.call<Body>('PATCH', `/api/v1/notification-endpoints/${failing.endpoint.id}`, { body: { status: 'enabled' } })).body).to.deep.include({
      status: 'enabled',
      consecutive_failures: 0,
      disabled_reason: null,
    });
    const seen = receiver.received.length;
    const replayed = await h.call<Body>('POST', `/api/v1/notification-deliveries/${failed.id}/replay`);
    expect(replayed.status, replayed.text).to.equal(202);
    expect(replayed.body).to.deep.include({ status: 'pending', replays: 1 });
    const again = await eventually(() => receiver.received.slice(seen).find((r) => r.path === '/down' && r.headers['webhook-id'] === failed.id), 'the replay');
    expect(new Webhook(failing.secret).verify(again.body, again.headers as Record<string, string>)).to.deep.include({ type: 'run.finished' });
    await eventually(async () => {
      const d = ((await h.call<Body>('GET', `/api/v1/notification-endpoints/${failing.endpoint.id}/deliveries`)).body.data as Body[]).find(
        (x) => x.id === failed.id,
      );
      return d?.status === 'succeeded' ? d : null;
    }, 'the replay to be logged');
  });

  it('counts failures in a row by when each try ended: a try that succeeded after another failed starts the count again', async () => {
    const made = await endpoint({ url: `${receiver.url}/in-a-row`, event_types: ['run.finished'] });
    const at = new Date().toISOString();
    const ids = ['a', 'b', 'c'].map(() => newId('ntf'));
    for (const [i, id] of ids.entries()) await storeDelivery(id, made.endpoint.id, `run_row_${i}`, at, { status: 'pending', attempts: [] });
    // the first succeeds after 800 ms; the second fails at once meanwhile, the third after the first has ended
    receiver.plans.set('/in-a-row', (body) => (body.includes('run_row_0') ? { status: 200, delayMs: 800 } : { status: 500, delayMs: 0 }));
    try {
      const first = h.rt.engine.notifications.deliver('tenant-a', ids[0]!, true);
      await eventually(() => receiver.received.some((r) => r.body.includes('run_row_0')) || null, 'the first try to reach the receiver');
      expect(await h.rt.engine.notifications.deliver('tenant-a', ids[1]!, true)).to.equal(null);
      expect(await first).to.deep.include({ status: 'succeeded' });
      expect(await h.rt.engine.notifications.deliver('tenant-a', ids[2]!, true)).to.equal(null);
      // (SERVICE_NOTIFY_DISABLE_AFTER=2: one failure after the success, not two in a row)
      const now = (await h.call<Body>('GET', `/api/v1/notification-endpoints/${made.endpoint.id}`)).body;
      expect(now).to.deep.include({ status: 'enabled', consecutive_failures: 1 });
    } finally {
      receiver.plans.delete('/in-a-row');
      await h.call('DELETE', `/api/v1/notification-endpoints/${made.endpoint.id}`);
    }
  });

  it('sends a delivery again once for two replays asked at once: one is taken, the other is a 409, and the delivery ends', async () => {
    const made = await endpoint({ url: `${receiver.url}/twice`, event_types: ['run.finished'] });
    const at = new Date().toISOString();
    const id = newId('ntf');
    await storeDelivery(id, made.endpoint.id, 'run_x', at, { status: 'succeeded', attempts: [] });
    const seen = receiver.received.length;
    const release = heldTogether(h.rt.store.notificationDeliveries, 'get', 2);
    let answers: number[];
    try {
      answers = (await Promise.all([1, 2].map(() => h.call('POST', `/api/v1/notification-deliveries/${id}/replay`)))).map((r) => r.status).sort();
    } finally {
      release();
    }
    expect(answers).to.deep.equal([202, 409]);
    const ended = await eventually(async () => {
      const d = await h.rt.store.notificationDeliveries.get('tenant-a', id);
      return d?.status === 'succeeded' && d.replays === 1 ? d : null;
    }, 'the replay to be sent and logged');
    expect(ended.replays).to.equal(1);
    expect(receiver.received.slice(seen).filter((r) => r.headers['webhook-id'] === id)).to.have.length(1);
    // it is sent again later as well: nothing was left pending
    expect((await h.call('POST', `/api/v1/notification-deliveries/${id}/replay`)).status).to.equal(202);
  });

  it('fails at once, and disables the endpoint saying why, when its signing secret no longer opens (SERVICE_SECRET_KEY changed)', async () => {
    const made = await endpoint({ url: `${receiver.url}/rekeyed`, event_types: ['run.finished'] });
    // sealed under another key, as after a change of SERVICE_SECRET_KEY
    const sealed = createSecretBox(randomBytes(32)).seal('whsec_x', `notification-endpoint:tenant-a:${made.endpoint.id}`);
    await h.rt.store.notificationEndpoints.update('tenant-a', made.endpoint.id, { sealed_secret: sealed });
    await run();
    const disabled = await eventually(async () => {
      const e = (await h.call<Body>('GET', `/api/v1/notification-endpoints/${made.endpoint.id}`)).body;
      return e.status === 'disabled' ? e : null;
    }, 'the endpoint to be disabled');
    expect(disabled.disabled_reason).to.contain('does not open with SERVICE_SECRET_KEY');
    const [delivery] = (await h.call<Body>('GET', `/api/v1/notification-endpoints/${made.endpoint.id}/deliveries`)).body.data as Body[];
    expect(delivery).to.deep.include({ status: 'failed' });
    expect(delivery!.attempts).to.have.length(1);
    expect(receiver.received.filter((r) => r.path === '/rekeyed')).to.deep.equal([]);
    expect(h.logs.join('')).to.contain(made.endpoint.id);
    // a rotation gives it a secret that signs again (the old one, which does not open, is not kept), and it is enabled again
    const rotated = await h.call<Body>('POST', `/api/v1/notification-endpoints/${made.endpoint.id}/rotate-secret`);
    expect(rotated.status, rotated.text).to.equal(200);
    expect(rotated.body.endpoint.previous_secret_expires_at).to.equal(null);
    expect((await h.call('PATCH', `/api/v1/notification-endpoints/${made.endpoint.id}`, { body: { status: 'enabled' } })).status).to.equal(200);
    const again = await run();
    const got = await eventually(() => receiver.received.find((r) => r.path === '/rekeyed' && r.body.includes(again.id)), 'a delivery signed again');
    expect(new Webhook(rotated.body.secret).verify(got.body, got.headers as Record<string, string>)).to.deep.include({ type: 'run.finished' });
  });

  it('rotates an endpoint’s secret: the new one shown once, the old one signing beside it for keep_previous_seconds, and of two rotations at once one is made', async () => {
    const made = await endpoint({ url: `${receiver.url}/rotated`, event_types: ['run.finished'] });
    const path_ = `/api/v1/notification-endpoints/${made.endpoint.id}/rotate-secret`;
    const sentFor = (runId: string) => eventually(() => receiver.received.find((r) => r.path === '/rotated' && r.body.includes(runId)), 'the delivery');
    const verifies = (secret: string, got: Received) => {
      try {
        new Webhook(secret).verify(got.body, got.headers as Record<string, string>);
        return true;
      } catch {
        return false;
      }
    };
    const first = await sentFor((await run()).id);
    expect(String(first.headers['webhook-signature']).split(' ')).to.have.length(1);
    const before = Date.now();
    const rotated = await h.call<Body>('POST', path_);
    expect(rotated.status, rotated.text).to.equal(200);
    const { secret, endpoint: view } = rotated.body as { secret: string; endpoint: Body };
    expect(secret)
      .to.match(/^whsec_/)
      .and.not.equal(made.secret);
    expect(Object.keys(view)).to.not.include.members(['sealed_secret', 'previous_sealed_secret', 'tenant_id']);
    expect(Date.parse(view.secret_rotated_at)).to.be.at.least(before - 1000);
    expect(Date.parse(view.previous_secret_expires_at) - Date.parse(view.secret_rotated_at)).to.equal(86_400_000);
    expect((await h.call<Body>('GET', `/api/v1/notification-endpoints/${made.endpoint.id}`)).body).to.deep.equal(view);
    // both sign for a day: a receiver that has either verifies
    const both = await sentFor((await run()).id);
    expect(String(both.headers['webhook-signature']).split(' ')).to.have.length(2);
    expect(verifies(secret, both), 'the new secret').to.equal(true);
    expect(verifies(made.secret, both), 'the old secret, kept a day').to.equal(true);
    // rotated again with no time kept: the new one alone signs
    const now = await h.call<Body>('POST', path_, { body: { keep_previous_seconds: 0 } });
    expect(now.status, now.text).to.equal(200);
    expect(now.body.endpoint.previous_secret_expires_at).to.equal(null);
    const alone = await sentFor((await run()).id);
    expect(String(alone.headers['webhook-signature']).split(' ')).to.have.length(1);
    expect(verifies(now.body.secret, alone)).to.equal(true);
    expect(verifies(secret, alone)).to.equal(false);
    expect(verifies(made.secret, alone)).to.equal(false);
    // two at once: one is made (its secret is the endpoint's), the other a 409
    const raced = await Promise.all([h.call<Body>('POST', path_), h.call<Body>('POST', path_)]);
    expect(raced.map((r) => r.status).sort()).to.deep.equal([200, 409]);
    const won = raced.find((r) => r.status === 200)!.body.secret as string;
    expect(verifies(won, await sentFor((await run()).id))).to.equal(true);
    // bad bodies change nothing; another tenant's endpoint is not found
    const current = (await h.call<Body>('GET', `/api/v1/notification-endpoints/${made.endpoint.id}`)).body;
    for (const body of [{ keep_previous_seconds: -1 }, { keep_previous_seconds: 604_801 }, { keep_previous_seconds: 'day' }, { other: 1 }])
      expect((await h.call('POST', path_, { body })).status, JSON.stringify(body)).to.equal(400);
    expect((await h.call('POST', path_, { key: KEYS.b })).status).to.equal(404);
    expect((await h.call('POST', `/api/v1/notification-endpoints/nep_${'0'.repeat(26)}/rotate-secret`)).status).to.equal(404);
    expect((await h.call<Body>('GET', `/api/v1/notification-endpoints/${made.endpoint.id}`)).body).to.deep.equal(current);
    // no secret reaches the logs
    for (const s of [secret, now.body.secret, won]) expect(h.logs.join('')).to.not.contain(s);
  });

  it('makes a run’s deliveries when its job comes back after its process died between its end’s event and them, and never twice', async () => {
    const made = await endpoint({ url: `${receiver.url}/told-again`, event_types: ['run.finished'] });
    const ended = await run();
    const sentOf = () => receiver.received.filter((r) => r.path === '/told-again' && r.body.includes(ended.id));
    await eventually(() => sentOf().length === 1 || null, 'its delivery');
    const [delivery] = (await h.rt.store.notificationDeliveries.list('tenant-a', made.endpoint.id, { limit: 5 })).items;
    // offered again with nothing lost: its delivery (of the same id, the event's) is not made or sent twice
    expect(await h.rt.engine.executor.execute(ended.id, 'tenant-a', ended.attempt)).to.equal(null);
    await new Promise((r) => setTimeout(r, 500));
    expect(sentOf()).to.have.length(1);
    expect((await h.rt.store.notificationDeliveries.list('tenant-a', made.endpoint.id, { limit: 5 })).items.map((d) => d.id)).to.deep.equal([delivery!.id]);
    // what a process that died after the event and before its deliveries left: the event, no delivery
    await h.rt.store.notificationDeliveries.delete('tenant-a', delivery!.id);
    await h.rt.queues.get('notifications').remove(`ntf-${delivery!.id}`);
    expect(await h.rt.engine.executor.execute(ended.id, 'tenant-a', ended.attempt)).to.equal(null);
    await eventually(() => sentOf().length === 2 || null, 'the delivery made again');
    expect(sentOf()[1]!.headers['webhook-id'], 'the same delivery: its id is the event’s').to.equal(delivery!.id);
    const events = await h.rt.events.after(`session:${ended.session_id}`, '0-0', 100);
    expect(
      events.filter((e) => e.type === 'run.finished'),
      'the event told once',
    ).to.have.length(1);
  });

  it('makes the deliveries of an event whose process did not make them, with no job to come back: the reconciler offers it again from the outbox, once', async () => {
    const made = await endpoint({ url: `${receiver.url}/outbox`, event_types: ['run.finished'] });
    const outbox = `${h.config.queuePrefix}:notify-outbox`;
    const endpoints = h.rt.store.notificationEndpoints;
    const list = endpoints.list.bind(endpoints);
    // what a process that died after the event and before its deliveries leaves, as the store failing the read of the
    // endpoints does: the event in the log, no delivery; and no job comes back to tell it again (its job had ended)
    endpoints.list = (async () => {
      throw new Error('SQLITE_IOERR: disk I/O error');
    }) as typeof list;
    let ended: Body;
    try {
      ended = await run();
      await eventually(() => h.logs.join('').includes('notifications not made') || null, 'the failure');
    } finally {
      endpoints.list = list;
    }
    const sentOf = () => receiver.received.filter((r) => r.path === '/outbox' && r.body.includes(ended.id));
    const noted = await h.rt.redis.zrange(outbox, 0, -1);
    const ofRun = noted.filter((m) => m.startsWith(`session:${ended.session_id}\n`));
    expect(ofRun.length, 'its events noted in the outbox').to.be.at.least(1);
    // a note younger than 30 s is left to the process that is making its deliveries
    await h.rt.engine.notifications.reconcile();
    expect((await h.rt.store.notificationDeliveries.list('tenant-a', made.endpoint.id, { limit: 5 })).items).to.have.length(0);
    // 30 s later: offered again, its delivery made and sent, and the notes done with
    for (const m of ofRun) await h.rt.redis.zadd(outbox, Date.now() - 60_000, m);
    await h.rt.engine.notifications.reconcile();
    const got = await eventually(() => sentOf()[0], 'the delivery made by the reconciler');
    expect(new Webhook(made.secret).verify(got.body, got.headers as Record<string, string>)).to.deep.include({ type: 'run.finished' });
    expect((await h.rt.redis.zrange(outbox, 0, -1)).filter((m) => ofRun.includes(m))).to.deep.equal([]);
    // offered once more (two reconcilers at once): the same delivery, not made or sent twice
    for (const m of ofRun) await h.rt.redis.zadd(outbox, Date.now() - 60_000, m);
    await h.rt.engine.notifications.reconcile();
    await new Promise((r) => setTimeout(r, 500));
    expect(sentOf()).to.have.length(1);
    expect((await h.rt.store.notificationDeliveries.list('tenant-a', made.endpoint.id, { limit: 5 })).items).to.have.length(1);
    // an event no endpoint of its tenant wants leaves no note (noted while the process's copy of them is old, then done with)
    const before = await h.rt.redis.zcard(outbox);
    await run(KEYS.b);
    await run(KEYS.b);
    expect(await h.rt.redis.zcard(outbox)).to.equal(before);
  });

  it('repairs a delivery whose job was lost (stored, never queued): the reconciler queues it, and it is sent once', async () => {
    const made = await endpoint({ url: `${receiver.url}/lost`, event_types: ['run.finished'] });
    // a minute old: its job's absence is what tells (the reconciler looked only past the time all tries could take, 23 minutes)
    const old = new Date(Date.now() - 60_000).toISOString();
    const id = `ntf_${'0'.repeat(10)}${Date.now().toString(36).padStart(16, '0')}`.slice(0, 30);
    await storeDelivery(id, made.endpoint.id, 'run_lost', old, { status: 'pending', attempts: [] });
    expect(await h.rt.engine.notifications.reconcile()).to.deep.equal({ requeued: 1, retried: 0, errors: 0 });
    const got = await eventually(() => receiver.received.find((r) => r.path === '/lost'), 'the repaired delivery');
    expect(new Webhook(made.secret).verify(got.body, got.headers as Record<string, string>)).to.deep.include({ type: 'run.finished' });
    expect(got.headers['webhook-id']).to.equal(id);
    await eventually(async () => (await h.rt.store.notificationDeliveries.get('tenant-a', id))?.status === 'succeeded' || null, 'it to be logged as sent');
    expect(await h.rt.engine.notifications.reconcile(), 'nothing left to repair').to.deep.equal({ requeued: 0, retried: 0, errors: 0 });
  });

  it('deletes a removed endpoint’s deliveries with it, and the reconciler deletes ended deliveries kept past SERVICE_NOTIFICATION_DELIVERIES_KEPT_DAYS (30)', async () => {
    const made = await endpoint({ url: `${receiver.url}/kept`, event_types: ['run.finished'] });
    const gone = await endpoint({ url: `${receiver.url}/gone`, event_types: ['run.finished'] });
    const ids = (n: number) => Array.from({ length: n }, () => newId('ntf'));
    const [expired, recent] = ids(2) as [string, string];
    const [ofGone] = ids(1) as [string];
    const longAgo = new Date(Date.now() - 31 * 86_400_000).toISOString();
    await storeDelivery(expired, made.endpoint.id, 'run_old', longAgo, { status: 'succeeded', attempts: [] });
    await storeDelivery(recent, made.endpoint.id, 'run_recent', new Date(Date.now() - 29 * 86_400_000).toISOString(), { status: 'failed', attempts: [] });
    await storeDelivery(ofGone, gone.endpoint.id, 'run_gone', new Date().toISOString(), { status: 'succeeded', attempts: [] });
    expect((await h.call('DELETE', `/api/v1/notification-endpoints/${gone.endpoint.id}`)).status).to.equal(204);
    expect(await h.rt.store.notificationDeliveries.get('tenant-a', ofGone), 'the removed endpoint’s delivery').to.equal(null);
    // one stored after the delete (an event answered from a process's copy of the endpoints made before it) is
    // deleted by its try, not kept as a failure no one can list
    const late = newId('ntf');
    await storeDelivery(late, gone.endpoint.id, 'run_late', new Date().toISOString(), { status: 'pending', attempts: [] });
    expect(await h.rt.engine.notifications.deliver('tenant-a', late, false)).to.equal(null);
    expect(await h.rt.store.notificationDeliveries.get('tenant-a', late), 'a delivery stored after its endpoint’s delete').to.equal(null);
    await h.rt.engine.notifications.reconcile();
    expect(await h.rt.store.notificationDeliveries.get('tenant-a', expired), 'ended 31 days ago').to.equal(null);
    expect(await h.rt.store.notificationDeliveries.get('tenant-a', recent), 'ended 29 days ago').to.not.equal(null);
  });

  it('stores every delivery of an event before queueing any: a queue that refuses one job loses no delivery and keeps none of the others from being sent', async () => {
    const made = await Promise.all(['/q1', '/q2', '/q3'].map((p) => endpoint({ url: `${receiver.url}${p}`, event_types: ['run.finished'] })));
    const queue = h.rt.queues.get('notifications');
    const add = queue.add.bind(queue);
    // Redis refuses the job of the second endpoint's delivery (the first of the three to be queued, the last, or between)
    let refused = 0;
    queue.add = (async (...args: Parameters<typeof add>) => {
      const d = await h.rt.store.notificationDeliveries.get('tenant-a', (args[1] as { delivery_id: string }).delivery_id);
      if (d?.endpoint_id === made[1]!.endpoint.id && !refused++) throw new Error('OOM command not allowed when used memory > maxmemory');
      return add(...args);
    }) as typeof add;
    let sent: Received[];
    let finished: Body;
    try {
      finished = await run();
      // the run's end is stored before its event is appended: the deliveries are made a moment after
      sent = await eventually(() => {
        const got = receiver.received.filter((r) => /^\/q\d$/.test(r.path) && r.body.includes(finished.id));
        return got.length === 2 && refused ? got : null;
      }, 'the two queued deliveries');
    } finally {
      queue.add = add;
    }
    const stored = (await Promise.all(made.map((m) => h.rt.store.notificationDeliveries.list('tenant-a', m.endpoint.id, { limit: 5 })))).map((p) => p.items);
    expect(
      stored.map((items) => items.length),
      'one stored delivery an endpoint',
    ).to.deep.equal([1, 1, 1]);
    const unsent = stored.flat().find((d) => !sent.some((r) => r.headers['webhook-id'] === d.id))!;
    expect(unsent.status).to.equal('pending');
    expect(h.logs.join('')).to.contain('stored, not queued');
    // the reconciler queues it once it is stale
    await h.rt.store.notificationDeliveries.update('tenant-a', unsent.id, { updated_at: new Date(Date.now() - 3_600_000).toISOString() });
    expect(await h.rt.engine.notifications.reconcile()).to.deep.include({ requeued: 1 });
    await eventually(() => receiver.received.find((r) => r.headers['webhook-id'] === unsent.id), 'the repaired delivery');
  });

  it('stores later a delivery the store refused for a moment (busy, a failover), and sends it: the event’s notification is not lost', async () => {
    const made = await endpoint({ url: `${receiver.url}/busy`, event_types: ['run.finished'] });
    const deliveries = h.rt.store.notificationDeliveries;
    const insert = deliveries.insert.bind(deliveries);
    let refused = 0;
    deliveries.insert = (async (d: Parameters<typeof insert>[0]) => {
      if (d.endpoint_id === made.endpoint.id && refused++ < 2) throw new Error('SQLITE_BUSY: database is locked');
      return insert(d);
    }) as typeof insert;
    try {
      const finished = await run();
      const got = await eventually(
        () => receiver.received.find((r) => r.path === '/busy' && r.body.includes(finished.id)),
        'the delivery stored later, and sent',
      );
      expect(new Webhook(made.secret).verify(got.body, got.headers as Record<string, string>)).to.deep.include({ type: 'run.finished' });
      expect(refused).to.equal(3);
      expect((await deliveries.list('tenant-a', made.endpoint.id, { limit: 5 })).items).to.have.length(1);
      expect(h.logs.join('')).to.contain('not stored yet: trying again');
    } finally {
      deliveries.insert = insert;
    }
  });

  it('keeps a delivery’s last 100 tries: replays do not grow its row without end', async () => {
    const made = await endpoint({ url: `${receiver.url}/kept`, event_types: ['run.finished'] });
    const at = new Date().toISOString();
    const id = newId('ntf');
    const tries = Array.from({ length: 100 }, (_, i) => ({ at, status_code: 500, error: `try ${i}`, duration_ms: 1 }));
    await storeDelivery(id, made.endpoint.id, 'run_kept', at, { status: 'failed', attempts: tries });
    expect((await h.call('POST', `/api/v1/notification-deliveries/${id}/replay`)).status).to.equal(202);
    const sent = await eventually(async () => {
      const d = await h.rt.store.notificationDeliveries.get('tenant-a', id);
      return d?.status === 'succeeded' ? d : null;
    }, 'the replay to be sent');
    expect(sent.attempts).to.have.length(100);
    expect(sent.attempts[0]!.error).to.equal('try 1');
    expect(sent.attempts.at(-1)!.status_code).to.equal(200);
  });

  it('takes a try’s answer from its status line: a receiver that answers 200 and sends a body that never ends has taken the delivery', async () => {
    const made = await endpoint({ url: `${receiver.url}/drip`, event_types: ['run.finished'] });
    await run();
    const done = await eventually(async () => {
      const [d] = (await h.call<Body>('GET', `/api/v1/notification-endpoints/${made.endpoint.id}/deliveries`)).body.data as Body[];
      return d?.status === 'pending' ? null : d;
    }, 'the delivery to be settled');
    expect(done.status).to.equal('succeeded');
    expect(done.attempts).to.have.length(1);
    expect(done.attempts[0]).to.deep.include({ status_code: 200, error: null });
    expect(done.attempts[0].duration_ms).to.be.below(5000);
  });

  it('stops a try in flight when its worker shuts down (interruptAll, as the grace period ends): no try of the job spent, the cut-off POST kept in the log, the job back in the queue, sent again with the same webhook-id', async () => {
    const made = await endpoint({ url: `${receiver.url}/cut-off`, event_types: ['run.finished'] });
    // the first POST is held past any grace period (SERVICE_NOTIFY_TIMEOUT_SECONDS is 15 s); the next is answered at once
    let seen = 0;
    receiver.plans.set('/cut-off', () => (++seen === 1 ? { status: 200, delayMs: 60_000 } : { status: 200, delayMs: 0 }));
    const ended = await run();
    const sentOf = () => receiver.received.filter((r) => r.path === '/cut-off' && r.body.includes(ended.id));
    await eventually(() => sentOf().length === 1 || null, 'the first POST');
    // (another endpoint of the tenant's, from a test before, may have a try in flight too)
    expect(h.rt.engine.notifications.interruptAll()).to.be.at.least(1);
    await eventually(() => sentOf().length === 2 || null, 'the delivery sent again', 5000);
    expect(sentOf()[1]!.headers['webhook-id']).to.equal(sentOf()[0]!.headers['webhook-id']);
    const done = await eventually(async () => {
      const [d] = (await h.call<Body>('GET', `/api/v1/notification-endpoints/${made.endpoint.id}/deliveries`)).body.data as Body[];
      return d?.status === 'pending' ? null : d;
    }, 'the delivery to be settled');
    expect(done.status).to.equal('succeeded');
    // the log shows both POSTs the endpoint received: the one cut off (no answer, which the endpoint may have
    // read), then the answered one, which replaced its own entry
    expect(done.attempts.map((a: Body) => [a.status_code, a.error])).to.deep.equal([
      [null, TRY_CUT_OFF],
      [200, null],
    ]);
    const job = await h.rt.queues.get('notifications').getJob(`ntf-${done.id}`);
    expect(job?.attemptsMade, 'of the job’s tries, only the one that completed spent').to.equal(1);
  });

  it('holds one tenant to SERVICE_NOTIFY_TENANT_CONCURRENCY tries in flight: its endpoints that never answer do not delay another tenant’s', async () => {
    const fair = await startHarness({
      env: {
        SERVICE_HTTP_ALLOW_PRIVATE: '1',
        SERVICE_NOTIFY_ATTEMPTS: '1',
        SERVICE_NOTIFY_TIMEOUT_SECONDS: '3',
        SERVICE_NOTIFY_TENANT_CONCURRENCY: '2',
      },
    });
    try {
      const make = async (url: string, key: string) => {
        const res = await fair.call<Body>('POST', '/api/v1/notification-endpoints', { key, body: { url, event_types: ['run.finished'] } });
        expect(res.status, res.text).to.equal(201);
        return res.body.endpoint as Body;
      };
      const runOn = async (key: string) => {
        const res = await fair.call<Body>('POST', '/api/v1/autonomy/run', {
          key,
          body: { steps: [{ tool: 'message', args: { text: 'hi' } }], tools: ['message'] },
        });
        return finishedRun(fair, res.body.run_id, key);
      };
      // tenant b: twenty endpoints that never answer, as many as a worker's notification slots
      const hung = await Promise.all(Array.from({ length: 20 }, () => make(`${receiver.url}/hang`, KEYS.b)));
      await make(`${receiver.url}/fast`, KEYS.a);
      const before = receiver.received.filter((r) => r.path === '/hang').length;
      // a delivery that waits for its tenant's place reads nothing: the store is read by tries only
      const deliveries = fair.rt.store.notificationDeliveries;
      const get = deliveries.get.bind(deliveries);
      let reads = 0;
      deliveries.get = (tenantId, id) => ((reads += tenantId === 'tenant-b' ? 1 : 0), get(tenantId, id));
      await runOn(KEYS.b);
      await eventually(() => receiver.received.filter((r) => r.path === '/hang').length - before >= 2 || null, 'tenant b’s tries to hang');
      const finished = await runOn(KEYS.a);
      const got = await eventually(() => receiver.received.find((r) => r.path === '/fast' && r.body.includes(finished.id)), 'tenant a’s delivery');
      expect(got.at - Date.parse(finished.finished_at), 'sent while b’s tries hang (each for 3 s)').to.be.below(1500);
      expect(receiver.received.filter((r) => r.path === '/hang').length - before, 'b’s tries in flight').to.equal(2);
      // eighteen deliveries waited (each asked again within 2 s) while two hung: only tries read (and one may be on its way)
      const tries = receiver.received.filter((r) => r.path === '/hang').length - before;
      expect(reads, 'tenant b’s deliveries read').to.be.at.most(tries + 2);
      // a try that gets no answer says so
      const failed = await eventually(async () => {
        for (const e of hung) {
          const [d] = (await fair.call<Body>('GET', `/api/v1/notification-endpoints/${e.id}/deliveries`, { key: KEYS.b })).body.data as Body[];
          if (d?.status === 'failed') return d;
        }
        return null;
      }, 'a hung delivery to fail');
      expect(failed.attempts[0]).to.deep.include({ status_code: null, error: 'no answer within 3000 ms' });
    } finally {
      await fair.close();
    }
  });

  it('pages the reconciler past deliveries whose jobs only wait in a backlog: a lost one behind 500 of them is queued again', async () => {
    const idle = await startHarness({ workers: false, env: { SERVICE_HTTP_ALLOW_PRIVATE: '1' } });
    try {
      const res = await idle.call<Body>('POST', '/api/v1/notification-endpoints', { body: { url: `${receiver.url}/backlog`, event_types: ['run.finished'] } });
      const endpointId = res.body.endpoint.id as string;
      const stale = (ms: number, i: number): Body => {
        const at = new Date(Date.now() - ms).toISOString();
        return {
          id: `ntf_${String(ms).padStart(10, '0')}${String(i).padStart(16, '0')}`,
          tenant_id: 'tenant-a',
          endpoint_id: endpointId,
          event_type: 'run.finished',
          payload: { type: 'run.finished', timestamp: at, data: { i } },
          status: 'pending',
          attempts: [],
          replays: 0,
          created_at: at,
          updated_at: at,
        };
      };
      // 500 older ones, each with its job waiting; then one whose job is lost
      const waiting = Array.from({ length: 500 }, (_, i) => stale(7_200_000, i));
      await Promise.all(waiting.map((d) => idle.rt.store.notificationDeliveries.insert(d as never)));
      await idle.rt.queues
        .get('notifications')
        .addBulk(waiting.map((d) => ({ name: 'deliver', data: { tenant_id: 'tenant-a', delivery_id: d.id }, opts: { jobId: `ntf-${d.id}` } })));
      const lost = stale(3_600_000, 0);
      await idle.rt.store.notificationDeliveries.insert(lost as never);
      expect(await idle.rt.engine.notifications.reconcile()).to.deep.equal({ requeued: 1, retried: 0, errors: 0 });
      expect(await idle.rt.queues.get('notifications').getJob(`ntf-${lost.id}`)).to.not.equal(undefined);
    } finally {
      await idle.close();
    }
  });

  it('refuses bad event types, loopback URLs without SERVICE_HTTP_ALLOW_PRIVATE, and another tenant’s endpoints and deliveries', async () => {
    const bad = await h.call<Body>('POST', '/api/v1/notification-endpoints', { body: { url: `${receiver.url}/x`, event_types: ['run.started'] } });
    expect(bad.status).to.equal(400);
    expect(bad.body.errors[0].path).to.equal('/body/event_types/0');
    expect((await h.call<Body>('POST', '/api/v1/notification-endpoints', { body: { url: 'ftp://example.com', event_types: ['*'] } })).status).to.equal(400);
    const strict = await startHarness({
      workers: false,
      env: { ...sameDeployment(h), SERVICE_HTTP_ALLOW_PRIVATE: '0' },
    });
    try {
      const refused = await strict.call<Body>('POST', '/api/v1/notification-endpoints', { body: { url: 'http://10.0.0.8/hook', event_types: ['*'] } });
      expect(refused.status).to.equal(422);
      expect(refused.body.code).to.equal('address-not-allowed');
    } finally {
      await strict.close();
    }
    const mine = (await h.call<Body>('GET', '/api/v1/notification-endpoints')).body.data[0];
    for (const [method, suffix] of [
      ['GET', ''],
      ['PATCH', ''],
      ['DELETE', ''],
      ['GET', '/deliveries'],
    ] as const) {
      const res = await h.call(method, `/api/v1/notification-endpoints/${mine.id}${suffix}`, {
        key: KEYS.b,
        body: method === 'PATCH' ? { status: 'disabled' } : undefined,
      });
      expect(res.status, `${method} ${suffix}`).to.equal(404);
    }
    const delivery = (await h.call<Body>('GET', `/api/v1/notification-endpoints/${mine.id}/deliveries`)).body.data[0];
    expect((await h.call('POST', `/api/v1/notification-deliveries/${delivery.id}/replay`, { key: KEYS.b })).status).to.equal(404);
    expect((await h.call<Body>('GET', '/api/v1/notification-endpoints', { key: KEYS.b })).body.data).to.deep.equal([]);
    expect((await h.call('DELETE', `/api/v1/notification-endpoints/${mine.id}`)).status).to.equal(204);
    expect((await h.call('GET', `/api/v1/notification-endpoints/${mine.id}`)).status).to.equal(404);
  });

  it('keeps at most 50 endpoints a tenant (each event is a delivery and a job per endpoint): one more is a 409, and another tenant is not held to it', async () => {
    const have = (await h.call<Body>('GET', '/api/v1/notification-endpoints')).body.data.length;
    // none subscribes to what the other tests wait for
    for (let i = have; i < 50; i++) await endpoint({ url: `${receiver.url}/cap-${i}`, event_types: ['audit.report'] });
    const over = await h.call<Body>('POST', '/api/v1/notification-endpoints', { body: { url: `${receiver.url}/cap-over`, event_types: ['audit.report'] } });
    expect(over.status, over.text).to.equal(409);
    expect(over.body.detail).to.match(/50 notification endpoints/);
    expect((await h.call<Body>('GET', '/api/v1/notification-endpoints')).body.data).to.have.length(50);
    await endpoint({ url: `${receiver.url}/cap-b`, event_types: ['audit.report'] }, KEYS.b);
  });

  it('keeps the cap when creates race: of two at once, one below it, one is made and the other refused with 409', async () => {
    const small = await startHarness({ workers: false, env: { SERVICE_HTTP_ALLOW_PRIVATE: '1', SERVICE_TENANT_MAX_NOTIFICATION_ENDPOINTS: '2' } });
    try {
      const create = (name: string) =>
        small.call<Body>('POST', '/api/v1/notification-endpoints', { body: { url: `${receiver.url}/${name}`, event_types: ['audit.report'] } });
      expect((await create('held')).status).to.equal(201);
      // both read the tenant's endpoints before either is stored
      const release = heldTogether(small.rt.store.notificationEndpoints, 'list', 2);
      const raced = await Promise.all([create('raced-1'), create('raced-2')]).finally(release);
      expect(raced.map((r) => r.status).sort(), raced.map((r) => r.text).join('\n')).to.deep.equal([201, 409]);
      const refused = raced.find((r) => r.status === 409)!;
      expect(refused.body).to.deep.include({ code: 'conflict' });
      expect(refused.body.detail).to.contain('SERVICE_TENANT_MAX_NOTIFICATION_ENDPOINTS');
      expect((await small.call<Body>('GET', '/api/v1/notification-endpoints')).body.data).to.have.length(2);
      expect(await small.rt.store.notificationEndpoints.list('tenant-a')).to.have.length(2);
    } finally {
      await small.close();
    }
  });
});
