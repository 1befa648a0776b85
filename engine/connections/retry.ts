// One way to call a provider: its SDK's error is read into a status and a Retry-After, what may be asked
// again is tried again (up to three calls in all, waiting as Retry-After says), and what fails is a
// ProviderError with a stable code and a message that never carries the credential or the provider's body.
// What may be asked again depends on what was asked: a read or a change that lands the same however often it
// is made (idempotent) is tried again on 429 and 5xx; one that makes something each time (a comment, a
// message, a note, an email) only when the provider said it did nothing (429, an SMTP 4xx): after a 5xx it may
// have been made all the same, and a second call would make it twice. A wait the provider names past the cap
// (10 s) is not cut short, which would ask again before the time it named: the call fails at once, saying the
// wait. Each call is held to a time of its own (PROVIDER_TIMEOUT_MS): a provider that took the connection and
// never answered held a step for the whole run's budget.
import { maskCredentialWindow, type ConnectionProvider } from '../platform/index.js';

/** What a provider's SDK error says, read by that provider's kit; null for an error that is not the provider's. */
export type ProviderFailure = {
  status: number | null;
  retryAfterSeconds: number | null;
  reason: string;
  /**
   * The provider answered (2xx) but its answer could not be read (encoded, too large, cut short): what was asked
   * happened. Never tried again, and not a status of the provider's.
   */
  unread?: boolean;
  /** The provider said it did nothing (a 429, an SMTP 4xx): safe to ask again, whatever was asked. */
  unsent?: boolean;
};

export type ProviderErrorCode =
  | 'provider-auth-failed'
  | 'provider-not-found'
  | 'provider-refused'
  | 'provider-rate-limited'
  | 'provider-error'
  | 'provider-unreachable'
  /** the provider answered that it did what was asked, but its answer could not be read */
  | 'provider-answer-unreadable'
  /** not the provider's: the stored credential does not open with this SERVICE_SECRET_KEY */
  | 'credential-unreadable';

export class ProviderError extends Error {
  constructor(
    readonly code: ProviderErrorCode,
    message: string,
    readonly status: number | null,
  ) {
    super(message);
    this.name = 'ProviderError';
  }
}

export type RetryOptions = {
  signal?: AbortSignal;
  attempts?: number;
  maxWaitMs?: number;
  sleep?: (ms: number, signal?: AbortSignal) => Promise<void>;
  /** whether `fn` may be called again after a 5xx (it lands the same however often it is made); true when absent */
  idempotent?: boolean;
  /** the most one call of `fn` may take; PROVIDER_TIMEOUT_MS when absent */
  timeoutMs?: number;
};

const MAX_WAIT_MS = 10_000;
const ATTEMPTS = 3;
/** The most one call to a provider may take (each SDK's, the test's, an action's). */
export const PROVIDER_TIMEOUT_MS = 30_000;

function codeOf(f: ProviderFailure): ProviderErrorCode {
  if (f.status === null) return 'provider-unreachable';
  if (f.status === 401 || f.status === 403) return 'provider-auth-failed';
  if (f.status === 404) return 'provider-not-found';
  if (f.status === 429) return 'provider-rate-limited';
  if (f.status >= 500) return 'provider-error';
  return 'provider-refused';
}

/** Whether a failure may be tried again: never an answer that came but could not be read (what was asked happened). */
function retryable(f: ProviderFailure, idempotent: boolean): boolean {
  if (f.unread) return false;
  if (f.status === 429 || f.unsent) return true;
  return idempotent && f.status !== null && f.status >= 500;
}

function defaultSleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason as Error);
    const t = setTimeout(() => {
      signal?.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(t);
      reject(signal!.reason as Error);
    };
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}

/**
 * Calls `fn` with a signal that stops it at the caller's signal or after `timeoutMs`, trying again what `retryable`
 * allows; anything the provider refused, or a call that took too long, becomes a ProviderError.
 */
