import type { CallHandler, ExecutionContext } from '@nestjs/common';
import { Observable } from 'rxjs';
import { noteDelivery, outsideRuns, rmqContextOf } from './rmq-settlement.js';

/** How `settleRmqMessage` would settle a delivery, and how strongly: the strongest wish of its handlers wins. */
export interface SettlementWish {
  /** Puts back (3) over drops (2) over acks (1): a handler that needs the message again keeps it. */
  strength: number;
  /** Settles the delivery as wished, or, when a guarded run of it failed and nobody settled it, puts it back. */
  settle(runFailed: boolean): void;
}

/** A RabbitMQ delivery that guarded handlers are deciding on or running. */
interface Delivery {
  /** Guarded handlers of it not done yet. */
  open: number;
  runFailed: boolean;
  wish: SettlementWish | undefined;
}

/** Deliveries by their message object, which every handler of an event gets. */
const deliveries = new WeakMap<object, Delivery>();

/**
 * One guarded handler's part in a RabbitMQ delivery (Nest's RabbitMQ transport). Several guarded
 * handlers of one event share its delivery, and the guard decides for each: settled as soon as
 * one handler replayed it, a delivery that another handler ran again was acked under that run (a
 * crash then lost the run's message: the broker had nothing to redeliver), and the running
 * handler's own ack came second (an adversarial helper). So `settleRmqMessage` wishes, and the
 * delivery is settled once every guarded handler of it is done: as the strongest wish says
 * when no run failed (a handler that settled it itself wins, as before), put back after a
 * pause when a run failed and nobody settled it.
 *
 * A handler joins as the guard starts on it. Nest starts every handler of an event in the same
 * turn of the event loop, so they have joined before the first decides (a store round trip),
 * unless a guard or interceptor before this one waits on I/O first.
 */
export class DeliveryPart {
  private state: 'deciding' | 'running' | 'done' = 'deciding';

  private constructor(private readonly delivery: Delivery) {}

  /** The part of this call, for a RabbitMQ message; undefined for other transports. */
  static join(ctx: ExecutionContext): DeliveryPart | undefined {
    const message = rmqContextOf(ctx)?.getMessage();
    if (typeof message !== 'object' || message === null) return undefined;
    noteDelivery(ctx);
    let delivery = deliveries.get(message);
    if (!delivery) deliveries.set(message, (delivery = { open: 0, runFailed: false, wish: undefined }));
    delivery.open++;
    return new DeliveryPart(delivery);
  }

  /** `next`, noting when its handler runs, and its end. */
  watching(next: CallHandler): CallHandler {
    return {
      handle: () => {
        const handled = next.handle();
        return new Observable<unknown>((subscriber) => {
          this.state = 'running';
          const source = handled.subscribe({
            next: (value) => subscriber.next(value),
            error: (error: unknown) => {
              this.end(true);
              subscriber.error(error);
            },
            complete: () => {
              this.end(false);
              subscriber.complete();
            },
          });
          return () => {
            source.unsubscribe();
            this.end(false);
          };
        });
      },
    };
  }

  /** The guard answered the call: a part whose handler does not run is done. */
  decided(): void {
    if (this.state === 'deciding') this.end(false);
  }

  private end(failed: boolean): void {
    if (this.state === 'done') return;
    this.state = 'done';
    const delivery = this.delivery;
    if (failed) delivery.runFailed = true;
    if (--delivery.open > 0) return;
    const { wish, runFailed } = delivery;
    delivery.wish = undefined;
    // Ended in a run's completion: the guard's settlement (and its timer) is no handler's own.
    if (wish) outsideRuns(() => wish.settle(runFailed));
  }
}

/**
 * Notes `wish` for the delivery of `message` while guarded handlers of it are not done (true: it
 * is settled once they are); false where none is open (`settleRmqMessage` called outside the
 * guard): settle now.
 */
export function wishSettlement(message: unknown, wish: SettlementWish): boolean {
  if (typeof message !== 'object' || message === null) return false;
  const delivery = deliveries.get(message);
  if (!delivery || delivery.open === 0) return false;
  if (!delivery.wish || wish.strength > delivery.wish.strength) delivery.wish = wish;
  return true;
}
