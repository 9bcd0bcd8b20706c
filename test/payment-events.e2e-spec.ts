import { afterAll, afterEach, beforeAll, describe, expect, it } from '@jest/globals';
import type { INestApplication, LoggerService } from '@nestjs/common';
import { connect, type ChannelModel, type ConfirmChannel, type Options } from 'amqplib';
import { randomUUID } from 'node:crypto';
import request from 'supertest';
import { DataSource } from 'typeorm';
import { createDemoApp, type HttpAdapterName } from '../apps/demo/src/demo-app.factory.js';
import { PaymentEventsConsumer } from '../apps/demo/src/payments/payment-events.consumer.js';
import type { PaymentEventsFaults } from '../apps/demo/src/payments/payment-events.options.js';
import { eventually } from './support/eventually.js';
import { freePort } from './support/redis-server.js';
import { DATABASE_URL, RABBITMQ_URL } from './support/services.js';

const CONSUMER = 'orders.payment-succeeded';

/** A Nest logger that keeps every line (`<level> <message> <context>`) for the test to read. */
class CapturingLogger implements LoggerService {
  readonly lines: string[] = [];
  private keep = (level: string) => (...args: unknown[]) => void this.lines.push(`${level} ${args.map(String).join(' ')}`);
  log = this.keep('log');
  error = this.keep('error');
  warn = this.keep('warn');
  debug = this.keep('debug');
  verbose = this.keep('verbose');
  fatal = this.keep('fatal');
}

interface StartOptions {
  faults?: PaymentEventsFaults;
  deadLetters?: boolean;
  maxAttempts?: number;
  logger?: LoggerService;
}

/**
 * The `payment.succeeded` consumer: consumeOnce (consume log row + order change in one
 * transaction) makes every redelivery of a message id a no-op, and ack after commit makes every
 * failure a redelivery. Each test has its own queue and waits by polling the database.
 */
