import { describe, expect, it, jest } from '@jest/globals';
import type { ExecutionContext } from '@nestjs/common';
import { TcpContext } from '@nestjs/microservices';
import { settleRmqMessage, type SkippedMessage } from './skipped-message.js';

/**
 * What settleRmqMessage asks of the channel, for each kind of skipped message. A recording channel
 * stands in for amqplib's: the end-to-end spec (test/rmq-skipped-messages) runs the real broker;
 * here the question is only which call each case makes, including dead-lettering, which the broker
 * shows only with a dead-letter exchange set up.
 */
function settle(skipped: SkippedMessage) {
  const calls: string[] = [];
  const message = { fields: { deliveryTag: 1 } };
  const channel = {
    ack: (m: unknown) => calls.push(m === message ? 'ack' : 'ack ?'),
    nack: (m: unknown, _all?: boolean, requeue?: boolean) => calls.push(`${m === message ? 'nack' : 'nack ?'} requeue=${requeue}`),
  };
  const ctx = { switchToRpc: () => ({ getContext: () => ({ getChannelRef: () => channel, getMessage: () => message }) }) } as unknown as ExecutionContext;
  settleRmqMessage(ctx, skipped);
  return calls;
}

describe('settleRmqMessage', () => {
  it('acks a replay, of an event or a message', () => {
    expect(settle({ reason: 'replayed', answered: false })).toEqual(['ack']);
    expect(settle({ reason: 'replayed', answered: true })).toEqual(['ack']);
  });

  it('dead-letters (nacks without requeue) a rejected message, answered or not', () => {
    expect(settle({ reason: 'rejected', answered: false })).toEqual(['nack requeue=false']);
    expect(settle({ reason: 'rejected', answered: true })).toEqual(['nack requeue=false']);
  });

  it('acks a message whose sender was answered "in progress" or "unavailable"', () => {
    expect(settle({ reason: 'in_progress', answered: true, retryAfterMs: 900 })).toEqual(['ack']);
    expect(settle({ reason: 'store_unavailable', answered: true })).toEqual(['ack']);
  });

  // A hybrid app (RMQ and TCP) with it module-wide: each skipped TCP message logged
  // "getChannelRef is not a function" (an adversarial helper).
  it("leaves another transport's message to its transport (a hybrid app's TCP)", () => {
    const ctx = { switchToRpc: () => ({ getContext: () => new TcpContext([{} as never, 'pay']) }) } as unknown as ExecutionContext;
    expect(() => settleRmqMessage(ctx, { reason: 'replayed', answered: true })).not.toThrow();
  });

  it('requeues an event after a pause: the lease left within 0.1 to 2 s, or 1 s after an outage', () => {
    jest.useFakeTimers();
    try {
      const calls = settle({ reason: 'in_progress', answered: false, retryAfterMs: 10_000 });
      jest.advanceTimersByTime(1999);
      expect(calls).toEqual([]);
      jest.advanceTimersByTime(1);
      expect(calls).toEqual(['nack requeue=true']);
      const outage = settle({ reason: 'store_unavailable', answered: false });
      jest.advanceTimersByTime(1000);
      expect(outage).toEqual(['nack requeue=true']);
    } finally {
      jest.useRealTimers();
    }
  });
});
