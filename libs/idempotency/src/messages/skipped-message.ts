import type { ExecutionContext } from '@nestjs/common';

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

/**
 * Settles a message whose handler the guard did not run, where the transport waits for the
 * handler to acknowledge it (RabbitMQ with `noAck: false`, NATS JetStream, manual Kafka commits).
 * Without it such a message stays unacknowledged: it holds a prefetch slot until its connection
 * closes, and is then delivered again. `ctx` is the message's context, as the handler would get it.
 */
export type SkippedMessageHandler = (ctx: ExecutionContext, reason: SkippedMessageReason) => void | Promise<void>;

interface RmqChannel {
  ack(message: unknown): void;
  nack(message: unknown, allUpTo?: boolean, requeue?: boolean): void;
}

/**
 * `onSkippedMessage` for Nest's RabbitMQ transport with manual acknowledgement (`noAck: false`),
 * as a handler that acks at its end would settle the message: `replayed` is acked;
 * `in_progress` and `store_unavailable` are returned to the queue (`nack`, requeued) for a later
 * delivery; `rejected` is dropped or dead-lettered (`nack`, not requeued), as Nest does with a
 * message no handler takes. Never use it with `noAck: true` (the default): the broker then
 * closes the channel on an ack of a message it did not wait for.
 */
export const settleRmqMessage: SkippedMessageHandler = (ctx, reason) => {
  const rmq = ctx.switchToRpc().getContext<{ getChannelRef(): RmqChannel; getMessage(): unknown }>();
  const channel = rmq.getChannelRef();
  const message = rmq.getMessage();
  if (reason === 'replayed') channel.ack(message);
  else channel.nack(message, false, reason !== 'rejected');
};
