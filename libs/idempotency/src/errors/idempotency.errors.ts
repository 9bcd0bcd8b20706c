/** Base of every error the library throws for a reason of its own. */
export class IdempotencyError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
  }
}

/** A decorator or module option is wrong; thrown while the application starts. */
export class IdempotencyConfigError extends IdempotencyError {}

/** The store could not be reached or answered with an error. */
export class IdempotencyStoreError extends IdempotencyError {}

/**
 * A client's idempotency key is unusable (empty, too long, control characters, not text);
 * `problem` says why. Thrown by the key step, whatever the transport: each answers it its own way
 * (HTTP 400 `IDEMPOTENCY_KEY_INVALID`, an RPC error with that code).
 */
export class IdempotencyKeyError extends IdempotencyError {
  constructor(readonly problem: string) {
    super(`The idempotency key is invalid (${problem})`);
  }
}
