// Connections: a tenant's credentials for the providers its runs act on. The credential is sealed at
// rest under SERVICE_SECRET_KEY with the tenant and the connection as its owner, opened only in memory
// for a call, and never returned, logged or put in an event.
import { createPrivateKey, type KeyObject } from 'node:crypto';
import {
  assertPublicHost,
  ConflictError,
  maskCredentialWindow,
  newId,
  NotFoundError,
  ValidationError,
  type ConnectionProvider,
  type ConnectionRecord,
  type ConnectionTestResult,
  type FieldError,
} from '../platform/index.js';
import type { Platform } from '../deps.js';
import type { ConnectionChanges, ConnectionQuery, ConnectionState, Page } from '../store/index.js';
import { ACTIONS, ActionArgsError, type Answer } from './actions.js';
import { setTimeout as sleep } from 'node:timers/promises';
import { installationToken, isGithubApp, KITS, refusedInstallationToken, type Access, type Identity } from './kits.js';
import { callProvider, ProviderError, PROVIDER_TIMEOUT_MS, reasonOf } from './retry.js';

/**
 * An error no kit classified (an SDK's own, a library's), with the credential masked from its message
 * before it leaves a call: such messages can quote a header (`Bearer <token> is not a legal HTTP header
 * value`). Its code, if any, is kept.
 */
/** How long a GitHub App's installation token the host refused just after it was made is waited for (its replicas). */
const APP_TOKEN_REFUSED_WAIT_MS = 2000;

function maskedError(err: unknown, token: string): unknown {
  if (err instanceof ProviderError || err instanceof ActionArgsError || !(err instanceof Error) || !token || !err.message) return err;
  const message = reasonOf(err.message, token);
  if (message === err.message) return err;
  const { code } = err as { code?: unknown };
  return Object.assign(new Error(message), typeof code === 'string' ? { code } : {});
}

/** The most of who a credential is that a test keeps (a login, a bot and its team, an email). */
const IDENTITY_MAX = 256;
/** The most capabilities a test keeps, and the most of each (a scope, an ability). */
const CAPABILITIES_MAX = 100;
const CAPABILITY_MAX = 100;
/** The most of each string of an action's answer (an id, a URL, a message's ts), and of each of its lists and objects. */
const ANSWER_STRING_MAX = 2000;
const ANSWER_ITEMS_MAX = 100;

/**
 * `text` cut to `max` with the credential masked: cut first to `max` and twice the credential's length (a
 * credential that starts within `max` is whole in it), masked, then cut to `max`, never between the halves of
 * a surrogate pair. A provider's answer is the provider's to size: a tenant's own server answered a test with a
 * 3.9 MB login, kept on the connection and sent with every list of them (390 MB for a hundred).
 */
function clipped(text: string, max: number, token: string): string {
  const masked = maskCredentialWindow(text, max + 2 * token.length, token);
  if (masked.length <= max) return masked;
  const cut = masked.slice(0, max);
  return /[\ud800-\udbff]$/.test(cut) ? cut.slice(0, -1) : cut;
}

/**
 * What a provider answered an action, bounded (each string to ANSWER_STRING_MAX, each list and object to
 * ANSWER_ITEMS_MAX) and every string in it (however deep) with the credential masked as errors are: a compatible
 * server may echo what it was sent (the token as a Slack channel, a login), and the answer becomes a step's output
 * and an event.
 */
function maskedAnswer<T>(value: T, token: string): T {
  if (typeof value === 'string') return clipped(value, ANSWER_STRING_MAX, token) as T;
  if (Array.isArray(value)) return value.slice(0, ANSWER_ITEMS_MAX).map((v: unknown) => maskedAnswer(v, token)) as T;
  if (value && typeof value === 'object')
    return Object.fromEntries(
      Object.entries(value)
        .slice(0, ANSWER_ITEMS_MAX)
        .map(([k, v]) => [clipped(k, ANSWER_STRING_MAX, token), maskedAnswer(v, token)]),
    ) as T;
  return value;
}

