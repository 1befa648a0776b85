// Outbound notifications: a tenant's endpoints subscribe to event types; each matching event becomes a
// delivery (stored first), sent by a BullMQ job with the Standard Webhooks scheme (webhook-id, the
// delivery's id, the same on every attempt; webhook-timestamp; webhook-signature under the endpoint's
// own secret, shown once), retried with backoff. A delivery that fails all its attempts counts against
// its endpoint; after SERVICE_NOTIFY_DISABLE_AFTER such in a row the endpoint is disabled and the
// tenant told (a `notification.endpoint_disabled` event, itself sent to the tenant's other endpoints).
import { randomBytes } from 'node:crypto';
import http from 'node:http';
import https from 'node:https';
import { Webhook } from 'standardwebhooks';
import {
  assertPublicHost,
  guardedLookup,
  privateLiteral,
  canonicalJson,
  idOf,
  newId,
  outboxEntry,
  outboxMember,
  redisBatch,
  withTimeout,
  NOTIFICATION_TYPES,
  staleJobRepair,
  pruneInPages,
  TAKE_PLACE_LUA,
  SHUTDOWN_REASON,
  interruptEvery,
  NotFoundError,
  ValidationError,
  ConflictError,
  type EventLog,
  type EventOutbox,
  type FieldError,
  type NotificationDelivery,
  type NotificationEndpoint,
  type NotificationType,
  type Redis,
  type ServiceEvent,
} from '../platform/index.js';
import type { NotifyConfig } from '../../config/env.js';
import type { Platform } from '../deps.js';
import type { NotificationEndpointChanges, Page } from '../store/index.js';

export type NotificationSettings = NotifyConfig & { httpAllowPrivate: boolean };

export type EndpointInput = { url: string; description?: string | null; event_types: string[] };
export type EndpointPatch = Partial<EndpointInput> & { status?: 'enabled' | 'disabled' };
export type EndpointView = Omit<NotificationEndpoint, 'sealed_secret' | 'previous_sealed_secret' | 'tenant_id'>;
export type NotificationJob = { tenant_id: string; delivery_id: string };

export const endpointView = ({ sealed_secret: _s, previous_sealed_secret: _p, tenant_id: _t, ...rest }: NotificationEndpoint): EndpointView => ({
  ...rest,
  secret_rotated_at: rest.secret_rotated_at ?? null,
  previous_secret_expires_at: rest.previous_secret_expires_at ?? null,
});

/** The outbound name of a catalogue event, when endpoints may subscribe to it. */
function outboundType(type: ServiceEvent['type']): NotificationType | null {
  const name = type === 'audit.finished' ? 'audit.report' : type;
  return (NOTIFICATION_TYPES as readonly string[]).includes(name) ? (name as NotificationType) : null;
}

/** `*`, `gate.*` or an exact type. */
function subscribes(patterns: string[], type: NotificationType): boolean {
  return patterns.some((p) => p === '*' || p === type || (p.endsWith('.*') && type.startsWith(p.slice(0, -1))));
}

/** The longest a process answers events from its copy of a tenant's endpoints (when Redis cannot say whether they changed). */
const CACHE_MS = 5_000;
/** How long a change of endpoints, or an event, waits for Redis to take or give their version. */
const VERSION_WAIT_MS = 1000;
/** The tries a delivery keeps: its last ones (each replay adds tries, and each try rewrites the whole row). */
const TRIES_KEPT = 100;
/** A try's entry while it is made, left as it is by a process that died or stopped before the answer. */
export const TRY_CUT_OFF = 'cut off: the process sending it stopped before an answer (the endpoint may have received it, with the same webhook-id)';
/** How long a delivery stays pending before the reconciler looks whether its job is there (as for webhook deliveries). */
const STALE_AFTER_MS = 30_000;
/** The events of the outbox (see wrap) a reconciler pass offers again at most, and how many at a time. */
const OUTBOX_PER_PASS = 500;
const OUTBOX_AT_ONCE = 20;
const keptTries = (tries: NotificationDelivery['attempts'], next: NotificationDelivery['attempts'][number]) => [...tries, next].slice(-TRIES_KEPT);

/** Deliveries the store refused are asked for again STORE_TRIES times, STORE_RETRY_MS later and then twice as late (about a minute). */
const STORE_TRIES = 8;
const STORE_RETRY_MS = 250;
const jobId = (d: NotificationDelivery) => `ntf-${d.id}${d.replays ? `-r${d.replays}` : ''}`;

/** How long a rotated secret still signs beside the new one unless the rotation says (Svix's default too). */
const KEEP_PREVIOUS_SECONDS = 86_400;
const newSecret = () => `whsec_${randomBytes(24).toString('base64')}`;

