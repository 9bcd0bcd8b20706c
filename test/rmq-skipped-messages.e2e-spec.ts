// Nest's RabbitMQ transport with manual acknowledgement (noAck: false), the handler acking at its
// end, one message in flight (prefetchCount 1). A duplicate the guard drops never reaches the
// handler, so without onSkippedMessage it is never acked: it holds the only prefetch slot, and
// every later message waits behind it for good.
import { afterAll, afterEach, beforeAll, describe, expect, it, jest } from '@jest/globals';
import { Controller, Injectable, Logger, Module, type INestMicroservice } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import {
  ClientProxyFactory,
  Ctx,
  EventPattern,
  MessagePattern,
  Payload,
  Transport,
  type ClientProxy,
  type MicroserviceOptions,
  type RmqContext,
} from '@nestjs/microservices';
import { firstValueFrom } from 'rxjs';
import { connect, type Channel, type ChannelModel } from 'amqplib';
import { randomUUID } from 'node:crypto';
import {
  IdempotencyModule,
  NoRepeatSubmit,
  settleRmqMessage,
  type SkippedMessage,
  type SkippedMessageHandler,
} from '../libs/idempotency/src/index.js';
import { until } from './support/http.js';
import { RABBITMQ_URL, REDIS_URL } from './support/services.js';

interface PaymentEvent {
  messageId?: string;
  orderNo: string;
  delayMs?: number;
  /** The first attempt fails as manual-ack handlers often settle a failure: nack (requeue; `all`: nackAll), return. */
  failFirst?: boolean | 'all';
  /** Acks, then fails: as an ack that throws on a channel that closed mid-handler. */
  failAfterAck?: boolean;
  /** The first attempt fails before its effect, with nothing acked or nacked. */
  throwFirst?: boolean;
  /** Settles with `ackAll()` (every message in flight on the channel), not `ack(message)`. */
  ackAll?: boolean;
  /** Acks, then a later step fails and its catch nacks the message (the broker closes the channel: the tag was acked). */
  ackThenNack?: boolean;
}

@Injectable()
class Handled {
  orders: string[] = [];
  failed = new Set<string>();
  /** @MessagePattern runs begun, and what they wait for before they work (when set). */
  captures = 0;
  gate: Promise<void> | undefined;
  journalAttempts = new Map<string, number>();
  notifierAttempts = new Map<string, number>();
  /** Deliveries acked while the notifier still ran for them. */
  ackedWhileNotifying: string[] = [];
}

@Controller()
class PaymentsConsumer {
  constructor(private readonly handled: Handled) {}

  @EventPattern('payment.succeeded')
  @NoRepeatSubmit({ idempotentKey: '#data.messageId' })
  // `unknown`: Nest 12 types an @EventPattern handler as (data, ...args: unknown[]).
  async paid(@Payload() data: PaymentEvent, @Ctx() ctx: unknown) {
    await new Promise((resolve) => setTimeout(resolve, data.delayMs ?? 0));
    const rmq = ctx as RmqContext;
    if (data.throwFirst && !this.handled.failed.has(data.orderNo)) {
      this.handled.failed.add(data.orderNo);
      throw new Error('failed before its effect');
    }
    if (data.failFirst && !this.handled.failed.has(data.orderNo)) {
      this.handled.failed.add(data.orderNo);
      if (data.failFirst === 'all') rmq.getChannelRef().nackAll(true);
      else rmq.getChannelRef().nack(rmq.getMessage(), false, true);
      return;
    }
    this.handled.orders.push(data.orderNo);
    if (data.ackAll) rmq.getChannelRef().ackAll();
    else rmq.getChannelRef().ack(rmq.getMessage());
    if (data.failAfterAck) throw new Error('Channel closed');
    if (data.ackThenNack) {
      rmq.getChannelRef().nack(rmq.getMessage(), false, true);
      throw new Error('the audit write after the ack failed');
    }
  }

  /** A handler of two object patterns (its keys name the pattern). */
  @EventPattern([{ cmd: 'refund', v: 1 }, { cmd: 'void' }])
  @NoRepeatSubmit({ idempotentKey: '#data.messageId' })
  refund(@Payload() data: PaymentEvent, @Ctx() ctx: unknown) {
    const rmq = ctx as RmqContext;
    this.handled.orders.push(`refund ${data.orderNo}`);
    rmq.getChannelRef().ack(rmq.getMessage());
  }

