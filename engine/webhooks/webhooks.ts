// Webhook intake: tenant secrets (sealed at rest), verification, replay and duplicate checks, the
// delivery outbox (stored before it is acknowledged, then matched by a job) and replays on request.
import type { Platform } from '../deps.js';
import {
  ConflictError,
  NotFoundError,
  PayloadTooLargeError,
  RateLimitedError,
  WebhookRejectedError,
  AppError,
  newId,
  redisBatch,
  redisOrUnavailable,
  afterStored,
  staleJobRepair,
  pruneInPages,
  type RunTrigger,
  type WebhookDelivery,
  type WebhookProvider,
  type WebhookSecretRecord,
} from '../platform/index.js';
import type { DeliveryQuery } from '../store/index.js';
import { serviceKey } from '../runs/index.js';
import { checkHeaders, eventMatches, keptHeaders, sha256Hex, verifyDelivery, windowOf, type Headers, type Verified } from './verify.js';

/** Email carries attachments; everything else is small. */
export const BODY_LIMIT_BYTES: Record<WebhookProvider, number> = {
  codehost: 1024 * 1024,
  chat: 1024 * 1024,
  tracker: 1024 * 1024,
  pager: 1024 * 1024,
  email: 25 * 1024 * 1024,
  generic: 1024 * 1024,
};

/** How long one process trusts its copy of a tenant's secrets; changes made in this process apply at once. */
const SECRET_CACHE_MS = 5000;
const STALE_AFTER_MS = 30_000;
/**
 * How many refused requests of a tenant are recorded a minute (the rest are answered and not kept). It was the
 * delivery limit (1,200 a minute by default): anyone who knows a tenant's intake URL could have it keep 12 million
 * records a week, some 10 KB each, and the store's writes wait on their pruning.
 */
export const REJECTED_RECORDED_PER_MINUTE = 60;
/** How much of each kept header a refused request's record keeps (an accepted delivery's: 512 characters). */
const REJECTED_HEADER_CHARS = 128;
/** How long a refused request's record is kept (its metadata only: a tenant sees who knocked, for a week). */
export const REJECTED_KEPT_MS = 7 * 86_400_000;

type Fire = (
  tenantId: string,
  automationId: string,
  trigger: RunTrigger,
  idempotencyKey: string,
  inputs: Record<string, unknown>,
) => Promise<{ id: string } | null>;

export type Receipt = {
  status: number;
  /** absent: answer with no body (Slack shows a command's response body to the user) */
  body?: Record<string, unknown>;
  delivery_id?: string;
};

type TenantSecrets = { at: number; known: boolean; byKind: Map<WebhookProvider, string[]> };

// One operation of the engine's Redis batch per request (requests of one event-loop turn share a round
// trip): refused when the tenant's minute is spent; else (when a signed request has a replay key) what
// was signed is remembered, and a request whose key is already claimed is not counted: a replay (409), or
// the resend of a provider that retries with the same bytes (PagerDuty, Linear), answered from the store
// as its event's duplicate. A captured delivery sent again and again must not spend the budget of the
// real ones (a PagerDuty body signs no time: counted, it would hold its tenant at 429 for good); else it
// counts against the minute.
// Answers [1, 0] go on, [0, ms until the minute ends] rate-limited, [2, 0] seen before. Seen keys are only
// written for requests within the limit.
const GATE = `if tonumber(redis.call('GET', KEYS[1]) or '0') >= tonumber(ARGV[2]) then return {0, redis.call('PTTL', KEYS[1])} end
if ARGV[3] ~= '0' and not redis.call('SET', KEYS[2], '1', 'EX', ARGV[3], 'NX') then return {2, 0} end
if redis.call('INCR', KEYS[1]) == 1 then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
return {1, 0}`;

export const jobIdOfDelivery = (deliveryId: string) => `delivery-${deliveryId}`;

/**
 * How long a signed request's replay claim is held before its delivery is stored. Once stored, the claim is
 * held for the whole replay window; a process that dies in between (after the claim, before its commit) must not
 * leave the provider's retry of a delivery never stored refused as a replay for the window (10 minutes).
 */
export const WEBHOOK_CLAIM_SECONDS = 30;

