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