  @MessagePattern('payment.capture')
  @NoRepeatSubmit({ idempotentKey: '#data.messageId' })
  async capture(@Payload() data: PaymentEvent, @Ctx() ctx: RmqContext) {
    this.handled.captures++;
    await this.handled.gate;
    await new Promise((resolve) => setTimeout(resolve, data.delayMs ?? 0));
    this.handled.orders.push(data.orderNo);
    ctx.getChannelRef().ack(ctx.getMessage());
    return { captured: data.orderNo };
  }
}

/** Two guarded handlers of one event: the ledger acks the message at its end, the mailer leaves it to the ledger. */
@Controller()
class LedgerConsumer {
  constructor(private readonly handled: Handled) {}

  @EventPattern('ledger.posted')
  @NoRepeatSubmit({ idempotentKey: '#data.messageId' })
  post(@Payload() data: PaymentEvent, @Ctx() ctx: unknown) {
    const rmq = ctx as RmqContext;
    this.handled.orders.push(`ledger ${data.orderNo}`);
    rmq.getChannelRef().ack(rmq.getMessage());
  }
}
@Controller()
class MailerConsumer {
  constructor(private readonly handled: Handled) {}

  @EventPattern('ledger.posted')
  @NoRepeatSubmit({ idempotentKey: '#data.messageId' })
  mail(@Payload() data: PaymentEvent) {
    this.handled.orders.push(`mail ${data.orderNo}`);
  }
}

/**
 * Two guarded handlers of one event that share its delivery, as teams split one event's work:
 * the journal settles it (acks at its end, or nacks a failure and returns), the notifier leaves
 * settling to the journal (and may fail by throwing). The notifier notes whether the delivery it
 * runs for was acked while it ran.
 */
interface BooksEvent extends PaymentEvent {
  /** The notifier's first attempts (this many) throw before their effect. */
  notifierFailures?: number;
  /** How each of those attempts fails: by throwing (default), or by `nackAll()` and returning. */
  notifierFailsBy?: ('throw' | 'nackAll')[];
  /** How long the notifier works. */
  notifierMs?: number;
  /** The journal's first attempts (this many) fail: it nacks the message (requeue) and returns. */
  journalFailures?: number;
  /** How long the journal works. */
  journalMs?: number;
}
@Controller()
class JournalConsumer {
  constructor(private readonly handled: Handled) {}

  @EventPattern('books.closed')
  @NoRepeatSubmit({ idempotentKey: '#data.messageId' })
  async journal(@Payload() data: BooksEvent, @Ctx() ctx: unknown) {
    const rmq = ctx as RmqContext;
    await new Promise((resolve) => setTimeout(resolve, data.journalMs ?? 0));
    const attempt = (this.handled.journalAttempts.get(data.orderNo) ?? 0) + 1;
    this.handled.journalAttempts.set(data.orderNo, attempt);
    if (attempt <= (data.journalFailures ?? 0)) {
      rmq.getChannelRef().nack(rmq.getMessage(), false, true);
      return;
    }
    this.handled.orders.push(`journal ${data.orderNo}`);
    rmq.getChannelRef().ack(rmq.getMessage());
  }
}
@Controller()
class NotifierConsumer {
  constructor(private readonly handled: Handled) {}

  @EventPattern('books.closed')
  @NoRepeatSubmit({ idempotentKey: '#data.messageId' })
  async notify(@Payload() data: BooksEvent, @Ctx() ctx: unknown) {
    const rmq = ctx as RmqContext;
    const channel = rmq.getChannelRef() as { ack(message: unknown): void; testAcks?: WeakSet<object> };
    if (!channel.testAcks) {
      const acks = (channel.testAcks = new WeakSet<object>());
      const ack = channel.ack;
      channel.ack = function (this: unknown, message: unknown) {
        acks.add(message as object);
        return ack.call(this, message);
      };
    }
    const attempt = (this.handled.notifierAttempts.get(data.orderNo) ?? 0) + 1;
    this.handled.notifierAttempts.set(data.orderNo, attempt);
    if (attempt <= (data.notifierFailures ?? 0)) {
      if (data.notifierFailsBy?.[attempt - 1] !== 'nackAll') throw new Error('failed before its effect');
      (rmq.getChannelRef() as { nackAll(): void }).nackAll();
      return;
    }
    await new Promise((resolve) => setTimeout(resolve, data.notifierMs ?? 0));
    this.handled.orders.push(`notify ${data.orderNo}`);
    if (channel.testAcks.has(rmq.getMessage() as object)) this.handled.ackedWhileNotifying.push(data.orderNo);
  }
}

