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
 * The storage key holds something that is no idempotency record: in a store whose keyspace the
 * app shares (Redis), a value another part of the app wrote there. A store error, so a claim that
 * meets one follows the outage policy; `IdempotencyAdmin` answers it as `not_a_record`.
 */
export class IdempotencyNotARecordError extends IdempotencyStoreError {}

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
