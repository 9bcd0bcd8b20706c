import type { ExecutionContext } from '@nestjs/common';
import { wishSettlement } from './rmq-delivery.js';
import { mayStillSettle, rmqContextOf } from './rmq-settlement.js';

/**
 * Why the guard answered a message without running its handler:
 * - `replayed`: it was handled before (a duplicate message gets the saved result, a duplicate
 *   event is dropped);
 * - `in_progress`: another delivery of it holds the key and is being handled now;
 * - `store_unavailable`: the store failed and the route fails closed;
 * - `rejected`: it can never be handled as it is (no key, an invalid key, a key already used
 *   with another payload, a payload that cannot be fingerprinted).
 */
export type SkippedMessageReason = 'replayed' | 'in_progress' | 'store_unavailable' | 'rejected';

/** A message the guard answered without its handler: why, and how. */
export interface SkippedMessage {
  reason: SkippedMessageReason;
  /**
   * The sender got an answer (a `@MessagePattern`'s reply: the saved result, or the refusal as
   * an error it can retry on); false for an event, which has no one to answer.
   */
  answered: boolean;
  /** For `in_progress`: the lease the other delivery has left, in milliseconds. */
  retryAfterMs?: number;
}

/**
 * Settles a message whose handler the guard did not run, where the transport waits for the
 * handler to acknowledge it (RabbitMQ with `noAck: false`, NATS JetStream, manual Kafka commits).
 * Without it such a message stays unacknowledged: it holds a prefetch slot until its connection
 * closes, and is then delivered again. `ctx` is the message's context, as the handler would get it.
 */
export type SkippedMessageHandler = (ctx: ExecutionContext, skipped: SkippedMessage) => void | Promise<void>;

interface RmqChannel {
  ack(message: unknown): void;
  nack(message: unknown, allUpTo?: boolean, requeue?: boolean): void;
}

/** The pause before an event met by a held key or an outage goes back to the queue, in ms. */
const REQUEUE_MIN_MS = 100;
const REQUEUE_MAX_MS = 2000;
const REQUEUE_OUTAGE_MS = 1000;

/**
 * `onSkippedMessage` for Nest's RabbitMQ transport with manual acknowledgement (`noAck: false`),
 * as a handler that acks at its end would settle the message:
 * - `replayed`: acked;
 * - `rejected`: dropped, or dead-lettered (`nack`, not requeued), as Nest does with a message no
 *   handler takes;
 * - `in_progress`, `store_unavailable`: a message whose sender got that answer is acked (the
 *   sender retries, as an HTTP client does after a 409 or a 503); an event goes back to the
 *   queue (`nack`, requeued) after a pause: the lease the other delivery has left, 0.1 to 2 s
 *   (a 409's `Retry-After`), or 1 s after an outage. Requeued at once, it would go round
 *   thousands of times a second while the first delivery runs. It holds its prefetch slot
 *   meanwhile. To have copies wait for the first result instead, give the handler
 *   `waitForResultMs`.
 *
 * Several guarded handlers of one event share its delivery: it is settled once every one of
 * them is done (see `DeliveryPart`), as the strongest wish says (put back over dropped over
 * acked), or put back after 1 s when one of them ran and failed and nobody settled it; a
 * handler's own settlement wins.
 *
 * Never use it with `noAck: true` (the default): the broker then closes the channel on an ack
 * of a message it did not wait for. Messages of other transports (a hybrid app's TCP) are left
 * to their transport: each such message logged "getChannelRef is not a function" (an adversarial helper).
 */
export const settleRmqMessage: SkippedMessageHandler = (ctx, skipped) => {
  const rmq = rmqContextOf(ctx);
  // A message of another transport in the same app (a hybrid app's TCP, Redis): its transport settles it.
  if (!rmq) return;
  const channel = rmq.getChannelRef() as RmqChannel;
  const message = rmq.getMessage();
  const settlement = settlementOf(skipped);
  const settle = (runFailed: boolean) => settleOnce(channel, message, runFailed ? RUN_FAILED : settlement);
  // Other guarded handlers of its event may still decide on or run this delivery: settled once they are done.
  if (!wishSettlement(message, { strength: STRENGTH[settlement.how], settle })) settle(false);
};

/** How a delivery is settled: acked, dropped (nack, not requeued), or put back after `pauseMs`. */
interface Settlement {
  how: 'ack' | 'drop' | 'requeue';
  pauseMs?: number;
}
/** A handler that needs the message again keeps it: put back over dropped over acked. */
const STRENGTH = { ack: 1, drop: 2, requeue: 3 } as const;
/** A delivery whose guarded run failed (its key was freed) and that nobody settled: put back, to run again. */
const RUN_FAILED: Settlement = { how: 'requeue', pauseMs: REQUEUE_OUTAGE_MS };

function settlementOf({ reason, answered, retryAfterMs }: SkippedMessage): Settlement {
  if (reason === 'rejected') return { how: 'drop' };
  if (reason === 'replayed' || answered) return { how: 'ack' };
  const pauseMs = reason === 'in_progress' ? Math.min(Math.max(retryAfterMs ?? 0, REQUEUE_MIN_MS), REQUEUE_MAX_MS) : REQUEUE_OUTAGE_MS;
  return { how: 'requeue', pauseMs };
}

function settleOnce(channel: RmqChannel, message: unknown, { how, pauseMs }: Settlement): void {
  // Once per delivery: its handler may have settled it.
  if (!mayStillSettle(message)) return;
  if (how === 'drop') return channel.nack(message, false, false);
  if (how === 'ack') return channel.ack(message);
  setTimeout(() => {
    try {
      channel.nack(message, false, true);
    } catch {
      // The channel closed meanwhile: the broker has put the message back already.
    }
  }, pauseMs).unref();
}
