import type { ExecutionContext } from '@nestjs/common';
import { AsyncLocalStorage } from 'node:async_hooks';
import { Observable } from 'rxjs';

/** Messages a handler settled itself (ack, nack, reject), whichever run it was. */
const settledByHandler = new WeakSet<object>();
/** Messages nacked or rejected outside any guarded run of theirs (another handler's, or a lost async context). */
const nackedOutsideRun = new WeakSet<object>();
/** Messages acked outside any guarded run of theirs. */
const ackedOutsideRun = new WeakSet<object>();
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
  if (settledBySkip.has(message) || settledByHandler.has(message) || settledByAll(message)) return false;
  settledBySkip.add(message);
  return true;
}

/**
 * Whether a settle-all since the message came settled it: an `ackAll()` or `nackAll()`, or an
 * `ack` / `nack` of all up to a message at or after it. Deferred until every guarded handler of
 * a delivery was done, `settleRmqMessage` acked a delivery that one of them had nacked with
 * `nackAll()` (406, the channel closed; an adversarial reviewer).
 */
function settledByAll(message: object): boolean {
  const seen = delivered.get(message);
  if (!seen) return false;
  const { marks } = seen;
  if (marks.settleAlls !== seen.settleAlls) return true;
  const tag = deliveryTagOf(message);
  return marks.upToCalls !== seen.upToCalls && tag !== undefined && tag <= marks.settledUpToTag;
}

/** What a watched channel counts: its `nackAll()` and `nack(m, true)` calls, its `ackAll()` calls; and every settle-all. */
interface ChannelMarks {
  nackAlls: number;
  ackAlls: number;
  /** `ackAll()` and `nackAll()` calls, in runs or not. */
  settleAlls: number;
  /** `ack` / `nack` calls of all up to a message, and the highest delivery tag they settled. */
  upToCalls: number;
  settledUpToTag: number;
}

/** Each message's channel marks as they were when it came (see `settledByAll`). */
const delivered = new WeakMap<object, { marks: ChannelMarks; settleAlls: number; upToCalls: number }>();

/** Notes a message as its guarded handlers start on it: its channel is watched from then on. */
export function noteDelivery(ctx: ExecutionContext): void {
  const rmq = rmqContextOf(ctx);
  const channel: unknown = rmq?.getChannelRef();
  const message: unknown = rmq?.getMessage();
  if (!isObject(channel) || !isObject(message) || delivered.has(message)) return;
  const marks = watch(channel as Channel);
  if (marks) delivered.set(message, { marks, settleAlls: marks.settleAlls, upToCalls: marks.upToCalls });
}

/** Runs `work` outside any guarded run's async context: the guard's own settlements are no handler's. */
export function outsideRuns<T>(work: () => T): T {
  return currentRun.exit(work);
}

