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