const tooMany = (max: number) =>
  new ConflictError(`this tenant has ${max} notification endpoints, the most it may keep (SERVICE_TENANT_MAX_NOTIFICATION_ENDPOINTS): remove one first`);

/**
 * How long a delivery whose tenant has all its tries in flight waits before it asks again (and up to as long
 * again, at random): 1 s, doubled each time it found the tenant busy, at most 16 s. A tenant whose endpoints
 * hang keeps a backlog that asks less and less often, not a load that grows with it.
 */
export function notifyBusyWaitMs(timesBusy: number): number {
  return 1000 * 2 ** Math.min(Math.max(timesBusy - 1, 0), 4);
}

type PlaceRedis = Redis & { notifyTakePlace(key: string, ...args: (string | number)[]): Promise<number> };

export function notificationsOf(deps: Pick<Platform, 'store' | 'clock' | 'log' | 'secretBox' | 'queues' | 'redis'>, settings: NotificationSettings) {
  const { store, clock, log, secretBox, queues } = deps;
  if (!('notifyTakePlace' in deps.redis)) deps.redis.defineCommand('notifyTakePlace', { numberOfKeys: 1, lua: TAKE_PLACE_LUA });
  const redis = deps.redis as PlaceRedis;
  // {tenant} is a hash tag: one key, one Redis Cluster slot
  const inFlight = (tenantId: string) => `${queues.prefix}:notify-in-flight:{${tenantId}}`;
  const owner = (tenantId: string, id: string) => `notification-endpoint:${tenantId}:${id}`;
  /** The POSTs this process is making, by delivery: interruptAll stops them as it shuts down. */
  const sending = new Map<string, Set<AbortController>>();
  /**
   * A tenant's enabled endpoints, for the event path: each process keeps a copy, with the tenant's endpoints'
   * version as Redis had it when the copy was read. Every change of them (in any process) writes a new
   * version after the store, and an event finds the copy out of date by it, in the round trip the event's
   * other Redis work takes. Kept 5 s at most: the copy alone (no version) let an endpoint made in the web
   * process miss the worker's events for 5 s, and one that dropped a type still be sent it.
   */
  const cache = new Map<string, { at: number; version: string | undefined; endpoints: NotificationEndpoint[] }>();
  const batch = redisBatch(redis);
  batch.define('notify.endpoints', { keys: 1, args: 0, lua: "return redis.call('GET', KEYS[1]) or ''" });
  batch.define('notify.unnote', { keys: 1, args: 1, lua: "return redis.call('ZREM', KEYS[1], ARGV[1])" });
  const versionKey = (tenantId: string) => `${queues.prefix}:notify-endpoints:{${tenantId}}`;
  /** The events whose deliveries are not all stored yet (see wrap); in the prefix's slot, as the event logs are. */
  const outboxKey = `${queues.prefix}:notify-outbox`;
  /** An outbox note done with, in the engine's Redis batch (with the event's other Redis work). */
  const unnote = (member: string) => batch.call('notify.unnote', [outboxKey], [member]);
  let events: EventLog | null = null;

  /**
   * The tenant's endpoints' version as Redis has it, asked for now: in the engine's batch, so that asked for
   * right after an event's append it is read in the append's own script call, after the event (no change of
   * endpoints stored before the append can be missed), and costs the event no round trip of its own. Unanswered
   * (within a second: a stalled Redis never answers), it is undefined: no copy is taken as current.
   */
  const versionOf = (tenantId: string): Promise<string | undefined> =>
    withTimeout(batch.call<string>('notify.endpoints', [versionKey(tenantId)], []), VERSION_WAIT_MS, 'the endpoints’ version').catch(() => undefined);

  async function enabledOf(tenantId: string, asked: Promise<string | undefined> = versionOf(tenantId)): Promise<NotificationEndpoint[]> {
    const version = await asked;
    const hit = cache.get(tenantId);
    if (hit && version !== undefined && hit.version === version && Date.now() - hit.at < CACHE_MS) return hit.endpoints;
    const endpoints = (await store.notificationEndpoints.list(tenantId)).filter((e) => e.status === 'enabled');
    cache.set(tenantId, { at: Date.now(), version, endpoints });
    if (cache.size > 10_000) cache.delete(cache.keys().next().value!);
    return endpoints;
  }

  /**
   * Whether an event of `type` may have deliveries to make, as this process's copy of the tenant's endpoints
   * says without asking anyone: so it is when there is no copy, or an old one.
   */
  function mayDeliver(tenantId: string, type: NotificationType): boolean {
    const hit = cache.get(tenantId);
    return !hit || Date.now() - hit.at >= CACHE_MS || hit.endpoints.some((e) => subscribes(e.event_types, type));
  }

  /**
   * The tenant's endpoints changed (stored): every process's copy is out of date from now. The change is
   * answered within a second whatever Redis does (stalled, it held the answer of a change already stored).
   */
  async function changed(tenantId: string): Promise<void> {
    cache.delete(tenantId);
    await withTimeout(redis.set(versionKey(tenantId), randomBytes(8).toString('hex')), VERSION_WAIT_MS, 'the endpoints’ new version').catch((err: Error) => {
      log.warn(
        { tenant_id: tenantId, err: err.message },
        "notification endpoints changed; Redis did not take their new version: other processes' copies last up to 5 s",
      );
    });
  }

  function problemsOf(input: Partial<EndpointInput>): FieldError[] {
    const errors: FieldError[] = [];
    if (input.url !== undefined) {
      let url: URL | null = null;
      try {
        url = new URL(input.url);
      } catch {
        errors.push({ path: '/body/url', message: 'not a URL' });
      }
      if (url && url.protocol !== 'https:' && url.protocol !== 'http:') errors.push({ path: '/body/url', message: 'an http or https URL' });
      if (url && (url.username || url.password)) errors.push({ path: '/body/url', message: 'no credentials in the URL' });
    }
    for (const [i, t] of (input.event_types ?? []).entries()) {
      const known =
        t === '*' ||
        (NOTIFICATION_TYPES as readonly string[]).includes(t) ||
        (t.endsWith('.*') && NOTIFICATION_TYPES.some((n) => n.startsWith(t.slice(0, -1))));
      if (!known)
        errors.push({
          path: `/body/event_types/${i}`,
          message: `not a type endpoints can subscribe to: ${NOTIFICATION_TYPES.join(', ')}, a prefix with .* or *`,
        });
    }
    return errors;
  }

  async function must(tenantId: string, id: string): Promise<NotificationEndpoint> {
    const found = await store.notificationEndpoints.get(tenantId, id);
    if (!found) throw new NotFoundError(`no notification endpoint ${id}`);
    return found;
  }

  async function enqueue(d: NotificationDelivery): Promise<void> {
    await queues.get('notifications').add('deliver', { tenant_id: d.tenant_id, delivery_id: d.id } satisfies NotificationJob, {
      jobId: jobId(d),
      attempts: settings.attempts,
      backoff: { type: 'exponential', delay: settings.backoffMs },
      removeOnComplete: { count: 1000 },
      removeOnFail: { count: 5000 },
    });
  }

  /**
   * One POST of a delivery; the status code, or why there was none. The answer is its status line: the body
   * is not read (a receiver that took the delivery and sends a slow or endless body has still taken it).
   */
  function post(url: URL, headers: Record<string, string>, body: string, stopped: AbortSignal): Promise<{ status_code: number | null; error: string | null }> {
    const client = url.protocol === 'https:' ? https : http;
    // an endpoint given as an address is checked here: no lookup is made for it at connect time
    const literal = settings.httpAllowPrivate ? null : privateLiteral(url);
    if (literal) return Promise.resolve({ status_code: null, error: `address-not-allowed: ${literal} is a private or loopback address` });
    const noAnswer = `no answer within ${settings.timeoutMs} ms`;
    // the whole try, not only a quiet socket: a slow endpoint cannot hold a worker's slot for long
    const timeout = AbortSignal.timeout(settings.timeoutMs);
    const signal = AbortSignal.any([timeout, stopped]);
    return new Promise((resolve) => {
      const req = client.request(
        url,
        { method: 'POST', headers, timeout: settings.timeoutMs, signal, ...(settings.httpAllowPrivate ? {} : { lookup: guardedLookup as never }) },
        (res) => {
          const status = res.statusCode ?? null;
          res.destroy();
          resolve({ status_code: status, error: status && status >= 200 && status < 300 ? null : `HTTP ${status}` });
        },
      );
      req.on('timeout', () => req.destroy(new Error(noAnswer)));
      req.on('error', (err: NodeJS.ErrnoException) =>
        resolve({
          status_code: null,
          error: err.code === 'EPRIVATE' ? `address-not-allowed: ${err.message}` : stopped.aborted ? SHUTDOWN_REASON : timeout.aborted ? noAnswer : err.message,
        }),
      );
      req.end(body);
    });
  }

  /** Disables an endpoint and tells its tenant (of two disables at once, one does both). */
  async function disable(tenantId: string, endpoint: NotificationEndpoint, reason: string, failures: number): Promise<void> {
    const disabled = await store.notificationEndpoints.disable(tenantId, endpoint.id, reason, clock.now().toISOString());
    await changed(tenantId);
    if (!disabled) return;
    log.warn({ tenant_id: tenantId, endpoint_id: endpoint.id, consecutive_failures: failures }, 'notification endpoint disabled');
    await events?.append(`notifications:${tenantId}`, {
      tenant_id: tenantId,
      type: 'notification.endpoint_disabled',
      // where it pointed, by origin: an endpoint's path and query are often its secret (a capability URL)
      data: { endpoint_id: endpoint.id, url: new URL(endpoint.url).origin, reason, consecutive_failures: failures },
    });
  }

  /** One try of a delivery, its tenant's place taken (see deliver). */
  async function deliverInPlace(tenantId: string, deliveryId: string, last: boolean): Promise<NotificationDelivery | null | 'interrupted'> {
    const d = await store.notificationDeliveries.get(tenantId, deliveryId);
    if (!d || d.status !== 'pending') return d;
    const endpoint = await store.notificationEndpoints.get(tenantId, d.endpoint_id);
    // removed since the event: its deliveries went with it, and one stored after (from a process's copy of the
    // tenant's endpoints, made before the delete) goes too, with its event's payload, sent to no one
    if (!endpoint) {
      await store.notificationDeliveries.delete(tenantId, d.id);
      return null;
    }
    // what the endpoint is now decides: disabled, or no longer subscribed to the type since the event
    if (endpoint.status !== 'enabled' || !subscribes(endpoint.event_types, d.event_type)) {
      const why = endpoint.status !== 'enabled' ? 'the endpoint is disabled' : `the endpoint no longer subscribes to ${d.event_type}`;
      return store.notificationDeliveries.update(tenantId, d.id, {
        status: 'failed',
        attempts: keptTries(d.attempts, { at: clock.now().toISOString(), status_code: null, error: why, duration_ms: 0 }),
        updated_at: clock.now().toISOString(),
      });
    }
    const body = JSON.stringify(d.payload);
    const at = clock.now();
    let secret: string;
    try {
      secret = secretBox.open(endpoint.sealed_secret, owner(tenantId, endpoint.id));
    } catch {
      // sealed under another SERVICE_SECRET_KEY: no try will ever sign, so none is made; the endpoint stops until it is made again
      const why =
        "the endpoint's signing secret does not open with SERVICE_SECRET_KEY (the key changed): rotate its secret (POST /api/v1/notification-endpoints/{id}/rotate-secret) and enable it again";
      log.error({ tenant_id: tenantId, endpoint_id: endpoint.id, delivery_id: d.id }, why);
      const failed = await store.notificationDeliveries.update(tenantId, d.id, {
        status: 'failed',
        attempts: keptTries(d.attempts, { at: at.toISOString(), status_code: null, error: why, duration_ms: 0 }),
        updated_at: clock.now().toISOString(),
      });
      await disable(tenantId, endpoint, why, endpoint.consecutive_failures);
      return failed;
    }
    // a secret rotated a while ago signs beside the new one until it expires: a receiver with either verifies
    // (Standard Webhooks: signatures space apart, any one that matches will do)
    const previous = previousSecret(tenantId, endpoint, at);
    const signature = [secret, ...(previous ? [previous] : [])].map((s) => new Webhook(s).sign(d.id, at, body)).join(' ');
    const headers = {
      'content-type': 'application/json',
      'user-agent': 'automation-service-notifications',
      'webhook-id': d.id,
      'webhook-timestamp': String(Math.floor(at.getTime() / 1000)),
      'webhook-signature': signature,
    };
    // the try is in the record before it is made, as cut off: a process that dies (or stops) during the POST leaves
    // it so, where the endpoint may have received it, and its answer takes its place. Not made when the delivery
    // changed since it was read (a replay took it over: its own job sends it)
    const cutOff = { at: at.toISOString(), status_code: null, error: TRY_CUT_OFF, duration_ms: 0 };
    const begun = await store.notificationDeliveries.update(
      tenantId,
      d.id,
      { attempts: keptTries(d.attempts, cutOff), updated_at: at.toISOString() },
      { replays: d.replays, status: ['pending'] },
    );
    if (!begun) return store.notificationDeliveries.get(tenantId, d.id);
    const started = Date.now();
    // stopped as this process shuts down (interruptAll): not a try; the job goes back to the queue and sends it again
    // with the same webhook-id (within the grace period: otherwise the exit cut it off, and its job spent its one stall)
    const stop = new AbortController();
    const mine = sending.get(d.id) ?? sending.set(d.id, new Set()).get(d.id)!;
    mine.add(stop);
    let sent: Awaited<ReturnType<typeof post>>;
    try {
      sent = await post(new URL(endpoint.url), headers, body, stop.signal);
    } finally {
      mine.delete(stop);
      if (!mine.size) sending.delete(d.id);
    }
    if (stop.signal.aborted) return 'interrupted';
    const attempts = keptTries(d.attempts, { at: at.toISOString(), ...sent, duration_ms: Date.now() - started });
    if (!sent.error) {
      const done = await store.notificationDeliveries.update(tenantId, d.id, { status: 'succeeded', attempts, updated_at: clock.now().toISOString() });
      // whatever the endpoint read before the try said: a try that failed while this one waited is before it
      await store.notificationEndpoints.resetFailures(tenantId, endpoint.id);
      return done;
    }
    await store.notificationDeliveries.update(tenantId, d.id, { status: last ? 'failed' : 'pending', attempts, updated_at: clock.now().toISOString() });
    if (!last) throw new Error(`delivery ${d.id} to ${endpoint.id}: ${sent.error}`);
    const counted = await store.notificationEndpoints.addFailure(tenantId, endpoint.id, clock.now().toISOString());
    if (counted && counted.status === 'enabled' && counted.consecutive_failures >= settings.disableAfter)
      await disable(tenantId, endpoint, `${counted.consecutive_failures} deliveries in a row failed (the last: ${sent.error})`, counted.consecutive_failures);
    return null;
  }

  /** The secret an endpoint had before its last rotation while it still signs at `at`; null when none does (or it does not open). */
  function previousSecret(tenantId: string, endpoint: NotificationEndpoint, at: Date): string | null {
    const until = endpoint.previous_secret_expires_at;
    if (!endpoint.previous_sealed_secret || !until || Date.parse(until) <= at.getTime()) return null;
    try {
      return secretBox.open(endpoint.previous_sealed_secret, owner(tenantId, endpoint.id));
    } catch {
      return null;
    }
  }

  const repairStale = staleJobRepair<NotificationDelivery, Pick<NotificationDelivery, 'updated_at' | 'id'>>({
    queue: () => queues.get('notifications'),
    read: (before, after, limit) => store.notificationDeliveries.listStalePending(before, limit, after),
    cursorOf: (d) => ({ updated_at: d.updated_at, id: d.id }),
    jobIdOf: jobId,
    enqueue,
  });

  /** Queues stored deliveries; one the queue refuses is the reconciler's. */
  async function queueAll(deliveries: NotificationDelivery[]): Promise<void> {
    const queued = await Promise.allSettled(deliveries.map(enqueue));
    for (const [i, r] of queued.entries())
      if (r.status === 'rejected')
        log.warn(
          { tenant_id: deliveries[i]!.tenant_id, delivery_id: deliveries[i]!.id, err: (r.reason as Error).message },
          'notification delivery stored, not queued: the reconciler queues it',
        );
  }

  /**
   * Stores again, 0.25 s later and then twice as late each time (about a minute in all), deliveries the store
   * refused; one found stored already (its insert had landed) is not stored twice. Those still refused after
   * the last try are lost, and logged as such.
   */
  function storeLater(deliveries: NotificationDelivery[], tried: number): void {
    setTimeout(
      async () => {
        const left: NotificationDelivery[] = [];
        const stored: NotificationDelivery[] = [];
        for (const d of deliveries) {
          try {
            if (!(await store.notificationDeliveries.get(d.tenant_id, d.id))) await store.notificationDeliveries.insert(d);
            stored.push(d);
          } catch {
            left.push(d);
          }
        }
        await queueAll(stored);
        if (!left.length) return;
        if (tried + 1 < STORE_TRIES) return storeLater(left, tried + 1);
        log.error({ tenant_id: left[0]!.tenant_id, delivery_ids: left.map((d) => d.id) }, 'notifications not made: the store refused them');
      },
      STORE_RETRY_MS * 2 ** tried,
    ).unref();
  }

  /**
   * Makes a delivery of an event for each of its tenant's endpoints that subscribe to its type, each stored and
   * then queued. Its id is made of the endpoint's and the event's, so an event offered again makes none twice. A
   * delivery the store refuses is stored later (storeLater); `stored` says whether all were stored now.
   */
  async function deliveriesOf(event: ServiceEvent, version?: Promise<string | undefined>): Promise<{ endpoints: number; stored: boolean }> {
    const type = outboundType(event.type);
    if (!type) return { endpoints: 0, stored: true };
    const endpoints = (await enabledOf(event.tenant_id, version)).filter((e) => subscribes(e.event_types, type));
    const now = clock.now().toISOString();
    // an id of the endpoint and the event: the same event offered again (its run's end told again after its
    // process died between the event and its deliveries) makes no delivery twice
    const at = Date.parse(event.at);
    const told = endpoints.length ? canonicalJson(event) : '';
    const deliveries = endpoints.map((e): NotificationDelivery => ({
      id: Number.isFinite(at) ? idOf('ntf', at, `${e.id}\n${told}`) : newId('ntf'),
      tenant_id: event.tenant_id,
      endpoint_id: e.id,
      event_type: type,
      payload: {
        type,
        timestamp: event.at,
        data: { ...(event.run_id ? { run_id: event.run_id } : {}), ...(event.session_id ? { session_id: event.session_id } : {}), ...event.data },
      },
      status: 'pending',
      attempts: [],
      replays: 0,
      created_at: now,
      updated_at: now,
    }));
    // all stored first (asked together, one group commit): a stored delivery is the reconciler's to queue
    // again, so a queue that refuses one job loses none of them, and does not keep the others from theirs
    const stored = await Promise.allSettled(deliveries.map((d) => store.notificationDeliveries.insert(d)));
    const unstored = deliveries.filter((_, i) => stored[i]!.status === 'rejected');
    await queueAll(deliveries.filter((_, i) => stored[i]!.status === 'fulfilled'));
    // a store that refused them for a moment (busy, a failover) is asked again, while the event goes on
    if (unstored.length) {
      log.warn(
        { tenant_id: event.tenant_id, type, err: (stored.find((r) => r.status === 'rejected') as PromiseRejectedResult).reason?.message },
        'notification deliveries not stored yet: trying again',
      );
      storeLater(unstored, 0);
    }
    return { endpoints: endpoints.length, stored: !unstored.length };
  }

  /**
   * Offers again the events of the outbox noted over STALE_AFTER_MS ago: their process died (or the store refused
   * their deliveries) before they were all stored. One whose log no longer holds it has nothing left to offer.
   */
  async function offerNoted(): Promise<number> {
    if (!events) return 0;
    const eventLog = events;
    const due = await redis.zrangebyscore(outboxKey, '-inf', clock.now().getTime() - STALE_AFTER_MS, 'LIMIT', 0, OUTBOX_PER_PASS);
    let offered = 0;
    for (let i = 0; i < due.length; i += OUTBOX_AT_ONCE) {
      const done = await Promise.allSettled(
        due.slice(i, i + OUTBOX_AT_ONCE).map(async (member) => {
          const { scope, id } = outboxEntry(member);
          const [event] = await eventLog.newestFirst(scope, '0-0', id, 1);
          if (event?.id === id) {
            if (!(await deliveriesOf(event)).stored) return;
            offered++;
          }
          await unnote(member);
        }),
      );
      // one that failed (the store, Redis) keeps its note for the next pass; the others go on
      const failed = done.find((d) => d.status === 'rejected');
      if (failed) log.warn({ err: (failed.reason as Error).message }, 'an event of the notifications outbox was not offered again; the next pass tries it');
    }
    return offered;
  }

  const api = {
    /** Makes an endpoint; `secret` is the only time the signing secret exists in clear outside the store. */
    async create(tenantId: string, input: EndpointInput): Promise<{ endpoint: NotificationEndpoint; secret: string }> {
      const errors = problemsOf(input);
      if (errors.length) throw new ValidationError('the endpoint is not valid', errors);
      // the count read here answers most at once; the insert's own check is the one that holds when creates race
      const max = settings.maxEndpoints;
      if ((await store.notificationEndpoints.list(tenantId)).length >= max) throw tooMany(max);
      await assertPublicHost(new URL(input.url), settings.httpAllowPrivate);
      const now = clock.now().toISOString();
      const id = newId('nep');
      const secret = newSecret();
      const endpoint: NotificationEndpoint = {
        id,
        tenant_id: tenantId,
        url: input.url,
        description: input.description ?? null,
        event_types: [...new Set(input.event_types)],
        status: 'enabled',
        disabled_reason: null,
        consecutive_failures: 0,
        sealed_secret: secretBox.seal(secret, owner(tenantId, id)),
        created_at: now,
        updated_at: now,
      };
      if ((await store.notificationEndpoints.insert(endpoint, { maxHeld: max })) === 'over-cap') throw tooMany(max);
      await changed(tenantId);
      log.info({ tenant_id: tenantId, endpoint_id: id }, 'notification endpoint created');
      return { endpoint, secret };
    },

    list: (tenantId: string) => store.notificationEndpoints.list(tenantId),
    get: must,

    async update(tenantId: string, id: string, patch: EndpointPatch): Promise<NotificationEndpoint> {
      await must(tenantId, id);
      const errors = problemsOf(patch);
      if (errors.length) throw new ValidationError('the endpoint would not be valid', errors);
      if (patch.url !== undefined) await assertPublicHost(new URL(patch.url), settings.httpAllowPrivate);
      const changes: NotificationEndpointChanges = { updated_at: clock.now().toISOString() };
      if (patch.url !== undefined) changes.url = patch.url;
      if (patch.description !== undefined) changes.description = patch.description;
      if (patch.event_types !== undefined) changes.event_types = [...new Set(patch.event_types)];
      if (patch.status !== undefined) {
        changes.status = patch.status;
        // enabled again by hand: its count of failures starts over
        changes.disabled_reason = patch.status === 'disabled' ? 'disabled by request' : null;
        if (patch.status === 'enabled') changes.consecutive_failures = 0;
      }
      const next = await store.notificationEndpoints.update(tenantId, id, changes);
      if (!next) throw new NotFoundError(`no notification endpoint ${id}`);
      await changed(tenantId);
      return next;
    },

    /**
     * A new signing secret, shown this once; the one it replaces still signs beside it for `keepPreviousSeconds`
     * (none when 0, or when it does not open: SERVICE_SECRET_KEY changed). Of two rotations at once, one is made.
     */
    async rotateSecret(tenantId: string, id: string, keepPreviousSeconds = KEEP_PREVIOUS_SECONDS): Promise<{ endpoint: NotificationEndpoint; secret: string }> {
      const endpoint = await must(tenantId, id);
      let opens = true;
      try {
        secretBox.open(endpoint.sealed_secret, owner(tenantId, id));
      } catch {
        opens = false;
      }
      const now = clock.now();
      const secret = newSecret();
      const keep = opens && keepPreviousSeconds > 0;
      const rotated = await store.notificationEndpoints.rotateSecret(tenantId, id, endpoint.sealed_secret, {
        sealed_secret: secretBox.seal(secret, owner(tenantId, id)),
        secret_rotated_at: now.toISOString(),
        previous_sealed_secret: keep ? endpoint.sealed_secret : null,
        previous_secret_expires_at: keep ? new Date(now.getTime() + keepPreviousSeconds * 1000).toISOString() : null,
        updated_at: now.toISOString(),
      });
      if (!rotated) {
        if (!(await store.notificationEndpoints.get(tenantId, id))) throw new NotFoundError(`no notification endpoint ${id}`);
        throw new ConflictError(`the secret of endpoint ${id} was rotated by another request meanwhile; its secret is the one that request was shown`);
      }
      await changed(tenantId);
      log.info({ tenant_id: tenantId, endpoint_id: id, keep_previous_seconds: keep ? keepPreviousSeconds : 0 }, 'notification endpoint secret rotated');
      return { endpoint: rotated, secret };
    },

    async remove(tenantId: string, id: string): Promise<void> {
      if (!(await store.notificationEndpoints.delete(tenantId, id))) throw new NotFoundError(`no notification endpoint ${id}`);
      await changed(tenantId);
    },

    async deliveries(tenantId: string, endpointId: string, q: { limit: number; cursor?: string }): Promise<Page<NotificationDelivery>> {
      await must(tenantId, endpointId);
      return store.notificationDeliveries.list(tenantId, endpointId, q);
    },

    /** Sends a delivery again, with the same webhook-id (a receiver that kept it sees a repeat). */
    async replay(tenantId: string, deliveryId: string): Promise<NotificationDelivery> {
      const d = await store.notificationDeliveries.get(tenantId, deliveryId);
      if (!d) throw new NotFoundError(`no notification delivery ${deliveryId}`);
      if (d.status === 'pending') throw new ConflictError(`delivery ${deliveryId} is still being sent`);
      const endpoint = await must(tenantId, d.endpoint_id);
      if (endpoint.status !== 'enabled') throw new ConflictError(`endpoint ${endpoint.id} is disabled; enable it first`);
      // as it was read: of two replays that read it at once, one sends it again (the other's job, of the same id, was
      // taken for the first's once that had completed, and the delivery stayed pending for good)
      const next = await store.notificationDeliveries.update(
        tenantId,
        deliveryId,
        { status: 'pending', replays: d.replays + 1, updated_at: clock.now().toISOString() },
        { replays: d.replays, status: ['succeeded', 'failed'] },
      );
      if (!next) throw new ConflictError(`delivery ${deliveryId} is being sent again already`);
      await enqueue(next);
      return next;
    },

    /** Makes a delivery of an event for each of its tenant's endpoints that subscribe to its type (see deliveriesOf); how many. */
    notify: async (event: ServiceEvent): Promise<number> => (await deliveriesOf(event)).endpoints,

    /**
     * One try of a delivery (the notifications queue's job). Throws when it failed and BullMQ will try
     * again; on the last try, the failure counts against the endpoint, which may be disabled. `busy`: its
     * tenant has SERVICE_NOTIFY_TENANT_CONCURRENCY tries in flight; no try was made, and none is counted.
     * `interrupted`: this process shut down during the POST (interruptAll); it is not counted as a try either.
     */
    async deliver(tenantId: string, deliveryId: string, last: boolean): Promise<NotificationDelivery | null | 'busy' | 'interrupted'> {
      // the tenant's place first: a delivery that waits for one costs a script, not reads and a signature
      const place = inFlight(tenantId);
      const now = Date.now();
      if (!(await redis.notifyTakePlace(place, now, now + settings.timeoutMs + 10_000, settings.tenantConcurrency, deliveryId))) return 'busy';
      try {
        return await deliverInPlace(tenantId, deliveryId, last);
      } finally {
        await redis.zrem(place, deliveryId).catch(() => undefined);
      }
    },

    /** Stops every POST this process is making, as it shuts down (their jobs go back to the queue, no try spent); how many. */
    interruptAll: (): number => interruptEvery(sending),

    /**
     * Repairs deliveries left pending whose job is gone (the process died between storing and queueing, Redis lost
     * its data) or ran out of tries on an error of the service's own.
     * Deletes ended deliveries past their retention.
     */
    async reconcile(): Promise<{ requeued: number; retried: number; errors: number }> {
      // pending for a little while: whether its job is there is what tells (one waiting out its backoff is), not the
      // time all its tries could take (23 minutes by default, which a delivery whose job Redis lost waited)
      const done = await repairStale(new Date(clock.now().getTime() - STALE_AFTER_MS).toISOString());
      if (done.requeued || done.retried || done.errors) log.warn(done, 'reconciler repaired notification deliveries');
      const offered = await offerNoted();
      if (offered) log.warn({ events: offered }, 'reconciler made the notifications of events whose process had not made them all');
      // ended deliveries are kept SERVICE_NOTIFICATION_DELIVERIES_KEPT_DAYS after their last try: a page at a time, within a bound
      const expired = new Date(clock.now().getTime() - settings.deliveriesKeptDays * 86_400_000).toISOString();
      await pruneInPages((limit) => store.notificationDeliveries.prune(expired, limit));
      return done;
    },

    /**
     * The event log every capability writes through: each event appended is also offered to the
     * tenant's endpoints. A failure to make its deliveries is logged; the event itself stands, and one noted in the
     * outbox (its tenant's endpoints may subscribe to it) is offered again by the reconciler until they are made.
     */
    wrap(inner: EventLog): EventLog {
      const offer = async <E extends ServiceEvent | null>(
        stored: E,
        scope: string,
        noted: EventOutbox | undefined,
        version?: Promise<string | undefined>,
      ): Promise<E> => {
        if (!stored || !outboundType(stored.type)) return stored;
        try {
          // all stored: the note is done with (a note left is offered again by the reconciler, and makes nothing twice)
          if ((await deliveriesOf(stored, version)).stored && noted) void unnote(outboxMember(scope, stored.id)).catch(() => undefined);
        } catch (err) {
          log.error(
            { tenant_id: stored.tenant_id, type: stored.type, err: (err as Error).message },
            noted ? 'notifications not made yet: the reconciler makes them' : 'notifications not made',
          );
        }
        return stored;
      };
      events = {
        ...inner,
        // an event that may have deliveries is noted in the outbox with its append (one script): a process that dies
        // before they are stored leaves it there for the reconciler. Decided without waiting, to keep appends in order.
        // The endpoints' version is asked for right after the append (the log asks for it as it is called, on the same
        // connection's batch): read in the same script call, after the event, not in a round trip after it
        append: (scope, event) => {
          const type = outboundType(event.type);
          const noted = type && mayDeliver(event.tenant_id, type) ? { key: outboxKey, at: clock.now().getTime() } : undefined;
          const appended = inner.append(scope, event, noted);
          const version = type ? versionOf(event.tenant_id) : undefined;
          return appended.then((stored) => offer(stored, scope, noted, version));
        },
        // what spends a budget (a step's output, a message) is never an outbound type
        appendWithin: async (scope, event, budget) => offer(await inner.appendWithin(scope, event, budget), scope, undefined),
      };
      return events;
    },
  };
  return api;
}