function deliveryTagOf(message: object): number | undefined {
  const tag = (message as { fields?: { deliveryTag?: unknown } }).fields?.deliveryTag;
  return typeof tag === 'number' ? tag : undefined;
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

/** What one guarded run did to its own message, noted by the wrapped channel while the run's code runs. */
interface RunMarks {
  message: object;
  acked: boolean;
  nacked: boolean;
}
/** The guarded run whose code is running: a settlement is the run's own (several guarded handlers of one event share a delivery). */
const currentRun = new AsyncLocalStorage<RunMarks>();

/** A guarded handler's run of a RabbitMQ message, and how it settled the message itself (see `watchRmqSettlement`). */
export interface RmqRun {
  /** The handler's Observable, its code run as this run's (`next.handle()` is called, and subscribed, in the run's async context). */
  around(handle: () => Observable<unknown>): Observable<unknown>;
  /** How the handler settled its own message so far. */
  settlement(): HandlerSettlement;
}

/**
 * How the handler settled its own message, for Nest's RabbitMQ transport with manual
 * acknowledgement (`noAck: false`); undefined (no watch) for other transports. Such handlers
 * often settle a failure themselves (`nack`, then return) instead of throwing: the guard must not
 * take that run for a handled message, or the redelivery is dropped as a duplicate and the message
 * is lost. And a handler that acked its message settled it as done, whatever it does after (an
 * ack that throws on a channel that closed meanwhile, work after the ack that fails): its effect
 * happened, and the redelivery must not run it again. The channel's settling methods are wrapped
 * once (they call through unchanged) to note what they settle, before they are called.
 *
 * A settlement counts for the run whose code made it (an AsyncLocalStorage around the handler):
 * several guarded handlers of one event share its delivery, and one handler's nack taken for
 * another's failure freed that other's key, which ran again on the redelivery (an adversarial
 * helper: 20 runs for 10 keys); one handler's ack taken for another's success kept the other's
 * failure as done, and it never ran again. A settlement made outside any guarded run of the
 * message (an unguarded handler's, or code that lost its async context) counts for every run of
 * it, as before. A `nackAll()` (or a `nack` of all up to a message) in a run counts for its
 * message; outside runs, for every run that acked nothing, unless an `ackAll()` came meanwhile.
 */
export function watchRmqSettlement(ctx: ExecutionContext): RmqRun | undefined {
  const rmq = rmqContextOf(ctx);
  if (!rmq) return undefined;
  const channel: unknown = rmq.getChannelRef();
  const message: unknown = rmq.getMessage();
  if (!isObject(channel) || !isObject(message)) return undefined;
  const marks = watch(channel as Channel);
  if (!marks) return undefined;
  const { nackAlls, ackAlls } = marks;
  const run: RunMarks = { message, acked: false, nacked: false };
  return {
    around: (handle) => {
      const handled = currentRun.run(run, handle);
      return new Observable((subscriber) => currentRun.run(run, () => handled.subscribe(subscriber)));
    },
    settlement: () => {
      // An ack wins over a nack of the same message: a handler that worked, acked, then nacked in
      // its catch (its ack threw on a closed channel, or a step after the ack failed) has done its
      // effect, and a redelivery or the producer's retry must not run it again.
      if (run.acked) return 'acked';
      if (run.nacked) return 'nacked';
      if (ackedOutsideRun.has(message)) return 'acked';
      if (nackedOutsideRun.has(message)) return 'nacked';
      // An ackAll() is no sign of this handler's: another handler on the channel may have made it
      // while this one failed before its effect (then, on a channel that closed, the broker
      // redelivers, and the copy must run). It only says that a nackAll() meanwhile was not ours.
      return marks.nackAlls !== nackAlls && marks.ackAlls === ackAlls ? 'nacked' : undefined;
    },
  };
}

function watch(channel: Channel): ChannelMarks | undefined {
  if (channel[MARKS]) return channel[MARKS];
  if (Object.isFrozen(channel)) return undefined;
  const marks: ChannelMarks = { nackAlls: 0, ackAlls: 0, settleAlls: 0, upToCalls: 0, settledUpToTag: 0 };
  const wrap = (name: string, note: (args: unknown[]) => void) => {
    const settle = channel[name];
    if (typeof settle !== 'function') return;
    channel[name] = function (this: unknown, ...args: unknown[]) {
      note(args);
      return settle.apply(this, args);
    };
  };
  /** Notes that `message` was settled (`how`), for the run settling it, else for all its runs. */
  const note = (message: unknown, how: 'acked' | 'nacked') => {
    if (!isObject(message)) return;
    settledByHandler.add(message);
    const run = currentRun.getStore();
    if (run?.message === message) run[how] = true;
    else (how === 'acked' ? ackedOutsideRun : nackedOutsideRun).add(message);
  };
  /** A nack of every message in flight (up to one): the run's own failure, else every run's that acks nothing. */
  const nackAll = () => {
    const run = currentRun.getStore();
    if (run) run.nacked = true;
    else marks.nackAlls++;
  };
  /** An ack or nack of all up to `message`: every delivery at or before its tag is settled. */
  const upTo = (message: unknown) => {
    marks.upToCalls++;
    const tag = isObject(message) ? deliveryTagOf(message) : undefined;
    marks.settledUpToTag = Math.max(marks.settledUpToTag, tag ?? Infinity);
  };
  wrap('nack', ([message, allUpTo]) => {
    note(message, 'nacked');
    if (allUpTo !== true) return;
    upTo(message);
    nackAll();
  });
  wrap('reject', ([message]) => note(message, 'nacked'));
  wrap('nackAll', () => {
    marks.settleAlls++;
    nackAll();
  });
  wrap('ack', ([message, allUpTo]) => {
    note(message, 'acked');
    if (allUpTo === true) upTo(message);
  });
  wrap('ackAll', () => {
    marks.settleAlls++;
    marks.ackAlls++;
  });
  Object.defineProperty(channel, MARKS, { value: marks });
  return marks;
}

function isObject(value: unknown): value is object {
  return typeof value === 'object' && value !== null;
}
