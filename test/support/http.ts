/** Starts a promise-returning request now (supertest requests are lazy until awaited). */
export const fire = <T>(request: PromiseLike<T>): Promise<T> => Promise.resolve(request);

/** Waits until `condition` holds, checking every few milliseconds, failing after `timeoutMs`. */
export async function until(condition: () => boolean | Promise<boolean>, timeoutMs = 5000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await condition())) {
    if (Date.now() > deadline) throw new Error(`condition not met within ${timeoutMs} ms`);
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
}