/**
 * A guarded handler of an event beside an unguarded one that fails (a metrics hook that throws):
 * Nest runs an event's handlers under one forkJoin, which unsubscribes the others when one fails.
 */
@Controller()
class StockConsumer {
  constructor(private readonly handled: Handled) {}

  @EventPattern('stock.moved')
  @NoRepeatSubmit({ idempotentKey: '#data.messageId' })
  move(@Payload() data: PaymentEvent, @Ctx() ctx: unknown) {
    const rmq = ctx as RmqContext;
    this.handled.orders.push(`stock ${data.orderNo}`);
    rmq.getChannelRef().ack(rmq.getMessage());
  }
}
@Controller()
class StockMetrics {
  @EventPattern('stock.moved')
  count(@Payload() data: PaymentEvent): void {
    throw new Error(`the metrics backend is down (${data.orderNo})`);
  }
}

async function startConsumer(queue: string, onSkippedMessage: SkippedMessageHandler | undefined, prefetchCount = 1) {
  @Module({
    imports: [IdempotencyModule.forRoot({ store: { redis: REDIS_URL }, keyPrefix: `rmq-${randomUUID()}`, onSkippedMessage })],
    controllers: [PaymentsConsumer, LedgerConsumer, MailerConsumer, JournalConsumer, NotifierConsumer, StockConsumer, StockMetrics],
    providers: [Handled],
  })
  class ConsumerModule {}
  const app = await NestFactory.createMicroservice<MicroserviceOptions>(ConsumerModule, {
    transport: Transport.RMQ,
    options: { urls: [RABBITMQ_URL], queue, noAck: false, prefetchCount, queueOptions: { durable: false } },
    logger: ['error'],
  });
  await app.listen();
  return { app, handled: app.get(Handled) };
}