describe.each<HttpAdapterName>(['express', 'fastify'])('payment.succeeded consumer (%s)', (adapter) => {
  let broker: ChannelModel;
  let publisher: ConfirmChannel;
  let app: INestApplication | undefined;
  let queue: string;
  let deadLetterQueue: string | undefined;

  beforeAll(async () => {
    try {
      broker = await connect(RABBITMQ_URL, { timeout: 2000 });
    } catch (error) {
      throw new Error(`RabbitMQ is not reachable at ${RABBITMQ_URL} (set RABBITMQ_URL)`, { cause: error });
    }
    publisher = await broker.createConfirmChannel();
  });
  afterAll(async () => broker?.close());
  afterEach(async () => {
    await app?.close();
    app = undefined;
    await publisher.deleteQueue(queue);
    if (deadLetterQueue) await publisher.deleteQueue(deadLetterQueue);
    deadLetterQueue = undefined;
  });

  const start = async (faults?: PaymentEventsFaults) => startWith({ faults });
  const startWith = async ({ faults, deadLetters, maxAttempts, logger }: StartOptions) => {
    queue = `payment.succeeded.${randomUUID()}`;
    if (deadLetters) deadLetterQueue = `${queue}.dead`;
    app = await createDemoApp({
      adapter,
      databaseUrl: DATABASE_URL,
      keyPrefix: `events-${randomUUID()}`,
      rabbitmqUrl: RABBITMQ_URL,
      paymentQueue: queue,
      paymentDeadLetterQueue: deadLetterQueue,
      paymentMaxAttempts: maxAttempts,
      paymentRequeueDelayMs: maxAttempts === undefined ? undefined : 50,
      paymentEventsFaults: faults,
      logger: logger ?? false,
    });
    return app.get(PaymentEventsConsumer).stats;
  };
  /** The message ids in the dead-letter queue, once it holds `count` messages. */
  const deadLettered = async (count: number): Promise<string[]> => {
    await eventually(async () => (await publisher.checkQueue(deadLetterQueue!)).messageCount === count, {
      describe: () => `(${deadLetterQueue} should hold ${count})`,
    });
    const ids: string[] = [];
    for (let message = await publisher.get(deadLetterQueue!, { noAck: true }); message; message = await publisher.get(deadLetterQueue!, { noAck: true })) {
      ids.push(message.properties.messageId as string);
    }
    return ids;
  };
  const newOrder = async (): Promise<string> => {
    const orderNo = `EVT-${randomUUID()}`;
    await request(app!.getHttpServer()).post('/orders').set('X-User-Id', 'alice').send({ orderNo, amount: 5 }).expect(201);
    return orderNo;
  };
  const publish = async (content: string | object, properties: Options.Publish = {}) => {
    const body = typeof content === 'string' ? content : JSON.stringify(content);
    publisher.sendToQueue(queue, Buffer.from(body), { persistent: true, contentType: 'application/json', ...properties });
    await publisher.waitForConfirms();
  };
  const db = () => app!.get(DataSource);
  const order = async (orderNo: string) =>
    (await db().query('select status, transaction_id, version from orders where order_no = $1', [orderNo]))[0];
  const logRows = async (messageId: string): Promise<number> =>
    (
      await db().query('select count(*)::int as n from idempotency_consume_log where consumer = $1 and message_id = $2', [
        CONSUMER,
        messageId,
      ])
    )[0].n;
  /** Closes the app (the consumer's channel: unacked messages go back to the queue), then counts what is left. */
  const messagesLeftAfterClose = async (): Promise<number> => {
    await app!.close();
    app = undefined;
    return (await publisher.checkQueue(queue)).messageCount;
  };

  it('applies a message published twice with the same messageId once', async () => {
    const stats = await start();
    const orderNo = await newOrder();
    const messageId = randomUUID();
    const event = { orderNo, transactionId: 'tx-event', paidAt: '2026-11-30T10:00:00Z' };
    await publish(event, { messageId });
    await publish(event, { messageId });

    await eventually(async () => (await order(orderNo)).status === 'PAID');
    await eventually(() => stats.processed + stats.duplicates === 2, { describe: () => JSON.stringify(stats) });
    expect(stats).toMatchObject({ processed: 1, duplicates: 1, dropped: 0, requeued: 0 });
    expect(await order(orderNo)).toEqual({ status: 'PAID', transaction_id: 'tx-event', version: 2 });
    expect(await logRows(messageId)).toBe(1);
    expect(await messagesLeftAfterClose()).toBe(0);
  });

  it('skips a message redelivered after its commit (nacked before the ack) and acks it', async () => {
    const stats = await start({ nackAfterCommitOnce: true });
    const orderNo = await newOrder();
    const messageId = randomUUID();
    await publish({ orderNo, transactionId: 'tx-once', paidAt: '2026-11-30T10:00:00Z' }, { messageId });

    await eventually(() => stats.duplicates === 1, { describe: () => JSON.stringify(stats) });
    expect(stats).toMatchObject({ processed: 1, duplicates: 1, redelivered: 1, requeued: 0 });
    expect(await order(orderNo)).toEqual({ status: 'PAID', transaction_id: 'tx-once', version: 2 });
    expect(await logRows(messageId)).toBe(1);
    expect(await messagesLeftAfterClose()).toBe(0);
  });

  it('rolls back the consume log with the order when processing fails, and applies the redelivery', async () => {
    const stats = await start({ failInTransactionOnce: true });
    const orderNo = await newOrder();
    const messageId = randomUUID();
    await publish({ orderNo, transactionId: 'tx-retry', paidAt: '2026-11-30T10:00:00Z' }, { messageId });

    await eventually(async () => (await order(orderNo)).status === 'PAID', { describe: () => JSON.stringify(stats) });
    // The count follows the commit by a moment.
    await eventually(() => stats.processed === 1, { describe: () => JSON.stringify(stats) });
    // Had the log row survived the failed attempt, the redelivery would have been skipped.
    expect(stats).toMatchObject({ processed: 1, duplicates: 0, requeued: 1, redelivered: 1 });
    expect(await order(orderNo)).toEqual({ status: 'PAID', transaction_id: 'tx-retry', version: 2 });
    expect(await logRows(messageId)).toBe(1);
    expect(await messagesLeftAfterClose()).toBe(0);
  });

  it('rejects messages without a messageId or with a bad body without requeue, and carries on', async () => {
    const stats = await start();
    const orderNo = await newOrder();
    const valid = { orderNo, transactionId: 'tx-valid', paidAt: '2026-11-30T10:00:00Z' };
    await publish(valid); // no messageId
    await publish('{"orderNo":', { messageId: randomUUID() });
    await publish('[1,2]', { messageId: randomUUID() });
    await publish({ ...valid, paidAt: 'yesterday' }, { messageId: randomUUID() });
    await publish({ ...valid, transactionId: '' }, { messageId: randomUUID() });
    expect((await order(orderNo)).status).toBe('PENDING');

    const messageId = randomUUID();
    await publish(valid, { messageId });
    await eventually(async () => (await logRows(messageId)) === 1);
    await eventually(() => stats.dropped === 5, { describe: () => JSON.stringify(stats) });
    await eventually(() => stats.processed === 1, { describe: () => JSON.stringify(stats) });
    expect(stats).toMatchObject({ processed: 1, dropped: 5, requeued: 0, redelivered: 0 });
    expect(await order(orderNo)).toEqual({ status: 'PAID', transaction_id: 'tx-valid', version: 2 });
    expect(await messagesLeftAfterClose()).toBe(0);
  });

  it('dead-letters at once a message PostgreSQL could not store (a NUL in its messageId or a field), logs it, and carries on', async () => {
    const logger = new CapturingLogger();
    const stats = await startWith({ deadLetters: true, logger });
    const orderNo = await newOrder();
    const valid = { orderNo, transactionId: 'tx-valid', paidAt: '2026-11-30T10:00:00Z' };
    const nulInTransaction = randomUUID();
    const nulInOrderNo = randomUUID();
    await publish(valid, { messageId: 'pay\u0000ment' });
    await publish({ ...valid, transactionId: 'tx\u0000' }, { messageId: nulInTransaction });
    await publish({ ...valid, orderNo: `${orderNo}\u0000` }, { messageId: nulInOrderNo });
    const messageId = randomUUID();
    await publish(valid, { messageId });

    await eventually(async () => (await logRows(messageId)) === 1, { describe: () => JSON.stringify(stats) });
    await eventually(() => stats.dropped === 3, { describe: () => JSON.stringify(stats) });
    await eventually(() => stats.processed === 1, { describe: () => JSON.stringify(stats) });
    expect(stats).toMatchObject({ processed: 1, dropped: 3, requeued: 0, failed: 0 });
    expect(await order(orderNo)).toEqual({ status: 'PAID', transaction_id: 'tx-valid', version: 2 });
    expect((await deadLettered(3)).sort()).toEqual(['pay\u0000ment', nulInTransaction, nulInOrderNo].sort());
    const rejections = logger.lines.filter((line) => line.startsWith('warn Rejected'));
    expect(rejections).toEqual([
      expect.stringMatching(/messageId "pay\\u0000ment" cannot be recorded/),
      expect.stringContaining(`message ${nulInTransaction}: transactionId must not contain control characters`),
      expect.stringContaining(`message ${nulInOrderNo}: orderNo must be`),
    ]);
    expect(await messagesLeftAfterClose()).toBe(0);
  });

  it('gives up on a message that fails every time after maxAttempts: dead-lettered, logged, and the next message is processed', async () => {
    const logger = new CapturingLogger();
    const poisonId = randomUUID();
    const stats = await startWith({ deadLetters: true, logger, maxAttempts: 3, faults: { alwaysFailMessageIds: [poisonId] } });
    const poisoned = await newOrder();
    const orderNo = await newOrder();
    await publish({ orderNo: poisoned, transactionId: 'tx-poison', paidAt: '2026-11-30T10:00:00Z' }, { messageId: poisonId });
    const messageId = randomUUID();
    await publish({ orderNo, transactionId: 'tx-next', paidAt: '2026-11-30T10:00:00Z' }, { messageId });

    await eventually(() => stats.failed === 1, { describe: () => JSON.stringify(stats) });
    await eventually(async () => (await logRows(messageId)) === 1, { describe: () => JSON.stringify(stats) });
    await eventually(() => stats.processed === 1, { describe: () => JSON.stringify(stats) });
    expect(stats).toMatchObject({ processed: 1, failed: 1, requeued: 2, dropped: 0 });
    expect(await deadLettered(1)).toEqual([poisonId]);
    expect(await order(poisoned)).toEqual({ status: 'PENDING', transaction_id: null, version: 1 });
    expect(await logRows(poisonId)).toBe(0);
    expect(await order(orderNo)).toEqual({ status: 'PAID', transaction_id: 'tx-next', version: 2 });
    expect(logger.lines.filter((line) => line.includes(poisonId))).toEqual([
      expect.stringMatching(/^warn Message .* failed \(attempt 1 of 3\) and is put back/),
      expect.stringMatching(/^warn Message .* failed \(attempt 2 of 3\) and is put back/),
      expect.stringMatching(new RegExp(`^error Gave up on message ${poisonId} after 3 failed attempts .*rejected without requeue, dead-lettered to ${deadLetterQueue}`)),
    ]);
    expect(await messagesLeftAfterClose()).toBe(0);
  });

  it('dead-letters on its first failure a message whose data PostgreSQL refuses (a validation gap): no retry can fix it', async () => {
    const logger = new CapturingLogger();
    const refusedId = randomUUID();
    const stats = await startWith({ deadLetters: true, logger, faults: { refusedByPostgresMessageIds: [refusedId] } });
    const refused = await newOrder();
    await publish({ orderNo: refused, transactionId: 'tx-refused', paidAt: '2026-11-30T10:00:00Z' }, { messageId: refusedId });

    await eventually(() => stats.failed === 1, { describe: () => JSON.stringify(stats) });
    expect(stats).toMatchObject({ processed: 0, failed: 1, requeued: 0 });
    expect(await deadLettered(1)).toEqual([refusedId]);
    expect(await order(refused)).toEqual({ status: 'PENDING', transaction_id: null, version: 1 });
    expect(logger.lines.filter((line) => line.includes(refusedId))).toEqual([
      expect.stringMatching(new RegExp(`^error Gave up on message ${refusedId} after PostgreSQL refused its data \\(invalid byte sequence`)),
    ]);
    expect(await messagesLeftAfterClose()).toBe(0);
  });

  it('acks a payment for an unknown or cancelled order once, changing nothing', async () => {
    const stats = await start();
    const cancelled = await newOrder();
    await request(app!.getHttpServer()).post(`/orders/${cancelled}/cancel`).expect(200);
    const unknownId = randomUUID();
    const cancelledId = randomUUID();
    await publish({ orderNo: `NOPE-${randomUUID()}`, transactionId: 'tx-x', paidAt: '2026-11-30T10:00:00Z' }, { messageId: unknownId });
    await publish({ orderNo: cancelled, transactionId: 'tx-y', paidAt: '2026-11-30T10:00:00Z' }, { messageId: cancelledId });

    await eventually(async () => (await logRows(unknownId)) + (await logRows(cancelledId)) === 2);
    // The consume log commits before the consumer counts the message: wait for the count too.
    await eventually(() => stats.processed === 2, { describe: () => JSON.stringify(stats) });
    expect(stats).toMatchObject({ processed: 2, requeued: 0 });
    expect(await order(cancelled)).toEqual({ status: 'CANCELLED', transaction_id: null, version: 2 });
    expect(await messagesLeftAfterClose()).toBe(0);
  });
});

describe('the payment.succeeded consumer switched off or unreachable', () => {
  it('is off without a RabbitMQ URL, and the app starts', async () => {
    const app = await createDemoApp({ adapter: 'express', databaseUrl: DATABASE_URL, logger: false });
    try {
      expect(() => app.get(PaymentEventsConsumer)).toThrow();
      await request(app.getHttpServer()).get(`/orders/NOPE-${randomUUID()}`).expect(404);
    } finally {
      await app.close();
    }
  });

  it('fails the start-up within seconds, naming the URL without its password, when RabbitMQ is unreachable', async () => {
    const url = `amqp://guest:secret@127.0.0.1:${await freePort()}`;
    const started = Date.now();
    const failure = await createDemoApp({ adapter: 'express', databaseUrl: DATABASE_URL, rabbitmqUrl: url, logger: false }).then(
      () => undefined,
      (error: unknown) => error as Error,
    );
    expect(failure?.message).toMatch(/RabbitMQ at amqp:\/\/guest:\*\*\*@127\.0\.0\.1:\d+/);
    expect(failure?.message).not.toContain('secret');
    expect(Date.now() - started).toBeLessThan(10_000);
  });
});
