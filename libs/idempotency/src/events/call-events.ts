import { hash } from 'node:crypto';
import { performance } from 'node:perf_hooks';
import type { IdempotencyEvent, IdempotencyEventBase, IdempotencyEventType, IdempotencyTransport } from './idempotency-event.js';
import { describeStoreError } from './describe-error.js';
import { anySubscribed, type EventSubscription, type IdempotencyEvents } from './idempotency-events.js';

/**
 * What an emitter passes for an event of type `T`: the rest comes from the call. A `store_error`
 * takes the store's error as thrown; the event carries its description (`describeStoreError`).
 */
export type EventFields<T extends IdempotencyEventType> = T extends 'store_error'
  ? Omit<Extract<IdempotencyEvent, { type: T }>, keyof IdempotencyEventBase | 'type' | 'error'> & { error: unknown }
  : Omit<Extract<IdempotencyEvent, { type: T }>, keyof IdempotencyEventBase | 'type' | 'handlerMs'>;

/** The events that say how long the claim was held before it settled. */
const SETTLED: ReadonlySet<IdempotencyEventType> = new Set(['completed', 'released', 'lease_takeover']);

/**
 * The user segment of a storage key `<prefix>:<user>:<handler>:<key>`: the prefix holds no ':',
 * and the handler and key segments are percent-encoded, so the user segment lies between the
 * first ':' and the last but one (it is `ip:<address>` or `anon:` itself for anonymous callers).
 */
export function userSegmentOf(storageKey: string): string {
  const last = storageKey.lastIndexOf(':');
  return storageKey.slice(storageKey.indexOf(':') + 1, storageKey.lastIndexOf(':', last - 1));
}

/**
 * The events of one guarded call. Made only when someone listens as the call begins (the
 * guard holds `undefined` otherwise, so that `events?.emit(...)` builds nothing). The call is
 * reported whole to the subscriptions there as it began (before its claim), and to no later one.
 */
export class CallEvents {
  /** The hub's subscriptions as the call began: the hub replaces its list, never changes it. */
  private readonly subscriptions: readonly EventSubscription[];
  private readonly user: string;
  private readonly keyHash: string;
  /** When the claim was held (won, or possibly held after a failed claim), by the monotonic clock. */
  private heldAt: number | undefined;
  /** When the answer was ready to save, or the release decided: before the store call that settles it. */
  private settledAt: number | undefined;

  constructor(
    private readonly hub: IdempotencyEvents,
    private readonly handler: string,
    private readonly transport: IdempotencyTransport,
    private readonly storageKey: string,
    private readonly startedAt: number,
  ) {
    this.subscriptions = hub.subscriptions;
    this.user = userSegmentOf(storageKey);
    this.keyHash = hash('sha256', storageKey, 'hex');
  }

  /** The run holds the claim from now on: `handlerMs` counts from here. */
  held(): void {
    this.heldAt = performance.now();
  }

  /** The answer is ready to save, or the release decided: `handlerMs` ends here (the first time). */
  settled(): void {
    this.settledAt ??= performance.now();
  }

  emit<T extends IdempotencyEventType>(type: T, fields: EventFields<T>): void {
    if (!anySubscribed(this.subscriptions)) return;
    const now = performance.now();
    const event = {
      type,
      handler: this.handler,
      transport: this.transport,
      user: this.user,
      keyHash: this.keyHash,
      elapsedMs: now - this.startedAt,
      ...fields,
    } as IdempotencyEvent;
    if (SETTLED.has(type)) {
      (event as { handlerMs: number }).handlerMs = (this.settledAt ?? now) - (this.heldAt ?? this.startedAt);
    } else if (event.type === 'store_error') {
      event.error = describeStoreError(event.error, this.storageKey, this.keyHash);
    }
    this.hub.emit(event, this.subscriptions);
  }
}