export type WebhookSettings = {
  webhookReplayWindowSeconds: number;
  webhookRateLimitPerMinute: number;
  /** days an accepted delivery's body and event are kept after it was received; 0 or absent: for good */
  webhookDeliveriesKeptDays?: number;
};

export type WebhooksDeps = Pick<Platform, 'store' | 'clock' | 'log' | 'queues' | 'secretBox' | 'redis' | 'metrics'> & { settings: WebhookSettings };

export function webhooksOf(deps: WebhooksDeps, fire: Fire) {
  const { store, clock, log, queues, secretBox, redis } = deps;
  const { webhookReplayWindowSeconds: windowSeconds, webhookRateLimitPerMinute: perMinute, webhookDeliveriesKeptDays: keptDays } = deps.settings;
  const prefix = queues.prefix;
  const cache = new Map<string, TenantSecrets>();
  const batch = redisBatch(redis);
  batch.define('webhook.gate', { keys: 2, args: 3, lua: GATE });
  const owner = (tenantId: string, kind: WebhookProvider) => `webhook-secret:${tenantId}:${kind}`;

  async function secretsOf(tenantId: string): Promise<TenantSecrets> {
    const cached = cache.get(tenantId);
    if (cached && Date.now() - cached.at < SECRET_CACHE_MS) return cached;
    const records = await store.webhookSecrets.list(tenantId);
    const byKind = new Map<WebhookProvider, string[]>();
    for (const r of records) {
      try {
        byKind.set(
          r.kind,
          r.sealed.map((s) => secretBox.open(s, owner(tenantId, r.kind))),
        );
      } catch {
        // sealed under another key (SERVICE_SECRET_KEY changed) or altered: the kind cannot verify anything
        log.error(
          { tenant_id: tenantId, kind: r.kind },
          'a webhook secret does not open with SERVICE_SECRET_KEY; set it again with PUT /api/v1/webhook-secrets/{kind}',
        );
      }
    }
    // a tenant exists once it has an API key; secrets can only be set with one (one key read, not all of them:
    // a tenant's revoked and expired keys stay listed, and this is asked for anyone's request)
    const known = records.length > 0 || (await store.apiKeys.page(tenantId, { limit: 1 })).items.length > 0;
    const entry = { at: Date.now(), known, byKind };
    cache.set(tenantId, entry);
    if (cache.size > 10_000) cache.delete(cache.keys().next().value!);
    return entry;
  }

  /**
   * Counts a request in one of its tenant's per-minute counters (`rate`: verified requests; `refused`:
   * those refused), claiming a replay key for `seenSeconds` if one is given: the gate's verdict and, past
   * the limit, the time left in the minute.
   */
  function countThisMinute(counter: 'rate' | 'refused', tenantId: string, seenKey: string | null, seenSeconds: number) {
    const limit = counter === 'rate' ? perMinute : Math.min(perMinute, REJECTED_RECORDED_PER_MINUTE);
    const now = clock.now().getTime();
    const bucket = Math.floor(now / 60_000);
    // the counter lapses as its minute ends (and a second more, for the clocks of other processes): its time to
    // live is the Retry-After of a refusal, and was 61 s from the minute's first request (up to a minute too long)
    return batch.call<[number, number]>(
      'webhook.gate',
      [`${prefix}:webhook-${counter}:${tenantId}:${bucket}`, seenKey ?? `${prefix}:webhook-seen:-`],
      [(bucket + 1) * 60_000 - now + 1000, limit, seenKey ? seenSeconds : 0],
    );
  }

  /**
   * Counts a verified request against its tenant's per-minute limit, over all kinds, and claims its
   * replay key if it has one: false, and not counted, when that key was already claimed (a replay, or a
   * provider's resend, which goes on to be answered as its event's duplicate).
   */
  async function gate(tenantId: string, kind: WebhookProvider, seenKey: string | null): Promise<boolean> {
    // claimed until the delivery is stored (then remembered for the window: `remember`). Without Redis
    // the delivery is refused (503: the provider sends it again), and a claim Redis takes later is given back,
    // or the provider's retry would be refused as a replay of a delivery never stored
    const [verdict, ttlMs] = await redisOrUnavailable(
      redis,
      'checking the delivery',
      () => countThisMinute('rate', tenantId, seenKey, WEBHOOK_CLAIM_SECONDS),
      (late) => void late.then(([claimed]) => (claimed === 1 && seenKey ? redis.del(seenKey) : 0)).catch(() => undefined),
    );
    if (verdict === 0) {
      deps.metrics.webhookRequests.inc({ kind, outcome: 'rate-limited' });
      throw new RateLimitedError(
        `this tenant sent more than ${perMinute} webhook requests this minute`,
        Math.max(1, Math.ceil(Math.min(ttlMs, 60_000) / 1000)),
      );
    }
    return verdict === 1;
  }

  /**
   * Remembers a stored delivery's signature for as long as it stays valid, a window either side of its
   * timestamp. Not waited for: were Redis to miss it, the store still knows the delivery (a replay of it is
   * refused there, as after Redis lost its data).
   */
  function remember(kind: WebhookProvider, seenKey: string): void {
    redis
      .set(seenKey, '1', 'EX', windowOf(kind, windowSeconds) * 2 + 1)
      .catch((err: Error) => log.warn({ err: err.message }, 'a webhook replay claim was not extended'));
  }

  /** Counts a refused request against its tenant's minute of refusals (the same number as the limit); false past it. */
  async function refusalsWithinLimit(tenantId: string): Promise<boolean> {
    // without Redis, refusals are answered and not recorded
    const counted = await redisOrUnavailable(redis, 'counting a refusal', () => countThisMinute('refused', tenantId, null, 0)).catch(() => null);
    return counted !== null && counted[0] !== 0;
  }

  const secretView = (r: WebhookSecretRecord) => ({ kind: r.kind, secret_count: r.sealed.length, created_at: r.created_at, updated_at: r.updated_at });

  async function enqueue(d: Pick<WebhookDelivery, 'id' | 'tenant_id'>): Promise<void> {
    await queues.get('webhooks').add(
      'delivery',
      { delivery_id: d.id, tenant_id: d.tenant_id },
      {
        jobId: jobIdOfDelivery(d.id),
        attempts: 5,
        backoff: { type: 'exponential', delay: 1000 },
        removeOnComplete: { count: 1000 },
        removeOnFail: { count: 5000 },
      },
    );
  }

  async function recordRejection(tenantId: string, kind: WebhookProvider, headers: Headers, size: number, err: WebhookRejectedError): Promise<void> {
    const now = clock.now().toISOString();
    const kept = keptHeaders(headers, REJECTED_HEADER_CHARS);
    await store.deliveries
      .insert({
        id: newId('whd'),
        tenant_id: tenantId,
        kind,
        status: 'rejected',
        event: null,
        action: null,
        provider_delivery_id: null,
        headers: kept,
        content_type: kept['content-type'] ?? null,
        body: null,
        body_size: size,
        body_sha256: null,
        event_payload: null,
        rejection: { code: err.code, message: err.message },
        runs: [],
        attempts: 0,
        error: null,
        received_at: now,
        processed_at: null,
      })
      .catch((e: unknown) => log.warn({ err: (e as Error).message }, 'could not record a rejected webhook'));
  }

  /** What a kind with no usable secret for the tenant (or a tenant that does not exist) is answered. */
  const notConfigured = (kind: WebhookProvider) =>
    new WebhookRejectedError('webhook-not-configured', `no usable ${kind} secret is set for this tenant: PUT /api/v1/webhook-secrets/${kind}`);

  /**
   * Starts the runs of every enabled automation whose webhook trigger takes this delivery. `transient` is
   * the first failure worth a retry (Redis or the store did not answer, the run's key still being handled):
   * the others are started all the same, and a retry with the same attempt finds their runs by their keys,
   * or in `startedBefore` (the runs an earlier try of the attempt kept with the delivery).
   */
  async function dispatch(
    d: WebhookDelivery,
    attempt: number,
    startedBefore: WebhookDelivery['runs'] = [],
  ): Promise<Pick<WebhookDelivery, 'runs' | 'error'> & { transient: AppError | null }> {
    const automations = await store.automations.listEnabledWithTrigger('webhook', d.tenant_id);
    const runs: WebhookDelivery['runs'] = [];
    let error: WebhookDelivery['error'] = null;
    let transient: AppError | null = null;
    for (const a of automations) {
      const takes = a.triggers.some((t) => t.type === 'webhook' && t.provider === d.kind && eventMatches(t.events, d.event, d.action));
      if (!takes) continue;
      // started by an earlier try of this attempt (recorded when another automation's run failed transiently):
      // not started again, however long ago (its run's key lives a day)
      const started = startedBefore.find((r) => r.automation_id === a.id);
      if (started) {
        runs.push(started);
        continue;
      }
      const trigger: RunTrigger = { type: 'webhook', provider: d.kind, delivery_id: d.id, ...(d.event ? { event: d.event } : {}) };
      try {
        const run = await fire(d.tenant_id, a.id, trigger, serviceKey(`webhook:${d.id}:${attempt}:${a.id}`), { event: d.event_payload });
        if (run) runs.push({ automation_id: a.id, run_id: run.id });
      } catch (err) {
        if (!(err instanceof AppError)) throw err;
        if (err.retryable) transient ??= err;
        // the automation cannot run as defined (no agent endpoint, a bad budget): say so, start the others
        error = { code: err.code, message: `automation ${a.id}: ${err.message}` };
      }
    }
    return { runs, error, transient };
  }

  const repairStale = staleJobRepair<WebhookDelivery, Pick<WebhookDelivery, 'received_at' | 'id'>>({
    queue: () => queues.get('webhooks'),
    read: (before, after, limit) => store.deliveries.listStale('received', before, limit, after),
    cursorOf: (d) => ({ received_at: d.received_at, id: d.id }),
    jobIdOf: (d) => jobIdOfDelivery(d.id),
    enqueue,
  });

  return {
    /** Verifies, de-duplicates and stores one request; the answer to give the provider. */
    async receive(tenantId: string, kind: WebhookProvider, headers: Headers, body: Buffer): Promise<Receipt> {
      const tenant = await secretsOf(tenantId);
      // a tenant that does not exist answers as one with no secret for the kind: the intake, open to anyone,
      // does not tell which tenants exist (nothing is recorded for it: there is no tenant to record it for)
      if (!tenant.known) {
        deps.metrics.webhookRequests.inc({ kind, outcome: 'webhook-not-configured' });
        throw notConfigured(kind);
      }
      const count = (outcome: string) => deps.metrics.webhookRequests.inc({ kind, outcome });
      if (body.length > BODY_LIMIT_BYTES[kind]) throw new PayloadTooLargeError(`the body is over the ${BODY_LIMIT_BYTES[kind] / 1024 / 1024} MB limit`);

      let verified: Verified;
      let delivery: WebhookDelivery;
      /** the replay claim this request took, until its delivery is stored (then remembered) or given back */
      let claimed: string | null = null;
      /** renews the claim while this request stores its delivery (stopped before it is remembered or given back) */
      let holding: NodeJS.Timeout | undefined;
      const stopHolding = () => clearInterval(holding);
      try {
        try {
          const secrets = tenant.byKind.get(kind);
          if (!secrets?.length) throw notConfigured(kind);
          verified = await verifyDelivery(kind, { headers, body }, { secrets, nowMs: clock.now().getTime(), windowSeconds });
          // ids are short in practice; a longer one is cut, never allowed to bloat the unique index. A request
          // with no id (a slash command, our generic scheme without X-Service-Delivery) is known by its signed
          // bytes, so the store finds its replay too once Redis has forgotten the signature (it loses its data).
          // The digest of what was signed is kept with every delivery that has one: a request whose id the
          // signature does not cover is looked for by it, whatever id the delivery it replays was stored under
          const signedDigest = verified.replayKey ? sha256Hex(verified.replayKey) : null;
          /** the delivery's id in the store: the provider's, or for a request that names none, what was signed */
          const providerId = verified.providerId ? verified.providerId.slice(0, 256) : signedDigest ? `signed:${signedDigest}` : null;
          const seenKey = signedDigest ? `${prefix}:webhook-seen:${tenantId}:${kind}:${signedDigest}` : null;
          const fresh = await gate(tenantId, kind, seenKey);
          // renewed while this process has the request, so a store slower than the claim (a lock held, a failover)
          // does not let a replay in meanwhile; a process that dies stops renewing, and the claim lapses
          if (fresh && seenKey) {
            const key = (claimed = seenKey);
            holding = setInterval(() => void redis.expire(key, WEBHOOK_CLAIM_SECONDS).catch(() => undefined), (WEBHOOK_CLAIM_SECONDS * 1000) / 3).unref();
          }
          // a provider that retries with the same bytes (PagerDuty, Linear) sends its event's id again: the
          // store's answer for that id (a duplicate, acknowledged) is the one to give, not a replay's 409
          const resent = !fresh && Boolean(verified.retriesResend && verified.providerId);
          if (!fresh && !resent) throw new WebhookRejectedError('webhook-replay', 'this signed request was already accepted');
          // Redis remembers a signature for the window (and forgets it if Redis loses its data); a body whose
          // delivery id is not signed (GitHub, Linear) is looked for in the store: seen there, it is the same
          // delivery again (a byte-for-byte retry, the same id) or a replay under another id. A resend, not
          // counted, is answered from there too, by a read
          if (verified.signedOnce || resent) {
            const earlier = await store.deliveries.findByBody(tenantId, kind, sha256Hex(body));
            if (earlier && verified.repeatIs === 'retry' && earlier.provider_delivery_id === providerId) {
              count('duplicate');
              return { status: 200, delivery_id: earlier.id, body: verified.emptyReply ? undefined : { delivery_id: earlier.id, status: 'duplicate' } };
            }
            if (earlier) throw new WebhookRejectedError('webhook-replay', 'this signed body was already accepted');
            // claimed by a request still being stored: whatever id this one names, it is not a new delivery (a
            // resend whose id is in what was signed (PagerDuty's) goes on: the insert finds that id's delivery)
            if (!fresh && verified.signedOnce) throw new WebhookRejectedError('webhook-replay', 'this signed request is being accepted');
          }
          // an id the signature does not cover (our X-Service-Delivery, Mailgun's Message-Id) can be changed, added
          // or dropped by whoever captured the request: what was signed, found in the store, is a replay under any id
          // once Redis has lost its claims (as Redis says within the window: these schemes sign each try anew, so
          // the same signed bytes are never a retry)
          if (verified.idUnsigned && signedDigest && (await store.deliveries.findBySigned(tenantId, kind, signedDigest)))
            throw new WebhookRejectedError('webhook-replay', 'this signed request was already accepted');
          if (verified.handshake) {
            count('handshake');
            return { status: 200, body: verified.handshake };
          }

          const kept = keptHeaders(headers);
          delivery = {
            id: newId('whd'),
            tenant_id: tenantId,
            kind,
            status: 'received',
            event: verified.event,
            action: verified.action,
            provider_delivery_id: providerId,
            headers: kept,
            content_type: kept['content-type'] ?? null,
            body: verified.keepBody ? body.toString('utf8') : null,
            body_size: body.length,
            body_sha256: sha256Hex(body),
            ...(signedDigest ? { signed_sha256: signedDigest } : {}),
            event_payload: verified.event_payload,
            rejection: null,
            runs: [],
            attempts: 0,
            error: null,
            received_at: clock.now().toISOString(),
            processed_at: null,
          };
          const existing = await store.deliveries.insert(delivery);
          stopHolding();
          if (claimed) remember(kind, claimed);
          // stored, or its id found stored: the claim is no longer this request's to give back
          claimed = null;
          if (existing) {
            // the same signed request of no id again: a replay, as Redis would have said had it remembered
            if (verified.repeatIs === 'replay' || !verified.providerId)
              throw new WebhookRejectedError('webhook-replay', `delivery ${providerId} was already accepted as ${existing.id}`);
            count('duplicate');
            return { status: 200, delivery_id: existing.id, body: verified.emptyReply ? undefined : { delivery_id: existing.id, status: 'duplicate' } };
          }
        } catch (err) {
          if (err instanceof WebhookRejectedError) {
            count(err.code);
            // a refused request is answered as such, never rate-limited: anyone can send unsigned ones, and they
            // must not spend the budget of the tenant's real deliveries. They have a budget of their own for
            // being recorded: past it they are answered and not stored
            if (await refusalsWithinLimit(tenantId)) await recordRejection(tenantId, kind, headers, body.length, err);
          } else if (claimed) {
            // not stored (Redis or the store failed on the way), so not accepted: the provider's retry must not
            // look like a replay of it
            stopHolding();
            await redis.del(claimed).catch(() => undefined);
          }
          throw err;
        }
        // stored: from here the delivery will be processed, by this job or by the reconciler
        // stored is accepted: a Redis that stalls since the gate holds the answer no longer than its deadline (the
        // job, deterministic, lands when Redis does, or the reconciler adds it)
        await afterStored(enqueue(delivery), log, { delivery_id: delivery.id }, 'queueing a stored delivery (the reconciler queues it otherwise)');
        count('accepted');
        return { status: 200, delivery_id: delivery.id, body: verified.emptyReply ? undefined : { delivery_id: delivery.id, status: 'accepted' } };
      } finally {
        stopHolding();
      }
    },

    /** The job: match a stored delivery to automations and start their runs, once. */
    async process(tenantId: string, deliveryId: string): Promise<WebhookDelivery | null> {
      const d = await store.deliveries.get(tenantId, deliveryId);
      if (!d || d.status !== 'received') return d;
      const { runs, error, transient } = await dispatch(d, 1, d.runs);
      // accepted is sure to run: the job fails and is retried (then the reconciler retries it), the delivery
      // still received, and the runs started here are kept with it, so a retry (a day later, when a tenant's
      // line stays full) never starts them again
      if (transient) {
        if (runs.length > d.runs.length) await store.deliveries.update(tenantId, d.id, { runs }, ['received']);
        throw transient;
      }
      const done = await store.deliveries.update(
        tenantId,
        d.id,
        { status: error && !runs.length ? 'failed' : 'processed', runs, error, attempts: 1, processed_at: clock.now().toISOString() },
        ['received'],
      );
      log.info({ delivery_id: d.id, kind: d.kind, event: d.event, runs: runs.length }, 'webhook delivery processed');
      return done;
    },

    /**
     * Refuses (throws), before its body is read, a request its headers already refuse: to a tenant that does not
     * exist or has no secret for the kind, or without its kind's signature header, or with email credentials that
     * are wrong (or none, for JSON). Recorded, as `receive` records it, for a tenant that exists. The intake is
     * open to anyone, and read first, such a body (25 MB for email) was buffered whole to be refused.
     */
    async refuseByHeaders(tenantId: string, kind: WebhookProvider, headers: Headers, size: number): Promise<void> {
      const tenant = await secretsOf(tenantId);
      const secrets = tenant.byKind.get(kind);
      if (!tenant.known || !secrets?.length) return this.refuseUnreadable(tenantId, kind, headers, size, notConfigured(kind));
      try {
        checkHeaders(kind, headers, secrets);
      } catch (err) {
        if (err instanceof WebhookRejectedError) await this.refuseUnreadable(tenantId, kind, headers, size, err);
        throw err;
      }
    },

    /**
     * Refuses a request refused before its body was read, or whose body could not be read (an encoding the intake
     * does not undo, a compressed body that does not inflate): counted, and recorded within the tenant's budget of
     * refusals, as receive's are.
     */
    async refuseUnreadable(tenantId: string, kind: WebhookProvider, headers: Headers, size: number, err: WebhookRejectedError): Promise<never> {
      if (!(await secretsOf(tenantId)).known) {
        deps.metrics.webhookRequests.inc({ kind, outcome: 'webhook-not-configured' });
        throw notConfigured(kind);
      }
      deps.metrics.webhookRequests.inc({ kind, outcome: err.code });
      if (await refusalsWithinLimit(tenantId)) await recordRejection(tenantId, kind, headers, size, err);
      throw err;
    },

    /** Matches a delivery again and starts new runs, without verifying it again. */
    async replay(tenantId: string, deliveryId: string): Promise<WebhookDelivery> {
      const d = await store.deliveries.get(tenantId, deliveryId);
      if (!d) throw new NotFoundError(`no delivery ${deliveryId}`);
      if (d.status === 'rejected') throw new ConflictError('a rejected delivery was never verified, so it cannot be replayed', { status: d.status });
      if (d.status === 'received') throw new ConflictError('this delivery has not been processed yet', { status: d.status });
      const pruned = (x: WebhookDelivery | null) => {
        if (x?.payload_pruned_at)
          throw new ConflictError('this delivery’s event was deleted past its retention (SERVICE_WEBHOOK_DELIVERIES_KEPT_DAYS)', {
            payload_pruned_at: x.payload_pruned_at,
          });
      };
      pruned(d);
      // claim an attempt of its own first, in one atomic write: two replays at once start two sets of runs; none is
      // claimed once its event is deleted (a prune between the read and the claim)
      const claimed = await store.deliveries.addAttempt(tenantId, d.id, ['processed', 'failed']);
      if (!claimed) {
        pruned(await store.deliveries.get(tenantId, d.id));
        throw new ConflictError('this delivery changed while replaying; retry');
      }
      const { runs, error, transient } = await dispatch(claimed, claimed.attempts);
      if (transient && !runs.length) {
        // nothing started (the tenant's line full, Redis or the store not answering): refused as a new run would
        // be (429 with Retry-After, or 503), the delivery as it was, its attempt given back. A run stored before
        // the failure keeps its key, which the next replay then uses again and finds: it does not run twice.
        await store.deliveries.releaseAttempt(tenantId, d.id, claimed.attempts).catch(() => false);
        throw transient;
      }
      // appended, not written over: a replay finishing at the same time keeps its runs too
      const done = await store.deliveries.addRuns(
        tenantId,
        d.id,
        runs,
        { status: error && !runs.length ? 'failed' : 'processed', error, processed_at: clock.now().toISOString() },
        ['processed', 'failed'],
      );
      return done ?? claimed;
    },

    async get(tenantId: string, deliveryId: string): Promise<WebhookDelivery> {
      const d = await store.deliveries.get(tenantId, deliveryId);
      if (!d) throw new NotFoundError(`no delivery ${deliveryId}`);
      return d;
    },

    list: (tenantId: string, q: DeliveryQuery) => store.deliveries.list(tenantId, q),

    /**
     * Deliveries stored but never processed: a job lost between the store and Redis is queued again;
     * a job that used up its attempts (Redis or the store failing for minutes) is retried.
     */
    async reconcile(): Promise<{ requeued: number; retried: number; errors: number }> {
      const done = await repairStale(new Date(clock.now().getTime() - STALE_AFTER_MS).toISOString());
      if (done.requeued || done.retried || done.errors) log.warn(done, 'reconciler repaired webhook deliveries');
      // refused requests are kept REJECTED_KEPT_MS (anyone can send them): a page at a time, within a bound
      const expired = new Date(clock.now().getTime() - REJECTED_KEPT_MS).toISOString();
      await pruneInPages((limit) => store.deliveries.pruneRejected(expired, limit));
      // an accepted delivery's body and event are kept SERVICE_WEBHOOK_DELIVERIES_KEPT_DAYS, its record (the replay guard) for good
      if (keptDays) {
        const now = clock.now();
        const before = new Date(now.getTime() - keptDays * 86_400_000).toISOString();
        // ten a commit: each rewrites its record, whose event may be 25 MB (an email)
        await pruneInPages((limit) => store.deliveries.prunePayloads(before, now.toISOString(), limit), 10);
      }
      return done;
    },

    secrets: {
      async put(tenantId: string, kind: WebhookProvider, secrets: string[]) {
        const now = clock.now().toISOString();
        const current = (await store.webhookSecrets.list(tenantId)).find((r) => r.kind === kind);
        const record: WebhookSecretRecord = {
          tenant_id: tenantId,
          kind,
          sealed: secrets.map((s) => secretBox.seal(s, owner(tenantId, kind))),
          created_at: current?.created_at ?? now,
          updated_at: now,
        };
        await store.webhookSecrets.put(record);
        cache.delete(tenantId);
        log.info({ tenant_id: tenantId, kind, count: secrets.length }, 'webhook secret set');
        return secretView(record);
      },
      async list(tenantId: string) {
        return (await store.webhookSecrets.list(tenantId)).map(secretView);
      },
      async delete(tenantId: string, kind: WebhookProvider) {
        const deleted = await store.webhookSecrets.delete(tenantId, kind);
        cache.delete(tenantId);
        if (!deleted) throw new NotFoundError(`no ${kind} secret is set`);
        log.info({ tenant_id: tenantId, kind }, 'webhook secret deleted');
      },
    },
  };
}
