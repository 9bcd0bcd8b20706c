import { clearTimeout as realClearTimeout, setImmediate as realSetImmediate, setTimeout as realSetTimeout } from 'node:timers';

/**
 * Polls `check` until it returns true, every `intervalMs`, failing after `timeoutMs` with `what`
 * and `describe()` (the state that was awaited, e.g. the last counts read from the database).
 */
export async function eventually(
  check: () => Promise<boolean> | boolean,
  {
    timeoutMs = 10_000,
    intervalMs = 25,
    what = 'condition',
    describe = () => '',
  }: { timeoutMs?: number; intervalMs?: number; what?: string; describe?: () => string } = {},
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) {
      // One last look after a turn of the event loop: after a stall of the process, what came
      // in meanwhile (an answer, an invalidation) is read before the deadline's verdict.
      await new Promise((resolve) => realSetImmediate(resolve));
      if (await check()) return;
      throw new Error(`${what} not met within ${timeoutMs} ms ${describe()}`.trim());
    }
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
