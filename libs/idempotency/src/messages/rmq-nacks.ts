import type { ExecutionContext } from '@nestjs/common';

/** Messages a handler nacked or rejected itself (RabbitMQ, manual acknowledgement). */
const nacked = new WeakSet<object>();
/** Marks a channel whose `nack` and `reject` already note their message. */
const WATCHED = Symbol.for('nestjs-idempotency.rmq-nacks');

type Channel = Record<PropertyKey, unknown>;

/**
 * Whether the handler nacked or rejected its own message, for Nest's RabbitMQ transport with
 * manual acknowledgement (`noAck: false`); undefined for other transports. Such handlers often
 * settle a failure themselves (`nack`, then return) instead of throwing: the guard must not take
 * that run for a handled message, or the redelivery is dropped as a duplicate and the message is
 * lost. The channel's `nack` and `reject` are wrapped once (they call through unchanged) to note
 * the message they settle.
 */
export function watchRmqNacks(ctx: ExecutionContext): (() => boolean) | undefined {
  const rmq = ctx.switchToRpc().getContext<{ getChannelRef?: unknown; getMessage?: unknown } | undefined>();
  if (typeof rmq?.getChannelRef !== 'function' || typeof rmq.getMessage !== 'function') return undefined;
  const channel: unknown = rmq.getChannelRef();
  const message: unknown = rmq.getMessage();
  if (!isObject(channel) || !isObject(message) || !watch(channel as Channel)) return undefined;
  return () => nacked.has(message);
}

function watch(channel: Channel): boolean {
  if (channel[WATCHED]) return true;
  if (Object.isFrozen(channel)) return false;
  for (const name of ['nack', 'reject']) {
    const settle = channel[name];
    if (typeof settle !== 'function') continue;
    channel[name] = function (this: unknown, message: unknown, ...rest: unknown[]) {
      if (isObject(message)) nacked.add(message);
      return settle.call(this, message, ...rest);
    };
  }
  Object.defineProperty(channel, WATCHED, { value: true });
  return true;
}

function isObject(value: unknown): value is object {
  return typeof value === 'object' && value !== null;
}
