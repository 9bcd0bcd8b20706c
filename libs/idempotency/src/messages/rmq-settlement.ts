import type { ExecutionContext } from '@nestjs/common';

/** Messages a handler nacked or rejected itself (RabbitMQ, manual acknowledgement). */
const nacked = new WeakSet<object>();
/** Messages a handler acked itself. */
const acked = new WeakSet<object>();
/** Deliveries settleRmqMessage settled (or scheduled to put back): a delivery is settled once. */
const settledBySkip = new WeakSet<object>();

/**
 * Whether `settleRmqMessage` may settle this delivery now, noting that it does: not when it did
 * already, nor when a handler acked or nacked it. Two guarded handlers of one event that both
 * skipped a copy acked it twice, and the broker closed the channel on the second ack (406,
 * unknown delivery tag), putting back every unacked message on it (an adversarial helper).
 */
export function mayStillSettle(message: unknown): boolean {
  if (!isObject(message)) return true;
  if (settledBySkip.has(message) || acked.has(message) || nacked.has(message)) return false;
  settledBySkip.add(message);
  return true;
}

/** What a watched channel counts: its `nackAll()` and `nack(m, true)` calls, its `ackAll()` calls. */
interface ChannelMarks {
  nackAlls: number;
  ackAlls: number;
}
/** A watched channel's marks (its `nack`, `reject`, `nackAll`, `ack` and `ackAll` note what they settle). */
const MARKS = Symbol.for('nestjs-idempotency.rmq-nacks');

type Channel = Record<PropertyKey, unknown> & { [MARKS]?: ChannelMarks };

/** How a handler settled its own message: `nacked` (or rejected), `acked`, or not at all (undefined). */
export type HandlerSettlement = 'nacked' | 'acked' | undefined;

/** Nest's RabbitMQ context of a message, or undefined for another transport's (TCP, Redis, ...). */
export function rmqContextOf(ctx: ExecutionContext): { getChannelRef(): unknown; getMessage(): unknown } | undefined {
  const rmq = ctx.switchToRpc().getContext<{ getChannelRef?: unknown; getMessage?: unknown } | undefined>();
  if (typeof rmq?.getChannelRef !== 'function' || typeof rmq.getMessage !== 'function') return undefined;
  return rmq as { getChannelRef(): unknown; getMessage(): unknown };
}

/**
 * How the handler settled its own message, for Nest's RabbitMQ transport with manual
 * acknowledgement (`noAck: false`); undefined (no watch) for other transports. Such handlers
 * often settle a failure themselves (`nack`, then return) instead of throwing: the guard must not
 * take that run for a handled message, or the redelivery is dropped as a duplicate and the message
 * is lost. And a handler that acked its message settled it as done, whatever it does after (an
 * ack that throws on a channel that closed meanwhile, work after the ack that fails): its effect
 * happened, and the redelivery must not run it again. The channel's settling methods are wrapped
 * once (they call through unchanged) to note what they settle, before they are called. A
 * `nackAll()` (or a `nack` of all up to a message) during the run counts for its message unless
 * the handler acked it, and no `ackAll()` came meanwhile. Only the handler's `ack` of its own
 * message counts as acked (noted as it is called: an ack that throws on a channel that closed
 * still says the handler took its work for done).
 */
export function watchRmqSettlement(ctx: ExecutionContext): (() => HandlerSettlement) | undefined {
  const rmq = rmqContextOf(ctx);
  if (!rmq) return undefined;
  const channel: unknown = rmq.getChannelRef();
  const message: unknown = rmq.getMessage();
  if (!isObject(channel) || !isObject(message)) return undefined;
  const marks = watch(channel as Channel);
  if (!marks) return undefined;
  const { nackAlls, ackAlls } = marks;
  return () => {
    // An ack wins over a nack of the same message: a handler that worked, acked, then nacked in
    // its catch (its ack threw on a closed channel, or a step after the ack failed) has done its
    // effect, and a redelivery or the producer's retry must not run it again.
    if (acked.has(message)) return 'acked';
    if (nacked.has(message)) return 'nacked';
    // An ackAll() is no sign of this handler's: another handler on the channel may have made it
    // while this one failed before its effect (then, on a channel that closed, the broker
    // redelivers, and the copy must run). It only says that a nackAll() meanwhile was not ours.
    return marks.nackAlls !== nackAlls && marks.ackAlls === ackAlls ? 'nacked' : undefined;
  };
}

function watch(channel: Channel): ChannelMarks | undefined {
  if (channel[MARKS]) return channel[MARKS];
  if (Object.isFrozen(channel)) return undefined;
  const marks: ChannelMarks = { nackAlls: 0, ackAlls: 0 };
  const wrap = (name: string, note: (args: unknown[]) => void) => {
    const settle = channel[name];
    if (typeof settle !== 'function') return;
    channel[name] = function (this: unknown, ...args: unknown[]) {
      note(args);
      return settle.apply(this, args);
    };
  };
  wrap('nack', ([message, allUpTo]) => {
    if (isObject(message)) nacked.add(message);
    if (allUpTo === true) marks.nackAlls++;
  });
  wrap('reject', ([message]) => isObject(message) && nacked.add(message));
  wrap('nackAll', () => marks.nackAlls++);
  wrap('ack', ([message]) => isObject(message) && acked.add(message));
  wrap('ackAll', () => marks.ackAlls++);
  Object.defineProperty(channel, MARKS, { value: marks });
  return marks;
}

function isObject(value: unknown): value is object {
  return typeof value === 'object' && value !== null;
}