export async function callProvider<T>(
  provider: ConnectionProvider,
  classify: (err: unknown) => ProviderFailure | null,
  fn: (signal: AbortSignal) => Promise<T>,
  opts: RetryOptions = {},
): Promise<T> {
  const attempts = opts.attempts ?? ATTEMPTS;
  const sleep = opts.sleep ?? defaultSleep;
  const timeoutMs = opts.timeoutMs ?? PROVIDER_TIMEOUT_MS;
  const maxWaitMs = opts.maxWaitMs ?? MAX_WAIT_MS;
  for (let attempt = 1; ; attempt++) {
    const timeout = AbortSignal.timeout(timeoutMs);
    try {
      return await fn(opts.signal ? AbortSignal.any([opts.signal, timeout]) : timeout);
    } catch (err) {
      if (opts.signal?.aborted) throw err;
      // never tried again: what was asked may have been done
      if (timeout.aborted) throw new ProviderError('provider-unreachable', `the ${provider} provider did not answer within ${timeoutMs / 1000} s`, null);
      const failure = classify(err);
      if (!failure) throw err;
      if (attempt < attempts && retryable(failure, opts.idempotent ?? true)) {
        const named = failure.retryAfterSeconds !== null ? Math.max(failure.retryAfterSeconds * 1000, 0) : null;
        // asked again before the time it named, a provider refuses again (and may count the call against the credential)
        if (named !== null && named > maxWaitMs)
          throw new ProviderError(
            codeOf(failure),
            `the ${provider} provider answered ${failure.status}${failure.reason ? `: ${failure.reason}` : ''}; retry after ${Math.ceil(named / 1000)} s (longer than the ${maxWaitMs / 1000} s a call waits: not asked again)`,
            failure.status,
          );
        await sleep(named ?? Math.min(500 * 2 ** (attempt - 1), maxWaitMs), opts.signal);
        continue;
      }
      if (failure.unread)
        throw new ProviderError(
          'provider-answer-unreadable',
          `the ${provider} provider answered${failure.status === null ? '' : ` ${failure.status}`}, but its answer could not be read (what was asked may have been done: it is not asked again)${failure.reason ? `: ${failure.reason}` : ''}`,
          null,
        );
      const status = failure.status === null ? 'could not be reached' : `answered ${failure.status}`;
      throw new ProviderError(codeOf(failure), `the ${provider} provider ${status}${failure.reason ? `: ${failure.reason}` : ''}`, failure.status);
    }
  }
}

/** Retry-After as seconds: a number of seconds or an HTTP date; null when absent or unreadable. */
export function retryAfterOf(value: string | number | null | undefined): number | null {
  if (value === null || value === undefined || value === '') return null;
  const n = Number(value);
  if (Number.isFinite(n)) return Math.max(0, n);
  const at = Date.parse(String(value));
  return Number.isFinite(at) ? Math.max(0, Math.ceil((at - Date.now()) / 1000)) : null;
}

/** The most a reason says. */
const REASON_MAX = 200;
/** What fetch (webidl) says of a header value with a character over 255: `...at index 11 has a value of 55357...`. */
const BYTESTRING = /Cannot convert argument to a ByteString/i;

/** The most of a provider's error that a reason is looked for in (its credential's length aside). */
const REASON_WINDOW_MAX = 64 * 1024;

/**
 * A short reason from a provider's error, with the credential masked should it appear: cut to REASON_MAX and twice
 * the credential's length (a credential that starts within the reason is whole in what is masked), masked, then
 * cut to REASON_MAX; any part of it long enough to tell (12 characters) is masked too. Masking can shorten the
 * text (a run of base64 holding the credential becomes `[credential]`): while what is left is shorter than
 * REASON_MAX, more of the error is taken, up to REASON_WINDOW_MAX. Masked whole before the cut, a provider's error
 * of 4 MB held the process for seconds. fetch's refusal of a header it cannot send names the place and the code
 * of a character of the credential: it is said without them.
 */
export function reasonOf(text: unknown, secret: string): string {
  if (typeof text !== 'string' || !text) return '';
  const head = text.trimStart();
  const most = REASON_WINDOW_MAX + 2 * secret.length;
  for (let window = REASON_MAX + 2 * secret.length; ; window = Math.min(window * 4, most)) {
    const taken = head.slice(0, window);
    if (BYTESTRING.test(taken)) return "the credential holds characters the provider's HTTP header cannot carry (only visible ASCII)";
    const said = maskCredentialWindow(head, window, secret).replace(/\s+/g, ' ').trim();
    if (said.length >= REASON_MAX || window >= head.length || window >= most) return said.slice(0, REASON_MAX);
  }
}
