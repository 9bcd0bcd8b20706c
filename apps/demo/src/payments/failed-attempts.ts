/** Message ids whose failed attempts are remembered at once; the oldest is forgotten first. */
const DEFAULT_CAPACITY = 10_000;

/**
 * Failed processing attempts per message id, in this process: what bounds the retries of a
 * poison message (AMQP 0-9-1 classic queues count no deliveries; `redelivered` is a flag). Each
 * consumer process counts its own, and a restart starts again: the bound is per process.
 */
export class FailedAttempts {
  private readonly counts = new Map<string, number>();

  constructor(private readonly capacity = DEFAULT_CAPACITY) {}

  /** Counts one more failure of `messageId` and returns how many it has had. */
  add(messageId: string): number {
    const count = (this.counts.get(messageId) ?? 0) + 1;
    // Deleted and set again, so the Map's order stays "least recently failed first".
    this.counts.delete(messageId);
    this.counts.set(messageId, count);
    if (this.counts.size > this.capacity) this.counts.delete(this.counts.keys().next().value!);
    return count;
  }

  forget(messageId: string): void {
    this.counts.delete(messageId);
  }
}

/** A value PostgreSQL refused (SQLSTATE class 22, "data exception"): the same message fails every time. */
export const isDataException = (error: unknown): boolean => {
  const state = (error as { driverError?: { code?: unknown } } | null)?.driverError?.code;
  return typeof state === 'string' && state.startsWith('22');
};
