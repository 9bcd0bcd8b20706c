import { clearTimeout as realClearTimeout, setTimeout as realSetTimeout } from 'node:timers';

/**
 * Polls `check` until it returns true, every `intervalMs`, failing after `timeoutMs` with
 * `describe()` (the state that was awaited, e.g. the last counts read from the database).
 */
export async function eventually(
  check: () => Promise<boolean> | boolean,
  { timeoutMs = 10_000, intervalMs = 25, describe = () => '' }: { timeoutMs?: number; intervalMs?: number; describe?: () => string } = {},
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`condition not met within ${timeoutMs} ms ${describe()}`.trim());
    await new Promise((resolve) => setTimeout(resolve, intervalMs));
  }
}

/**
 * What `promise` settles to within `ms` milliseconds, else `'still waiting'`. Timed with Node's
 * own timers (`node:timers`), so a test's fake timers neither hold nor run it.
 */
export async function within<T>(promise: Promise<T>, ms = 2000): Promise<T | 'still waiting'> {
  let timer: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([promise, new Promise<'still waiting'>((resolve) => (timer = realSetTimeout(resolve, ms, 'still waiting')))]);
  } finally {
    realClearTimeout(timer);
  }
}
