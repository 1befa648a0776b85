// One hierarchy of errors for the whole service. Codes are stable, kebab-case, listed once (below,
// with their HTTP status) and in api/openapi.yaml's Problem.code (a test keeps the two equal); the
// HTTP edge (api/problem.ts) and the worker edge translate them.
export type FieldError = { path: string; message: string };

/** Every code the service answers with, and its HTTP status. A code missing here does not compile. */
export const ERROR_STATUS = {
  'bad-request': 400,
  'validation-failed': 400,
  'malformed-json': 400,
  'webhook-payload-invalid': 400,
  unauthorized: 401,
  'webhook-signature-missing': 401,
  'webhook-signature-invalid': 401,
  'webhook-timestamp-outside-window': 401,
  'webhook-not-configured': 403,
  'tool-not-permitted': 403,
  'network-not-permitted': 403,
  'path-not-permitted': 403,
  'sign-in-refused': 403,
  'csrf-refused': 403,
  'not-found': 404,
  'method-not-allowed': 405,
  'request-timeout': 408,
  conflict: 409,
  'webhook-replay': 409,
  'payload-too-large': 413,
  'unsupported-media-type': 415,
  'unsupported-audio': 415,
  'expectation-failed': 417,
  'address-not-allowed': 422,
  'audio-invalid': 422,
  'audio-too-long': 422,
  'agent-not-configured': 422,
  'idempotency-key-reused': 422,
  'task-graph-invalid': 422,
  'gate-set-invalid': 422,
  'rate-limited': 429,
  'headers-too-large': 431,
  internal: 500,
  'transcription-provider-error': 502,
  unavailable: 503,
  'transcription-not-configured': 503,
  'transcription-timeout': 504,
} as const satisfies Record<string, number>;

export type ErrorCode = keyof typeof ERROR_STATUS;

export abstract class AppError extends Error {
  abstract readonly code: ErrorCode;
  readonly retryable: boolean = false;
  constructor(
    message: string,
    readonly details: Record<string, unknown> = {},
    opts?: ErrorOptions,
  ) {
    super(message, opts);
    this.name = new.target.name;
  }
}

/** An error whose thrower picks its code from a few of one kind. */
abstract class CodedError<C extends ErrorCode> extends AppError {
  constructor(
    readonly code: C,
    message: string,
    details: Record<string, unknown> = {},
  ) {
    super(message, details);
  }
}

export class NotFoundError extends AppError {
  readonly code = 'not-found';
}

export class ConflictError extends AppError {
  readonly code = 'conflict';
}

/** The request that holds an Idempotency-Key has not stored its run yet: the same request again after `retryAfterSeconds` gets its answer. */
export class IdempotencyKeyInUseError extends ConflictError {
  constructor(
    message: string,
    readonly retryAfterSeconds: number,
  ) {
    super(message, { retry_after_seconds: retryAfterSeconds });
  }
  // the same request again gets its answer: a job that meets it tries again
  override readonly retryable = true;
}

/** An error that names every problem of what was asked at once, each with where it is. */
export abstract class ProblemsError extends AppError {
  constructor(
    message: string,
    readonly errors: FieldError[],
  ) {
    super(message, { errors });
  }
}

/** Input that passed the schema but not the engine's own rules (a cron expression, a time zone, a budget). */
export class ValidationError extends ProblemsError {
  readonly code = 'validation-failed';
}

export class UnauthorizedError extends AppError {
  readonly code = 'unauthorized';
}

/** A goal-driven run with no model endpoint configured (SERVICE_AGENT_BASE_URL). */
export class AgentNotConfiguredError extends AppError {
  readonly code = 'agent-not-configured';
}

/** The same Idempotency-Key came back with a different request. */
export class IdempotencyKeyReusedError extends AppError {
  readonly code = 'idempotency-key-reused';
}

/** A webhook intake refusal: each reason has its own code so a provider's delivery log says why. */
export class WebhookRejectedError extends AppError {
  constructor(
    readonly code:
      | 'webhook-signature-missing'
      | 'webhook-signature-invalid'
      | 'webhook-timestamp-outside-window'
      | 'webhook-replay'
      | 'webhook-not-configured'
      | 'webhook-payload-invalid'
      | 'unsupported-media-type',
    message: string,
  ) {
    super(message);
  }
}

/** Too many requests for one tenant; `retryAfterSeconds` goes out as Retry-After. */
export class RateLimitedError extends AppError {
  readonly code = 'rate-limited';
  constructor(
    message: string,
    readonly retryAfterSeconds: number,
  ) {
    super(message, { retry_after_seconds: retryAfterSeconds });
  }
}

/** A tenant's line of waiting runs is full (SERVICE_TENANT_MAX_WAITING): a trigger's run is worth trying again once it drains. */
export class TenantLineFullError extends RateLimitedError {
  override readonly retryable = true;
}

export class PayloadTooLargeError extends AppError {
  readonly code = 'payload-too-large';
}

/** A body of a type (or charset) the route does not read, or of no type where one is needed. */
export class UnsupportedMediaTypeError extends AppError {
  readonly code = 'unsupported-media-type';
}

/** A request that is not one HTTP can carry as asked (no Host on HTTP/1.1). */
export class BadRequestError extends AppError {
  readonly code = 'bad-request';
}

/** An `Expect` header the service cannot meet: only `100-continue` is one (RFC 9110 §10.1.1). */
export class ExpectationFailedError extends AppError {
  readonly code = 'expectation-failed';
}

/** Something the service depends on (the store, Redis) did not answer: worth retrying after `retryAfterSeconds`. */
export class ServiceUnavailableError extends AppError {
  readonly code = 'unavailable';
  override readonly retryable = true;
  constructor(
    message: string,
    readonly retryAfterSeconds: number,
    opts?: ErrorOptions,
  ) {
    super(message, { retry_after_seconds: retryAfterSeconds }, opts);
  }
}

/** What the operator does not allow tenants (SERVICE_TOOLS_ALLOWED, SERVICE_SANDBOX_ALLOW_NETWORK). */
export class NotPermittedError extends CodedError<'tool-not-permitted' | 'network-not-permitted'> {}

/** Tasks whose dependencies do not make a DAG of the session (unknown, self or duplicate, a cycle) or name unknown agents: every error at once. */
export class TaskGraphInvalidError extends ProblemsError {
  readonly code = 'task-graph-invalid';
}

/** A workspace's gate set file (gates.yaml) that does not hold: every problem at once, with where it is. */
export class GateSetInvalidError extends ProblemsError {
  readonly code = 'gate-set-invalid';
}

/** A folder the operator does not let a tenant audit (/etc, /proc, /sys, or outside the allowed roots in production). */
export class PathNotPermittedError extends AppError {
  readonly code = 'path-not-permitted';
}

/** Audio the service will not send to a transcriber: not a known format, empty or broken, or too long. */
export class AudioRejectedError extends CodedError<'unsupported-audio' | 'audio-invalid' | 'audio-too-long'> {}

/** No transcription provider (SERVICE_TRANSCRIBE_PROVIDER and its settings). */
export class TranscriptionNotConfiguredError extends AppError {
  readonly code = 'transcription-not-configured';
}

/** The transcription provider failed or did not answer in time. Never carries the provider's key or raw body. */
export class TranscriptionFailedError extends CodedError<'transcription-provider-error' | 'transcription-timeout'> {
  override readonly retryable = true;
}

/** A URL the service will not reach for a tenant: a private, loopback or otherwise non-public address (SERVICE_HTTP_ALLOW_PRIVATE). */
export class AddressNotAllowedError extends AppError {
  readonly code = 'address-not-allowed';
}
