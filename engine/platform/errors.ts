// One hierarchy of errors for the whole service. Codes are stable, kebab-case and listed in
// api/openapi.yaml; the HTTP edge (api/problem.ts) and the worker edge translate them.
export type FieldError = { path: string; message: string };

export abstract class AppError extends Error {
  abstract readonly code: string;
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

export class NotFoundError extends AppError {
  readonly code = 'not-found';
}

export class ConflictError extends AppError {
  readonly code = 'conflict';
}

/** Input that passed the schema but not the engine's own rules (a cron expression, a time zone, a budget). */
export class ValidationError extends AppError {
  readonly code = 'validation-failed';
  constructor(
    message: string,
    readonly errors: FieldError[],
  ) {
    super(message, { errors });
  }
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
      | 'webhook-payload-invalid',
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

export class PayloadTooLargeError extends AppError {
  readonly code = 'payload-too-large';
}
