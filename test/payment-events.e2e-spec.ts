import { afterAll, afterEach, beforeAll, describe, expect, it } from '@jest/globals';
import type { INestApplication } from '@nestjs/common';
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
  });

  const start = async (faults?: PaymentEventsFaults) => {
    queue = `payment.succeeded.${randomUUID()}`;
    app = await createDemoApp({
      adapter,
      databaseUrl: DATABASE_URL,
      keyPrefix: `events-${randomUUID()}`,
      rabbitmqUrl: RABBITMQ_URL,
      paymentQueue: queue,
      paymentEventsFaults: faults,
      logger: false,
    });
    return app.get(PaymentEventsConsumer).stats;
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
    expect(stats).toMatchObject({ processed: 1, dropped: 5, requeued: 0, redelivered: 0 });
    expect(await order(orderNo)).toEqual({ status: 'PAID', transaction_id: 'tx-valid', version: 2 });
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
