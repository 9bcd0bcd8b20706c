import { eventually } from './eventually.js';

/** Starts a promise-returning request now (supertest requests are lazy until awaited). */
export const fire = <T>(request: PromiseLike<T>): Promise<T> => Promise.resolve(request);

/** Waits until `condition` holds, checking every few milliseconds, failing after `timeoutMs`. */
export const until = (condition: () => boolean | Promise<boolean>, timeoutMs = 5000): Promise<void> =>
  eventually(condition, { timeoutMs, intervalMs: 5 });