/**
 * Who a provider says the credential is and what it may do, as a test keeps it on the connection and GET answers
 * it: bounded (IDENTITY_MAX, CAPABILITIES_MAX of CAPABILITY_MAX), strings whatever the provider sent, and never
 * the credential, whatever it echoed.
 */
function identified(found: Identity, token: string): Identity {
  const { identity, capabilities } = found as { identity: unknown; capabilities: unknown };
  return {
    identity: identity === null || identity === undefined ? null : clipped(String(identity), IDENTITY_MAX, token),
    capabilities: (Array.isArray(capabilities) ? capabilities.slice(0, CAPABILITIES_MAX) : []).map((c) => clipped(String(c), CAPABILITY_MAX, token)),
  };
}

/** What an HTTP header carries as it is: the credential of every provider but email's is sent in one. */
const VISIBLE_ASCII = /^[\x21-\x7e]+$/;
/** An email address as the service checks it: something, an @, something, no whitespace. */
const isAddress = (value: string): boolean => /^[^@\s]+@[^@\s]+$/.test(value);

export type ConnectionSettings = {
  httpAllowPrivate: boolean;
  /** the most connections a tenant keeps (SERVICE_TENANT_MAX_CONNECTIONS); absent: no bound */
  maxConnections?: number;
  /** the most one call to a provider may take; PROVIDER_TIMEOUT_MS when absent (tests make it short) */
  providerTimeoutMs?: number;
};

export type ConnectionInput = {
  provider: ConnectionProvider;
  name: string;
  base_url?: string | null;
  credential: string;
  settings?: ConnectionRecord['settings'];
};

export type ConnectionPatch = Partial<Pick<ConnectionInput, 'name' | 'base_url' | 'credential' | 'settings'>>;

/** A connection as the API shows it: never the sealed credential, nor the tenant. */
export type ConnectionView = Omit<ConnectionRecord, 'sealed' | 'tenant_id'>;

export const viewOf = ({ sealed: _sealed, tenant_id: _tenant, ...rest }: ConnectionRecord): ConnectionView => rest;

/** The connection a run needs is not there: a run that acts on a provider fails with this at once. */
export class ConnectionMissingError extends Error {
  readonly code = 'connection-missing';
  constructor(
    readonly provider: ConnectionProvider,
    message: string,
  ) {
    super(message);
    this.name = 'ConnectionMissingError';
  }
}

