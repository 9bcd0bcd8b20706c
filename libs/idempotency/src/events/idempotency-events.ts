import { Injectable, Logger } from '@nestjs/common';
import { describeThrown } from './describe-error.js';
import type { IdempotencyEvent, IdempotencyEventListener } from './idempotency-event.js';

/** One `subscribe`: its listener, and until which emit it gets events. */
export interface EventSubscription {
  readonly listener: IdempotencyEventListener;
  /**
   * The number of the last emit begun before it was undone (`Infinity` while subscribed): an emit
   * in progress finishes with the listeners it began with, and no later emit reaches it.
   */
  until: number;
}

const NO_SUBSCRIPTIONS: readonly EventSubscription[] = Object.freeze([]);

/** Whether any of `subscriptions` is still subscribed. */
export function anySubscribed(subscriptions: readonly EventSubscription[]): boolean {
  for (let i = 0; i < subscriptions.length; i++) if (subscriptions[i].until === Infinity) return true;
  return false;
}

/**
 * The guard's events, for your own providers: an audit log, OpenTelemetry, your metrics.
 * Global with the module; inject it and `subscribe`. The module's `onEvent` option and its
 * Prometheus metrics (`metrics`) are listeners too.
 *
 * ```ts
 * @Injectable()
 * export class IdempotencyAudit implements OnModuleInit, OnModuleDestroy {
 *   private unsubscribe?: () => void;
 *   constructor(private readonly events: IdempotencyEvents) {}
 *   onModuleInit() { this.unsubscribe = this.events.subscribe((event) => this.record(event)); }
 *   onModuleDestroy() { this.unsubscribe?.(); }
 * }
 * ```
 *
 * A call is reported whole, to the listeners subscribed when it began (and still subscribed), so
 * a listener never sees half of a call. With none, the guard builds no event at all.
 */
@Injectable()
export class IdempotencyEvents {
  private readonly logger = new Logger('Idempotency');
  /** Replaced, never changed in place: a call (and an emit in progress) keeps the list it began with. */
  private current: readonly EventSubscription[] = NO_SUBSCRIPTIONS;
  /** Emits begun so far: numbers them for `EventSubscription.until`. */
  private emits = 0;
  /** Event types each listener failed on, already logged. */
  private readonly failures = new WeakMap<IdempotencyEventListener, Set<string>>();

  /** Whether anyone listens: the guard builds events only then. */
  get listening(): boolean {
    return this.current.length > 0;
  }

  /**
   * The subscriptions now (internal: the guard keeps them as a call begins, and reports that call
   * to them alone, skipping those undone since).
   */
  get subscriptions(): readonly EventSubscription[] {
    return this.current;
  }

  /** Calls `listener` with every event from now on; returns the function that unsubscribes it. */
  subscribe(listener: IdempotencyEventListener): () => void {
    const subscription: EventSubscription = { listener, until: Infinity };
    this.current = [...this.current, subscription];
    return () => {
      if (subscription.until !== Infinity) return;
      subscription.until = this.emits;
      this.current = this.current.filter((other) => other !== subscription);
    };
  }

  /**
   * Hands `event` to every listener, or to those of `to` still subscribed (the guard passes the
   * subscriptions its call began with). A listener's failure is logged, never thrown.
   */
  emit(event: IdempotencyEvent, to: readonly EventSubscription[] = this.current): void {
    const emit = ++this.emits;
    for (let i = 0; i < to.length; i++) {
      const { listener, until } = to[i];
      if (until < emit) continue;
      try {
        const result = listener(event);
        if (result && typeof result.then === 'function') result.then(undefined, (error: unknown) => this.failed(listener, event, error));
      } catch (error) {
        this.failed(listener, event, error);
      }
    }
  }

  /** Logs a listener's failure, once per listener and event type. Never throws, whatever was thrown. */
  private failed(listener: IdempotencyEventListener, event: IdempotencyEvent, error: unknown): void {
    try {
      let types = this.failures.get(listener);
      if (!types) this.failures.set(listener, (types = new Set()));
      if (types.has(event.type)) return;
      types.add(event.type);
      const name = typeof listener.name === 'string' && listener.name ? ` (${listener.name})` : '';
      const { message, stack } = describeThrown(error);
      this.logger.error(
        `An idempotency event listener${name} failed on "${event.type}" ` +
          `(logged once per listener and event type; the request is not affected): ${message}`,
        stack,
      );
    } catch {
      // A logger that throws: the request path goes on all the same.
    }
  }
}