describe('RabbitMQ with manual acks: messages the guard does not hand to the handler', () => {
  let connection: ChannelModel;
  let channel: Channel;
  let consumer: INestMicroservice | undefined;
  let queue: string;
  const publish = (data: PaymentEvent) =>
    channel.sendToQueue(queue, Buffer.from(JSON.stringify({ pattern: 'payment.succeeded', data })));
  /**
   * Messages left once the consumer is gone: the broker puts the ones it never got an ack for
   * back in the queue (its count leaves out unacked messages while their consumer lives).
   */
  const leftAfterClose = async () => {
    await consumer?.close();
    consumer = undefined;
    return (await channel.checkQueue(queue)).messageCount;
  };

  beforeAll(async () => {
    connection = await connect(RABBITMQ_URL);
    channel = await connection.createChannel();
  });
  afterAll(async () => connection?.close());
  afterEach(async () => {
    await consumer?.close();
    consumer = undefined;
    await channel.deleteQueue(queue);
  });

  const startWith = async (onSkipped: SkippedMessageHandler | undefined, prefetch = 1) => {
    queue = `idempotency-test.${randomUUID()}`;
    await channel.assertQueue(queue, { durable: false });
    const started = await startConsumer(queue, onSkipped, prefetch);
    consumer = started.app;
    return started.handled;
  };

  // An adversarial helper (session 19): a handler's ack that threw (its channel had closed
  // mid-handler) or work that failed after the ack released the key, and the redelivery ran the
  // effect again (20 of 40 messages twice when a channel closed). The handler settled its message
  // as done: the run is kept, and the copy is dropped as a duplicate.
  it('keeps the run of a handler that acked its message and then failed: the copy is dropped, the effect happens once', async () => {
    const handled = await startWith(settleRmqMessage);
    const id = randomUUID();
    publish({ messageId: id, orderNo: 'A', failAfterAck: true });
    publish({ messageId: id, orderNo: 'A', failAfterAck: true }); // the redelivery
    publish({ messageId: randomUUID(), orderNo: 'B' });
    await until(() => handled.orders.includes('B'), 10_000);
    expect({ orders: handled.orders, left: await leftAfterClose() }).toEqual({ orders: ['A', 'B'], left: 0 });
  });

  // An adversarial helper (session 19), against the fix above: a handler that worked, acked, and
  // nacked in its catch (`try { work; ack } catch { nack }`) counted as nacked, so its key was
  // released and the producer's retry (or, on a closed channel, the redelivery) ran it again.
  it('keeps the run of a handler that acked and then nacked its message in its catch: the retry is dropped', async () => {
    const handled = await startWith(settleRmqMessage);
    const id = randomUUID();
    publish({ messageId: id, orderNo: 'A', ackThenNack: true });
    await until(() => handled.orders.includes('A'), 10_000);
    await new Promise((resolve) => setTimeout(resolve, 200)); // its failure settles the key
    publish({ messageId: id, orderNo: 'A', ackThenNack: true }); // the producer's retry
    publish({ messageId: randomUUID(), orderNo: 'B' });
    // The nack of an acked tag makes the broker close the channel: Nest opens another.
    await until(() => handled.orders.includes('B'), 20_000);
    expect(handled.orders).toEqual(['A', 'B']);
  }, 30_000);

  // An adversarial helper (session 19), against the fix above when it counted any ackAll() on the
  // channel: another handler's ackAll() while this one failed before its effect saved the failed
  // run as done, and the message was lost (its redelivery, or the producer's retry, dropped).
  it("takes another handler's ackAll() for no settlement of a run that failed: the producer's retry runs it", async () => {
    const handled = await startWith(settleRmqMessage, 2);
    const id = randomUUID();
    publish({ messageId: id, orderNo: 'A', throwFirst: true, delayMs: 400 });
    publish({ messageId: randomUUID(), orderNo: 'C', ackAll: true, delayMs: 50 });
    await until(() => handled.failed.has('A') && handled.orders.includes('C'), 10_000);
    await new Promise((resolve) => setTimeout(resolve, 200)); // A's failure settles its key
    publish({ messageId: id, orderNo: 'A' }); // the producer's retry
    await until(() => handled.orders.includes('A'), 10_000);
    expect({ orders: handled.orders, left: await leftAfterClose() }).toEqual({ orders: ['C', 'A'], left: 0 });
  });

  // An adversarial helper (session 19): the pattern in a key was the string as sent, and a copy
  // whose object pattern named its keys in another order (a publisher other than Nest's client)
  // ran again, though Nest routes both to the one handler.
  it('keys an object pattern by its fields, in any order they come: the copy is dropped', async () => {
    const handled = await startWith(settleRmqMessage);
    const id = randomUUID();
    const send = (pattern: object, orderNo: string, messageId = id) =>
      channel.sendToQueue(queue, Buffer.from(JSON.stringify({ pattern, data: { messageId, orderNo } })));
    send({ cmd: 'refund', v: 1 }, 'R');
    send({ v: 1, cmd: 'refund' }, 'R');
    send({ cmd: 'refund', v: 1 }, 'marker', randomUUID());
    await until(() => handled.orders.includes('refund marker'), 10_000);
    expect({ orders: handled.orders, left: await leftAfterClose() }).toEqual({ orders: ['refund R', 'refund marker'], left: 0 });
  });

  it('acks a duplicate event it drops, so the next message is handled (settleRmqMessage)', async () => {
    const handled = await startWith(settleRmqMessage);
    const id = randomUUID();
    publish({ messageId: id, orderNo: 'A' });
    publish({ messageId: id, orderNo: 'A' }); // the producer's retry
    publish({ messageId: randomUUID(), orderNo: 'B' });
    await until(() => handled.orders.length === 2, 10_000);
    expect({ orders: handled.orders, left: await leftAfterClose() }).toEqual({ orders: ['A', 'B'], left: 0 });
  });

  // An adversarial helper: two guarded handlers of one event both replayed a duplicate, and
  // settleRmqMessage acked the delivery once for each: the broker closed the channel on the
  // second ack (406 PRECONDITION_FAILED, unknown delivery tag), and every unacked message on it
  // went back to the queue. A delivery is settled once.
  it('acks a duplicate once when two guarded handlers of its event both replay it (settleRmqMessage)', async () => {
    const errors = jest.spyOn(Logger.prototype, 'error').mockImplementation(() => undefined);
    try {
      const handled = await startWith(settleRmqMessage);
      const send = (data: PaymentEvent) => channel.sendToQueue(queue, Buffer.from(JSON.stringify({ pattern: 'ledger.posted', data })));
      const id = randomUUID();
      send({ messageId: id, orderNo: 'L1' });
      await until(() => handled.orders.length === 2, 10_000);
      send({ messageId: id, orderNo: 'L1' }); // the producer's retry: both handlers replay it
      send({ messageId: randomUUID(), orderNo: 'L2' });
      await until(() => handled.orders.length === 4, 10_000);
      expect([...handled.orders].sort()).toEqual(['ledger L1', 'ledger L2', 'mail L1', 'mail L2']);
      expect(await leftAfterClose()).toBe(0);
      // Observed before: "onSkippedMessage failed ... Channel closed" and the transport's reconnection.
      expect(errors.mock.calls.map(([message]) => String(message)).filter((message) => /onSkippedMessage|Disconnected|PRECONDITION/i.test(message))).toEqual([]);
    } finally {
      errors.mockRestore();
    }
  });

  // An adversarial helper (session 32): one handler's nack was taken for the failure of every
  // guarded handler of the delivery, so the notifier, which had done its work, was freed and ran
  // again on the redelivery (20 runs for 10 keys). A nack counts for the run that made it.
  it("takes one handler's nack for its own failure only: the other handler of the event runs once", async () => {
    const errors = jest.spyOn(Logger.prototype, 'error').mockImplementation(() => undefined);
    try {
      const handled = await startWith(settleRmqMessage, 4);
      const send = (data: BooksEvent) => channel.sendToQueue(queue, Buffer.from(JSON.stringify({ pattern: 'books.closed', data })));
      for (let i = 0; i < 5; i++) send({ messageId: randomUUID(), orderNo: `N${i}`, journalFailures: 2, journalMs: 150, notifierMs: 300 });
      await until(() => handled.orders.filter((order) => order.startsWith('journal')).length === 5, 15_000);
      await new Promise((resolve) => setTimeout(resolve, 500));
      const expected = [0, 1, 2, 3, 4].flatMap((i) => [`journal N${i}`, `notify N${i}`]).sort();
      expect({ orders: [...handled.orders].sort(), left: await leftAfterClose() }).toEqual({ orders: expected, left: 0 });
      expect(errors.mock.calls.map(([message]) => String(message)).filter((message) => /onSkippedMessage|Disconnected|PRECONDITION/i.test(message))).toEqual([]);
    } finally {
      errors.mockRestore();
    }
  });

  // The same helper: the producer's retry of an event whose notifier had failed was acked as the
  // journal replayed it, while the notifier ran it again: a crash then lost the notifier's run (the
  // broker had nothing to redeliver). The delivery is settled once every guarded handler of it is done.
  it('settles a delivery one handler replays only once another handler that runs it is done', async () => {
    const errors = jest.spyOn(Logger.prototype, 'error').mockImplementation(() => undefined);
    try {
      const handled = await startWith(settleRmqMessage, 4);
      const send = (data: BooksEvent) => channel.sendToQueue(queue, Buffer.from(JSON.stringify({ pattern: 'books.closed', data })));
      const ids = [0, 1, 2, 3, 4].map(() => randomUUID());
      ids.forEach((messageId, i) => send({ messageId, orderNo: `R${i}`, notifierFailures: 1, notifierMs: 300 }));
      await until(() => handled.orders.length === 5 && handled.notifierAttempts.size === 5, 15_000);
      // The producer's retries: the journal replays each, the notifier runs each again (300 ms).
      ids.forEach((messageId, i) => send({ messageId, orderNo: `R${i}`, notifierFailures: 1, notifierMs: 300 }));
      await until(() => handled.orders.length === 10, 15_000);
      await new Promise((resolve) => setTimeout(resolve, 300));
      const expected = [0, 1, 2, 3, 4].flatMap((i) => [`journal R${i}`, `notify R${i}`]).sort();
      expect({ orders: [...handled.orders].sort(), ackedWhileNotifying: handled.ackedWhileNotifying, left: await leftAfterClose() }).toEqual({
        orders: expected,
        ackedWhileNotifying: [],
        left: 0,
      });
      expect(errors.mock.calls.map(([message]) => String(message)).filter((message) => /onSkippedMessage|Disconnected|PRECONDITION/i.test(message))).toEqual([]);
    } finally {
      errors.mockRestore();
    }
  });

  // The same: a copy the journal replayed was acked while the notifier ran it again, and when that
  // run failed too, nothing was left to run it a third time (the notifier never ran).
  it('puts back a delivery one handler replayed when another handler of it ran it again and failed', async () => {
    const handled = await startWith(settleRmqMessage, 4);
    const send = (data: BooksEvent) => channel.sendToQueue(queue, Buffer.from(JSON.stringify({ pattern: 'books.closed', data })));
    const event = { messageId: randomUUID(), orderNo: 'T', notifierFailures: 2 };
    send(event);
    await until(() => handled.notifierAttempts.get('T') === 1 && handled.orders.length === 1, 10_000);
    send(event); // the producer's retry: the journal replays it, the notifier fails again
    await until(() => handled.orders.length === 2, 10_000);
    await new Promise((resolve) => setTimeout(resolve, 300));
    expect({ orders: handled.orders, attempts: handled.notifierAttempts.get('T'), left: await leftAfterClose() }).toEqual({
      orders: ['journal T', 'notify T'],
      attempts: 3,
      left: 0,
    });
  });

  // An adversarial reviewer: deferred until every guarded handler was done, the ack of a copy the
  // journal replayed came after the notifier had nacked it with nackAll(): 406, the channel closed.
  it("never settles a delivery another handler of it settled with nackAll(): the rerun comes back, one channel", async () => {
    const errors = jest.spyOn(Logger.prototype, 'error').mockImplementation(() => undefined);
    try {
      const handled = await startWith(settleRmqMessage, 4);
      const send = (data: BooksEvent) => channel.sendToQueue(queue, Buffer.from(JSON.stringify({ pattern: 'books.closed', data })));
      const event: BooksEvent = { messageId: randomUUID(), orderNo: 'A', notifierFailures: 2, notifierFailsBy: ['throw', 'nackAll'] };
      send(event);
      await until(() => handled.orders.length === 1 && handled.notifierAttempts.get('A') === 1, 10_000);
      send(event); // the producer's retry: the journal replays it, the notifier fails with nackAll()
      await until(() => handled.orders.length === 2, 10_000);
      await new Promise((resolve) => setTimeout(resolve, 500));
      expect({ orders: [...handled.orders].sort(), attempts: handled.notifierAttempts.get('A'), left: await leftAfterClose() }).toEqual({
        orders: ['journal A', 'notify A'],
        attempts: 3,
        left: 0,
      });
      expect(errors.mock.calls.map(([message]) => String(message)).filter((message) => /onSkippedMessage|Disconnected|PRECONDITION|closed/i.test(message))).toEqual([]);
    } finally {
      errors.mockRestore();
    }
  });

  // An adversarial helper: an unguarded handler of the event that threw made Nest's forkJoin
  // unsubscribe the guarded one while its claim was on its way, and the guard took that for a
  // caller gone: the key was freed, the handler never ran, and nothing settled the message (0 of
  // 20 ran, the prefetch held); a copy was never replayed nor acked. An event's run is nobody's to cancel.
  it("runs a guarded handler of an event whose other handler throws, and settles its copies", async () => {
    const errors = jest.spyOn(Logger.prototype, 'error').mockImplementation(() => undefined);
    try {
      const handled = await startWith(settleRmqMessage, 10);
      const send = (data: PaymentEvent) => channel.sendToQueue(queue, Buffer.from(JSON.stringify({ pattern: 'stock.moved', data })));
      const ids = [0, 1, 2, 3, 4].map(() => randomUUID());
      ids.forEach((messageId, i) => send({ messageId, orderNo: `S${i}` }));
      await until(() => handled.orders.length === 5, 10_000);
      ids.forEach((messageId, i) => send({ messageId, orderNo: `S${i}` })); // copies: replayed and acked
      await new Promise((resolve) => setTimeout(resolve, 500));
      expect({ orders: [...handled.orders].sort(), left: await leftAfterClose() }).toEqual({ orders: ['S0', 'S1', 'S2', 'S3', 'S4'].map((no) => `stock ${no}`), left: 0 });
    } finally {
      errors.mockRestore();
    }
  });

  // The handler settles a failure itself and returns (no throw): the guard must not record the
  // message as handled, or the requeued copy is dropped as a replay and the message is lost
  // (found by an adversarial helper).
  it.each([
    ['nack', true],
    ['nackAll', 'all'],
  ] as const)('takes a message the handler nacked for requeue (%s) as not handled: the redelivery runs it', async (_how, failFirst) => {
    const handled = await startWith(settleRmqMessage);
    publish({ messageId: randomUUID(), orderNo: 'F', failFirst });
    await until(() => handled.orders.length === 1, 10_000);
    expect({ failed: [...handled.failed], orders: handled.orders, left: await leftAfterClose() }).toEqual({ failed: ['F'], orders: ['F'], left: 0 });
  });

  it('drops (nacks) a message it rejects, without a key, and goes on', async () => {
    const handled = await startWith(settleRmqMessage);
    publish({ orderNo: 'no key' });
    publish({ messageId: randomUUID(), orderNo: 'C' });
    await until(() => handled.orders.length === 1, 10_000);
    expect({ orders: handled.orders, left: await leftAfterClose() }).toEqual({ orders: ['C'], left: 0 });
  });

  it('returns an event that arrives while the first copy runs to the queue after a pause, and acks it once the first is done', async () => {
    const skips: SkippedMessage[] = [];
    const handled = await startWith((ctx, skipped) => {
      skips.push(skipped);
      return settleRmqMessage(ctx, skipped);
    }, 2);
    const id = randomUUID();
    publish({ messageId: id, orderNo: 'D', delayMs: 300 });
    publish({ messageId: id, orderNo: 'D', delayMs: 300 });
    await until(() => skips.some((skip) => skip.reason === 'replayed'), 10_000);
    const reasons = skips.map((skip) => skip.reason);
    expect({
      orders: handled.orders,
      firstSkip: reasons[0],
      lastSkip: reasons.at(-1),
      // Requeued at once, the copy went round thousands of times while the first ran.
      requeuedAtMost3Times: reasons.filter((reason) => reason === 'in_progress').length <= 3,
      left: await leftAfterClose(),
    }).toEqual({ orders: ['D'], firstSkip: 'in_progress', lastSkip: 'replayed', requeuedAtMost3Times: true, left: 0 });
  });

  it('acks a @MessagePattern copy answered "in progress" (its sender retries): one reply, no redelivery', async () => {
    const skips: SkippedMessage[] = [];
    const handled = await startWith((ctx, skipped) => {
      skips.push(skipped);
      return settleRmqMessage(ctx, skipped);
    }, 2);
    const client: ClientProxy = ClientProxyFactory.create({ transport: Transport.RMQ, options: { urls: [RABBITMQ_URL], queue, queueOptions: { durable: false } } });
    try {
      const id = randomUUID();
      const send = () => firstValueFrom(client.send('payment.capture', { messageId: id, orderNo: 'G' })).catch((error: unknown) => error);
      // The first runs until the copy was answered (a 500 ms handler, with the copy sent 100 ms
      // after it, let a loaded machine claim the copy first).
      let open: () => void = () => undefined;
      handled.gate = new Promise((resolve) => (open = resolve));
      const first = send();
      await until(() => handled.captures === 1, 10_000);
      const copy = await send();
      open();
      expect(await first).toEqual({ captured: 'G' });
      expect(copy).toMatchObject({ code: 'IDEMPOTENCY_IN_PROGRESS' });
      // A redelivery of the copy, were it not acked, would come back now.
      await new Promise((resolve) => setTimeout(resolve, 700));
      expect({ orders: handled.orders, skips: skips.map(({ reason, answered }) => `${reason} ${answered}`), left: await leftAfterClose() }).toEqual({
        orders: ['G'],
        skips: ['in_progress true'],
        left: 0,
      });
    } finally {
      await client.close();
    }
  });

  it('(without onSkippedMessage) the dropped duplicate stays unacked and the next message is never handled', async () => {
    const handled = await startWith(undefined);
    const id = randomUUID();
    publish({ messageId: id, orderNo: 'E' });
    publish({ messageId: id, orderNo: 'E' });
    publish({ messageId: randomUUID(), orderNo: 'F' });
    await new Promise((resolve) => setTimeout(resolve, 1500));
    expect({ orders: handled.orders, left: await leftAfterClose() }).toEqual({ orders: ['E'], left: 2 });
  });
});
