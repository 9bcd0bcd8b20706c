/**
 * An operation that ended without any HTTP answer: every attempt failed on the network or timed
 * out, or the total time ran out. The server may still have done the operation: retrying with the
 * same `key` (within the server's retention) is safe and returns its answer.
 */
export class IdempotentRequestError extends Error {
  override name = 'IdempotentRequestError';

  constructor(
    message: string,
    /** The key the attempts carried (undefined when the key travels in the body). */
    readonly key: string | undefined,
    /** How many requests were sent. */
    readonly attempts: number,
    options?: { cause?: unknown },
  ) {
    super(message, options);
  }

  /**
   * The last attempt's failure (a network error, a `TimeoutError`). Declared here so that apps
   * compiled for targets before ES2022 (a classic Nest tsconfig, ES2021), whose `Error` has no
   * `cause`, can read it.
   */
  declare readonly cause?: unknown;
}
