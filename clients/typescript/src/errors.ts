/**
 * The error classes of the client: the same tree as soul-runtime's Python one (`soul_runtime/errors.py`), plus
 * the same names and parents (a test compares the two drawings).
 *
 * ```
 * SoulError                      every error the service answers with (and the client's transport failures)
 * ├── InvalidInput               a value the service refuses: fix the call, do not retry it
 * │   ├── ConfigError
 * │   └── IdempotencyConflict    an Idempotency-Key sent again with another body
 * ├── NotFound                   an unknown soul (any read), turn, fact or route
 * ├── StorageError
 * ├── ModelError                 the language model failed after its retries
 * │   └── ModelTimeout
 * ├── EmbedderError
 * ├── TurnFailed
 * │   └── OutOfOrder
 * ├── StaleOwner                 the soul moved: retry with the same Idempotency-Key
 * │   └── Moved
 * └── RuntimeUnavailable         the runtime (or the service) cannot be reached
 *     ├── RuntimeBusy            the runtime refused more work for now (429); `retryAfter` in seconds
 *     │   └── QuotaExceeded      the tenant is over one of its limits (429); `retryAfter` in seconds
 *     └── AuthError              a credential was refused
 *         └── Unauthorized       no key, an unknown key or a revoked one (401)
 * ```
 *
 * An error the service answered carries its HTTP `status` and the `type` of its body `{"error": {"type",
 * "message"}}`; a type this client does not know becomes the class its status stands for, and a 5xx without the
 * service's body (a proxy's or gateway's page) a `RuntimeUnavailable`.
 */

export interface ErrorDetails {
  /** The HTTP status of the answer; undefined when no answer came (a network error or a timeout). */
  status?: number;
  /** The `error.type` of the answer's body (the name of the service's error class), when there was one. */
  type?: string;
  /** The underlying error (a network error, a timeout). */
  cause?: unknown;
}

export class SoulError extends Error {
  readonly status: number | undefined;
  readonly type: string;

  constructor(message: string, details: ErrorDetails = {}) {
    super(message, details.cause === undefined ? undefined : { cause: details.cause });
    this.name = new.target.name;
    this.status = details.status;
    this.type = details.type ?? new.target.name;
  }
}

export class InvalidInput extends SoulError {}
export class ConfigError extends InvalidInput {}
export class IdempotencyConflict extends InvalidInput {}
export class NotFound extends SoulError {}
export class StorageError extends SoulError {}
export class ModelError extends SoulError {}
export class ModelTimeout extends ModelError {}
export class EmbedderError extends SoulError {}
export class TurnFailed extends SoulError {}
export class OutOfOrder extends TurnFailed {}
export class StaleOwner extends SoulError {}
export class Moved extends StaleOwner {}
export class RuntimeUnavailable extends SoulError {}
export class AuthError extends RuntimeUnavailable {}
export class Unauthorized extends AuthError {}

export class RuntimeBusy extends RuntimeUnavailable {
  /** Seconds the service asked to wait (its `Retry-After`), when it said. */
  readonly retryAfter: number | undefined;

  constructor(message: string, details: ErrorDetails & { retryAfter?: number } = {}) {
    super(message, details);
    this.retryAfter = details.retryAfter;
  }
}

export class QuotaExceeded extends RuntimeBusy {}

type ErrorClass = new (message: string, details?: ErrorDetails) => SoulError;

const BY_TYPE: Readonly<Record<string, ErrorClass>> = {
  SoulError, InvalidInput, ConfigError, IdempotencyConflict, NotFound, Unauthorized, StorageError, ModelError,
  ModelTimeout, EmbedderError, TurnFailed, OutOfOrder, StaleOwner, Moved, RuntimeUnavailable, RuntimeBusy, QuotaExceeded,
  AuthError,
};

const BY_STATUS: Readonly<Record<number, ErrorClass>> = {
  400: InvalidInput, 401: Unauthorized, 404: NotFound, 422: InvalidInput, 429: RuntimeBusy, 502: ModelError,
  503: RuntimeUnavailable,
};

/**
 * The error for an answer of status `status` whose body was `body` (parsed JSON, or the text when it was not
 * JSON). `retryAfter`: the answer's `Retry-After` in seconds.
 */
export function errorFromResponse(status: number, body: unknown, retryAfter?: number): SoulError {
  const err = typeof body === "object" && body !== null ? (body as { error?: unknown }).error : undefined;
  const fields = typeof err === "object" && err !== null ? (err as Record<string, unknown>) : {};
  const type = typeof fields.type === "string" ? fields.type : undefined;
  const text = typeof body === "string" ? body.trim().slice(0, 200) : "";
  const message = typeof fields.message === "string" ? fields.message : text || `HTTP ${status}`;
  const known = type !== undefined && Object.hasOwn(BY_TYPE, type) ? BY_TYPE[type] : undefined;
  // no service error body at all (a proxy or gateway answered): a 5xx means the service was not reached
  const unreached = type === undefined && status >= 500 ? RuntimeUnavailable : undefined;
  const cls = status === 429 ? (known === QuotaExceeded ? QuotaExceeded : RuntimeBusy)
    : known ?? unreached ?? BY_STATUS[status] ?? SoulError;
  if (cls === RuntimeBusy || cls === QuotaExceeded) {
    const busy = cls as typeof RuntimeBusy;
    return new busy(message, { status, type, retryAfter });
  }
  return new cls(message, { status, type });
}