export function connectionsOf(deps: Pick<Platform, 'store' | 'clock' | 'log' | 'secretBox'>, settings: ConnectionSettings) {
  const { store, clock, log, secretBox } = deps;
  const owner = (tenantId: string, id: string) => `connection:${tenantId}:${id}`;
  const timeoutMs = settings.providerTimeoutMs ?? PROVIDER_TIMEOUT_MS;

  /** The problems of a base_url and settings for a provider, each with where it is. */
  function problemsOf(provider: ConnectionProvider, baseUrl: string | null, s: ConnectionRecord['settings'], at: string): FieldError[] {
    const kit = KITS[provider];
    const errors: FieldError[] = [];
    if (baseUrl !== null) {
      let url: URL | null = null;
      try {
        url = new URL(baseUrl);
      } catch {
        errors.push({ path: `${at}/base_url`, message: 'not a URL' });
      }
      if (url && !kit.schemes.includes(url.protocol))
        errors.push({ path: `${at}/base_url`, message: `a ${provider} connection's URL is ${kit.schemes.map((x) => x.slice(0, -1)).join(' or ')}` });
      if (url && (url.username || url.password)) errors.push({ path: `${at}/base_url`, message: 'no credentials in the URL: give them as credential' });
      // a client takes no host as localhost (nodemailer does): a URL must name its host
      if (url && !url.hostname) errors.push({ path: `${at}/base_url`, message: 'the URL names no host' });
    } else if (!kit.defaultBaseUrl) {
      errors.push({ path: `${at}/base_url`, message: `a ${provider} connection needs base_url (for example smtp://smtp.example.com:587)` });
    }
    if (provider === 'email') {
      if (!s.username) errors.push({ path: `${at}/settings/username`, message: 'the SMTP login is required' });
      if (!s.from || !isAddress(s.from)) errors.push({ path: `${at}/settings/from`, message: 'the sender address is required' });
    } else if (s.username) {
      errors.push({ path: `${at}/settings/username`, message: `only email connections take a username` });
    }
    if (provider !== 'email' && provider !== 'pager' && s.from)
      errors.push({ path: `${at}/settings/from`, message: `only email and pager connections take from` });
    // the pager's from is sent as PagerDuty's From header: an address, in characters a header carries
    if (provider === 'pager' && s.from !== undefined && (!isAddress(s.from) || !VISIBLE_ASCII.test(s.from)))
      errors.push({ path: `${at}/settings/from`, message: "the PagerDuty user's email address, in ASCII (it is sent in the From header)" });
    if ((s.app_id || s.installation_id) && provider !== 'codehost')
      errors.push({ path: `${at}/settings/app_id`, message: 'only code host connections take app_id and installation_id (a GitHub App)' });
    else if (Boolean(s.app_id) !== Boolean(s.installation_id))
      errors.push({
        path: `${at}/settings/${s.app_id ? 'installation_id' : 'app_id'}`,
        message: 'a GitHub App connection takes both app_id and installation_id',
      });
    return errors;
  }

  /**
   * The problems of a credential for its provider and settings: a GitHub App's is its private key, and a private key
   * is an App's; any other but an SMTP password (which may be UTF-8) is sent in an HTTP header, which carries only
   * visible ASCII. Taken, `toké😀` failed every call with fetch's error, which named a character of it.
   */
  function credentialProblems(provider: ConnectionProvider, s: ConnectionRecord['settings'], credential: string, at: string): FieldError[] {
    // one of the two is enough to mean an App (the other's absence is said by problemsOf)
    if (s.app_id || s.installation_id) {
      let key: KeyObject | null = null;
      try {
        key = createPrivateKey(credential);
      } catch {
        // said without the library's words, which may quote the key
      }
      return key?.asymmetricKeyType === 'rsa'
        ? []
        : [{ path: `${at}/credential`, message: "a GitHub App connection's credential is the App's RSA private key: the PEM file GitHub gave, as it is" }];
    }
    if (credential.startsWith('-----BEGIN'))
      return [{ path: `${at}/credential`, message: "a private key is a GitHub App's: give settings.app_id and settings.installation_id with it (code host)" }];
    if (provider !== 'email' && !VISIBLE_ASCII.test(credential))
      return [
        {
          path: `${at}/credential`,
          message: `a ${provider} credential is sent in an HTTP header, which carries only visible ASCII characters (no spaces, accents or emoji)`,
        },
      ];
    return [];
  }

  async function checkAddress(baseUrl: string | null): Promise<void> {
    if (baseUrl !== null) await assertPublicHost(new URL(baseUrl), settings.httpAllowPrivate);
  }

  async function must(tenantId: string, id: string): Promise<ConnectionRecord> {
    const found = await store.connections.get(tenantId, id);
    if (!found) throw new NotFoundError(`no connection ${id}`);
    return found;
  }

  /** The credential in clear and where it goes; the stop signal is each call's own (callProvider's). */
  function accessOf(record: ConnectionRecord): Access {
    let token: string;
    try {
      token = secretBox.open(record.sealed, owner(record.tenant_id, record.id));
    } catch {
      // the service's own key, not the provider: said as such (a test blamed the provider, which was never asked)
      log.error({ tenant_id: record.tenant_id, connection_id: record.id }, "a connection's credential does not open with SERVICE_SECRET_KEY (the key changed)");
      throw new ProviderError(
        'credential-unreadable',
        `the ${record.provider} connection's credential does not open with SERVICE_SECRET_KEY (the key changed): give the credential again`,
        null,
      );
    }
    return { token, baseUrl: record.base_url, settings: record.settings, allowPrivate: settings.httpAllowPrivate };
  }

  /**
   * What a call to the provider is made with: the credential, or for a GitHub App's installation the token made
   * from its private key (installationToken), which every call, checkout and mask of an answer then uses. The
   * key itself is never sent: only the JWT it signs, to the code host's own address.
   */
  async function providerAccess(record: ConnectionRecord, signal?: AbortSignal): Promise<Access> {
    const access = accessOf(record);
    if (!isGithubApp(record.settings)) return access;
    const token = await callProvider(
      'codehost',
      (e) => KITS.codehost.classify(e, access.token),
      (attempt) => installationToken({ ...access, signal: attempt }),
      { signal, timeoutMs, idempotent: true },
    ).catch((err: unknown) => {
      throw maskedError(err, access.token);
    });
    return { ...access, token };
  }

  /**
   * A call made with a connection's access (providerAccess). For a GitHub App's, a refusal (401) of its installation
   * token is tried once more: with a new token, the one refused dropped (an installation suspended and resumed), or,
   * for a token made a moment ago, with it again once the host's replicas know it. A refusal is of nothing done.
   */
  async function withAccess<T>(record: ConnectionRecord, signal: AbortSignal | undefined, call: (access: Access) => Promise<T>): Promise<T> {
    const access = await providerAccess(record, signal);
    try {
      return await call(access);
    } catch (err) {
      // 401 only: a 403 is a permission the App lacks, which no other token has
      if (!isGithubApp(record.settings) || !(err instanceof ProviderError) || err.status !== 401) throw err;
      if (refusedInstallationToken(accessOf(record), access.token) === 'new') await sleep(APP_TOKEN_REFUSED_WAIT_MS, undefined, { signal });
      return call(await providerAccess(record, signal));
    }
  }

  /** The diff a vibe run of the tenant left: whole, or refused. */
  async function vibeDiff(tenantId: string, runId: string): Promise<string> {
    const run = await store.runs.get(tenantId, runId);
    if (!run || run.kind !== 'vibe') throw new ActionArgsError(`no vibe run ${runId}`);
    if (run.status !== 'succeeded') throw new ActionArgsError(`vibe run ${runId} is ${run.status}: only a succeeded run's diff is opened as a pull request`);
    const result = run.result as { diff?: string; diff_truncated?: boolean } | null;
    if (result?.diff_truncated) throw new ActionArgsError(`vibe run ${runId}'s diff was cut short: it cannot be opened as a pull request`);
    return result?.diff ?? '';
  }

  async function touch(record: ConnectionRecord, changes: ConnectionChanges = {}, when?: ConnectionState): Promise<ConnectionRecord> {
    const next = await store.connections.update(record.tenant_id, record.id, { last_used_at: clock.now().toISOString(), ...changes }, when);
    return next && next !== 'name-taken' ? next : record;
  }

  return {
    async create(tenantId: string, input: ConnectionInput): Promise<ConnectionRecord> {
      const baseUrl = input.base_url ?? null;
      const settingsOf = input.settings ?? {};
      const errors = [
        ...problemsOf(input.provider, baseUrl, settingsOf, '/body'),
        ...credentialProblems(input.provider, settingsOf, input.credential, '/body'),
      ];
      if (errors.length) throw new ValidationError('the connection is not complete', errors);
      await checkAddress(baseUrl);
      const now = clock.now().toISOString();
      const id = newId('con');
      const record: ConnectionRecord = {
        id,
        tenant_id: tenantId,
        provider: input.provider,
        name: input.name,
        base_url: baseUrl,
        settings: settingsOf,
        sealed: secretBox.seal(input.credential, owner(tenantId, id)),
        created_at: now,
        updated_at: now,
        last_used_at: null,
        last_test: null,
      };
      // held to the cap by the insert itself (creates that race make no more than it)
      const max = settings.maxConnections;
      const inserted = await store.connections.insert(record, max === undefined ? undefined : { maxHeld: max });
      if (inserted === 'over-cap')
        throw new ConflictError(`this tenant has ${max} connections, the most it may keep (SERVICE_TENANT_MAX_CONNECTIONS): remove one first`);
      if (!inserted) throw new ConflictError(`this tenant already has a connection named ${input.name}`);
      log.info({ tenant_id: tenantId, connection_id: id, provider: input.provider }, 'connection created');
      return record;
    },

    /** A page of the tenant's connections, oldest first. */
    list: (tenantId: string, q: ConnectionQuery): Promise<Page<ConnectionRecord>> => store.connections.page(tenantId, q),

    get: must,

    async update(tenantId: string, id: string, patch: ConnectionPatch): Promise<ConnectionRecord> {
      const current = await must(tenantId, id);
      const baseUrl = patch.base_url === undefined ? current.base_url : patch.base_url;
      const settingsOf = patch.settings ?? current.settings;
      const errors = problemsOf(current.provider, baseUrl, settingsOf, '/body');
      if (patch.credential !== undefined) errors.push(...credentialProblems(current.provider, settingsOf, patch.credential, '/body'));
      // a token is not a private key, nor the other way round: a connection that becomes an App's, or stops being one, takes its credential again
      else if (isGithubApp(settingsOf) !== isGithubApp(current.settings))
        errors.push({
          path: '/body/credential',
          message: `required when the connection ${isGithubApp(settingsOf) ? 'becomes' : 'stops being'} a GitHub App's`,
        });
      if (errors.length) throw new ValidationError('the connection would not be complete', errors);
      // the credential goes where the base URL points: a new place needs the credential given again, or a
      // key of the tenant could send the stored one to an address of its choosing and read it there
      if (patch.base_url !== undefined && patch.base_url !== current.base_url && patch.credential === undefined)
        throw new ValidationError('a new base_url needs the credential given again with it', [
          { path: '/body/credential', message: 'required when base_url changes' },
        ]);
      if (patch.base_url !== undefined) await checkAddress(baseUrl);
      const changes: ConnectionChanges = { updated_at: clock.now().toISOString() };
      if (patch.name !== undefined) changes.name = patch.name;
      if (patch.base_url !== undefined) changes.base_url = baseUrl;
      if (patch.settings !== undefined) changes.settings = settingsOf;
      if (patch.credential !== undefined) changes.sealed = secretBox.seal(patch.credential, owner(tenantId, id));
      // what the last test said was about the credential, the place it was tried and the settings it was tried
      // with (an email login's username, a pager's from)
      if (patch.credential !== undefined || patch.base_url !== undefined || patch.settings !== undefined) changes.last_test = null;
      const next = await store.connections.update(tenantId, id, changes);
      if (next === 'name-taken') throw new ConflictError(`this tenant already has a connection named ${patch.name}`);
      if (!next) throw new NotFoundError(`no connection ${id}`);
      log.info({ tenant_id: tenantId, connection_id: id, credential_replaced: patch.credential !== undefined }, 'connection changed');
      return next;
    },

    async remove(tenantId: string, id: string): Promise<void> {
      if (!(await store.connections.delete(tenantId, id))) throw new NotFoundError(`no connection ${id}`);
      log.info({ tenant_id: tenantId, connection_id: id }, 'connection removed');
    },

    /** Asks the provider who the credential is and what it may do; keeps the answer on the connection. */
    async test(tenantId: string, id: string): Promise<ConnectionTestResult> {
      const record = await must(tenantId, id);
      const kit = KITS[record.provider];
      let result: ConnectionTestResult;
      try {
        await checkAddress(record.base_url);
        const found = await withAccess(record, undefined, (access) =>
          callProvider(
            record.provider,
            (e) => kit.classify(e, access.token),
            (signal) => kit.identify({ ...access, signal }),
            { timeoutMs },
          ).then(
            // kept on the connection and answered by GET and every list: bounded, never the credential
            (answer) => identified(answer, access.token),
            (err: unknown) => {
              throw maskedError(err, access.token);
            },
          ),
        );
        result = { ok: true, ...found, error: null, checked_at: clock.now().toISOString() };
      } catch (err) {
        const error =
          err instanceof ProviderError || (err as { code?: string }).code === 'address-not-allowed'
            ? { code: (err as { code: string }).code, message: (err as Error).message }
            : { code: 'provider-error', message: `the ${record.provider} provider could not be asked` };
        if (!(err instanceof ProviderError)) log.warn({ tenant_id: tenantId, connection_id: id, err: (err as Error).message }, 'connection test failed');
        result = { ok: false, identity: null, capabilities: [], error, checked_at: clock.now().toISOString() };
      }
      // kept only while the connection still holds the credential, address and settings tried: a test that a
      // PATCH overtook would otherwise stand as the new credential's verdict
      await touch(record, { last_test: result }, record);
      return result;
    },

    /**
     * The connection a run acts through: the one it names (by id or name), else the tenant's only one
     * of the provider. Throws ConnectionMissingError naming the provider when there is none to take.
     */
    async resolve(tenantId: string, provider: ConnectionProvider, named?: string | null): Promise<ConnectionRecord> {
      // looked up directly (by id, then by name), not found in a list of them all: each action step resolves one
      if (named) {
        // a name may be another provider's connection's id (names are free text): then it is looked up as a name too
        const byId = await store.connections.get(tenantId, named);
        const record = byId?.provider === provider ? byId : await store.connections.getByName(tenantId, named);
        if (record?.provider === provider) return record;
        throw new ConnectionMissingError(provider, `no ${provider} connection named ${named}`);
      }
      // whether there is exactly one: two tell
      const found = await store.connections.list(tenantId, provider, 2);
      if (found.length === 1) return found[0]!;
      // (counted only to say so: a run that fails here)
      const why = found.length
        ? `${(await store.connections.list(tenantId, provider)).length} ${provider} connections and none named: name one in the automation's connections`
        : `no ${provider} connection: add one with POST /api/v1/connections`;
      throw new ConnectionMissingError(provider, why);
    },

    /** The connection a run acts through, its address checked now; its last use is written meanwhile. */
    async use(tenantId: string, provider: ConnectionProvider, named: string | null | undefined): Promise<ConnectionRecord> {
      const record = await this.resolve(tenantId, provider, named);
      await checkAddress(record.base_url);
      void touch(record).catch((err: Error) => log.warn({ connection_id: record.id, err: err.message }, 'the last use of a connection could not be written'));
      return record;
    },

    /**
     * What git needs to fetch from the code host: its web address (github.com for the public API, the
     * host of a GitHub Enterprise base_url) and the token, for a process's environment only.
     */
    async git(tenantId: string, named: string | null | undefined): Promise<{ connection_id: string; web_url: string; token: string }> {
      const record = await this.use(tenantId, 'codehost', named);
      const { token } = await providerAccess(record);
      const api = record.base_url ?? KITS.codehost.defaultBaseUrl!;
      const web = api
        .replace(/\/+$/, '')
        .replace(/\/api\/v3$/, '')
        .replace(/^https:\/\/api\.github\.com$/, 'https://github.com');
      return { connection_id: record.id, web_url: web, token };
    },

    /** One action on a provider through a connection; what the provider answered (ids, URLs). */
    async act(
      tenantId: string,
      provider: ConnectionProvider,
      named: string | null | undefined,
      action: string,
      args: Record<string, unknown>,
      signal?: AbortSignal,
    ): Promise<{ connection_id: string; answer: Answer }> {
      // its own actions only: `constructor` would be Object, which answers the access (the credential) itself
      const run = Object.hasOwn(ACTIONS[provider], action) ? ACTIONS[provider][action] : undefined;
      if (!run) throw new ActionArgsError(`${provider} has no action ${action}; it has ${Object.keys(ACTIONS[provider]).join(', ')}`);
      const record = await this.use(tenantId, provider, named);
      const kit = KITS[provider];
      const answer = await withAccess(record, signal, (access) =>
        callProvider(
          provider,
          (e) => (e instanceof ActionArgsError ? null : kit.classify(e, access.token)),
          (attempt) => run({ ...access, signal: attempt }, args, { vibeDiff: (id) => vibeDiff(tenantId, id) }),
          // one that makes something each time is asked again only when the provider said it did nothing
          { signal, idempotent: run.idempotent, timeoutMs },
        ).then(
          // a step's output and a provider.answer event: never the credential, whatever the provider echoed
          (found) => maskedAnswer(found, access.token),
          (err: unknown) => {
            throw maskedError(err, access.token);
          },
        ),
      );
      return { connection_id: record.id, answer };
    },
  };
}
