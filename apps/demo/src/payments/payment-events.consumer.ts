import {
  Inject,
  Injectable,
  Logger,
  type BeforeApplicationShutdown,
  type OnApplicationBootstrap,
} from '@nestjs/common';
import { connect, type Channel, type ChannelModel, type ConsumeMessage, type RecoveringChannelModel } from 'amqplib';
import { setTimeout as sleep } from 'node:timers/promises';
import { DataSource, type Repository } from 'typeorm';
import { consumeOnce } from 'nestjs-idempotency/typeorm';
import { Order } from '../orders/order.entity.js';
import { markPaid } from '../orders/order-transitions.js';
import { STORABLE_TEXT } from '../storable-text.js';
import { FailedAttempts, isDataException } from './failed-attempts.js';
import {
  DEFAULT_MAX_ATTEMPTS,
  PAYMENT_EVENTS_OPTIONS,
  PAYMENT_SUCCEEDED_CONSUMER,
  type PaymentEventsFaults,
  type PaymentEventsOptions,
} from './payment-events.options.js';
import { parsePaymentSucceeded, type PaymentSucceededEvent } from './payment-succeeded.event.js';
import { redactUrl } from '../redact-url.js';

/** What the consumer did with the messages it got, since it started. */
export interface PaymentEventsStats {
  /** Handled for the first time (the consume log row and the order change committed together). */
  processed: number;
  /** Already in the consume log: acknowledged without doing anything. */
  duplicates: number;
  /** Rejected without requeue (no messageId, not JSON, bad fields): dead-lettered or dropped. */
  dropped: number;
  /** Processing failed and rolled back: put back on the queue. */
  requeued: number;
  /**
   * Processing failed for good (`maxAttempts` times, or on data PostgreSQL refuses): rejected
   * without requeue, so dead-lettered (or dropped when the queue has no dead-letter route).
   */
  failed: number;
  /** Deliveries the broker flagged as redelivered. */
  redelivered: number;
}

/** The consume log's `message_id` column is 255 characters wide (AMQP's own limit is 255 bytes). */
const MAX_MESSAGE_ID_LENGTH = 255;

/**
 * Consumes `payment.succeeded` messages and marks their orders paid, exactly once per AMQP
 * `messageId`: the consume log row and the order's change commit in one transaction
 * (`consumeOnce`), and the message is acknowledged only after that commit. A redelivery (the
 * broker lost the ack, the process died between commit and ack, a publisher sent it twice) finds
 * the consume log row and is acknowledged without effect.
 *
 * - no `messageId`, one PostgreSQL could not store (over 255 characters, a NUL), or a body that
 *   is not a valid event: logged and rejected without requeue, so it goes to the dead-letter
 *   queue (`deadLetterQueue`, or the dead-letter exchange a policy sets), else it is dropped;
 * - the order is unknown, already paid, or cancelled: logged, recorded as handled, acknowledged;
 * - processing fails: rolled back, then nacked with requeue after `requeueDelayMs`; a message
 *   that fails `maxAttempts` times (while the database answers), or whose data PostgreSQL
 *   refuses, is logged as an error and rejected without requeue: a poison message does not
 *   circle forever, and the messages behind it are processed.
 *
 * amqplib's connection recovery reconnects and consumes again after a broker restart; unacked
 * deliveries of the lost channel come back as redeliveries.
 */
@Injectable()
export class PaymentEventsConsumer implements OnApplicationBootstrap, BeforeApplicationShutdown {
  readonly stats: PaymentEventsStats = { processed: 0, duplicates: 0, dropped: 0, requeued: 0, failed: 0, redelivered: 0 };
  private readonly logger = new Logger('PaymentEvents');
  private readonly queue: string;
  private readonly faults: PaymentEventsFaults;
  private connection?: RecoveringChannelModel;
  private current?: { channel: Channel; consumerTag: string };
  private readonly inFlight = new Set<Promise<void>>();
  private readonly failures = new FailedAttempts();
  private stopping = false;

  constructor(
    @Inject(PAYMENT_EVENTS_OPTIONS) private readonly options: PaymentEventsOptions,
    private readonly dataSource: DataSource,
  ) {
    this.queue = options.queue ?? 'payment.succeeded';
    this.faults = { ...options.faults };
  }

  async onApplicationBootstrap(): Promise<void> {
    const connection = await connect(this.options.url, {
      timeout: 5000,
      recovery: {
        // Fail the start-up fast when the broker is unreachable; once connected, never give up.
        initialMaxRetries: 2,
        maxRetries: Infinity,
        initialDelay: 200,
        maxDelay: 5000,
        waitForConnect: false,
        setup: (model: ChannelModel) => this.subscribe(model),
      },
    });
    connection.on('error', (error: Error) => this.logger.warn(`Connection error: ${error.message}`));
    connection.on('disconnect', (error: Error) => this.logger.warn(`Disconnected (${error.message}): reconnecting`));
    connection.on('reconnect-failed', (error: Error) => this.logger.error(`Gave up reconnecting: ${error.message}`));
    this.connection = connection;
    try {
      await connection.waitForConnect();
    } catch (cause) {
      throw new Error(`Could not consume ${this.queue} from RabbitMQ at ${redactUrl(this.options.url)}`, { cause });
    }
    this.logger.log(`Consuming ${this.queue} from ${redactUrl(this.options.url)}`);
  }

  /** Stops taking messages, lets those in hand finish (the database is still open), disconnects. */
  async beforeApplicationShutdown(): Promise<void> {
    this.stopping = true;
    const current = this.current;
    if (current) await current.channel.cancel(current.consumerTag).catch(() => undefined);
    await Promise.allSettled([...this.inFlight]);
    await this.connection?.close();
  }

  /** Runs on every (re)connection: a channel, the queue, the prefetch window, the consumer. */
  private async subscribe(model: ChannelModel): Promise<void> {
    const channel = await model.createChannel();
    channel.on('error', (error: Error) => this.logger.warn(`Channel error: ${error.message}`));
    // A channel closed by the broker (e.g. a precondition failed) stops deliveries while the
    // connection lives on: close the connection too, so that recovery subscribes again.
    channel.on('close', () => {
      if (!this.stopping) void model.close().catch(() => undefined);
    });
    const deadLetterQueue = this.options.deadLetterQueue;
    if (deadLetterQueue) await channel.assertQueue(deadLetterQueue, { durable: true });
    await channel.assertQueue(this.queue, {
      durable: true,
      ...(deadLetterQueue ? { deadLetterExchange: '', deadLetterRoutingKey: deadLetterQueue } : {}),
    });
    await channel.prefetch(this.options.prefetch ?? 10);
    const { consumerTag } = await channel.consume(this.queue, (message) => {
      if (message === null) {
        // The broker cancelled the consumer (the queue was deleted): subscribe again.
        this.logger.warn(`The broker cancelled the consumer of ${this.queue}`);
        if (!this.stopping) void model.close().catch(() => undefined);
        return;
      }
      const work = this.handle(channel, message);
      this.inFlight.add(work);
      void work.finally(() => this.inFlight.delete(work));
    });
    this.current = { channel, consumerTag };
  }

  private async handle(channel: Channel, message: ConsumeMessage): Promise<void> {
    if (message.fields.redelivered) this.stats.redelivered++;
    const messageId: unknown = message.properties.messageId;
    if (typeof messageId !== 'string' || messageId === '') {
      return this.drop(channel, message, 'it has no messageId, so a redelivery could not be told from a new payment');
    }
    if (messageId.length > MAX_MESSAGE_ID_LENGTH || !STORABLE_TEXT.test(messageId)) {
      return this.drop(
        channel,
        message,
        `its messageId ${JSON.stringify(messageId.slice(0, 64))}${messageId.length > 64 ? '…' : ''} cannot be recorded: ` +
          `it must be 1 to ${MAX_MESSAGE_ID_LENGTH} characters without control characters (such as NUL)`,
      );
    }
    const parsed = parsePaymentSucceeded(message.content);
    if ('error' in parsed) return this.drop(channel, message, `message ${messageId}: ${parsed.error}`);

    let outcome;
    try {
      outcome = await consumeOnce(this.dataSource, { consumer: PAYMENT_SUCCEEDED_CONSUMER, messageId }, (manager) =>
        this.markPaid(manager.getRepository(Order), parsed.event, messageId),
      );
    } catch (error) {
      return this.failed(channel, message, messageId, error);
    }
    this.failures.forget(messageId);

    if (outcome.status === 'duplicate') {
      this.stats.duplicates++;
      this.logger.debug(`Message ${messageId} was already handled: acknowledged`);
      return this.settle(channel, message, 'ack');
    }
    this.stats.processed++;
    if (this.faults.nackAfterCommitOnce) {
      this.faults.nackAfterCommitOnce = false;
      return this.settle(channel, message, 'requeue');
    }
    return this.settle(channel, message, 'ack');
  }

  /** The order's PENDING → PAID, inside the consume log's transaction. */
  private async markPaid(orders: Repository<Order>, event: PaymentSucceededEvent, messageId: string) {
    const result = await markPaid(orders, event.orderNo, {
      transactionId: event.transactionId,
      paidAt: new Date(event.paidAt),
    });
    if (this.faults.failInTransactionOnce) {
      this.faults.failInTransactionOnce = false;
      throw new Error('simulated failure inside the transaction (test fault)');
    }
    if (this.faults.alwaysFailMessageIds?.includes(messageId)) {
      throw new Error('simulated poison message (test fault)');
    }
    if (this.faults.refusedByPostgresMessageIds?.includes(messageId)) {
      await orders.query('SELECT $1::text', ['\u0000']);
    }
    if (!result.changed && result.reason !== 'already_done') {
      // A payment for an order that does not exist or was cancelled needs a person (a refund).
      this.logger.error(`Message ${messageId}: order ${event.orderNo} is ${result.entity?.status ?? 'unknown'}; payment ${event.transactionId} not applied`);
    }
    return result.changed ? 'paid' : result.reason;
  }

  /**
   * Puts a failed message back after `requeueDelayMs`, or rejects it for good: at once when
   * PostgreSQL refused its data, after `maxAttempts` failures otherwise. A failure while the
   * database does not answer is an outage, not the message's fault: it does not count.
   */
  private async failed(channel: Channel, message: ConsumeMessage, messageId: string, error: unknown): Promise<void> {
    const reason = (error as Error).message;
    const maxAttempts = this.options.maxAttempts ?? DEFAULT_MAX_ATTEMPTS;
    const refused = isDataException(error);
    const attempts = refused ? maxAttempts : (await this.databaseAnswers()) ? this.failures.add(messageId) : undefined;
    if (attempts !== undefined && attempts >= maxAttempts) {
      this.failures.forget(messageId);
      this.stats.failed++;
      const where = this.options.deadLetterQueue ? `dead-lettered to ${this.options.deadLetterQueue}` : 'dead-lettered if the queue has a dead-letter exchange, else dropped';
      this.logger.error(
        `Gave up on message ${messageId} after ${refused ? 'PostgreSQL refused its data' : `${attempts} failed attempts`} ` +
          `(${reason}): rejected without requeue, ${where}`,
      );
      return this.settle(channel, message, 'reject');
    }
    this.stats.requeued++;
    const counted = attempts === undefined ? 'not counted: the database does not answer' : `attempt ${attempts} of ${maxAttempts}`;
    this.logger.warn(`Message ${messageId} failed (${counted}) and is put back: ${reason}`);
    if (!this.stopping) await sleep(this.options.requeueDelayMs ?? 1000);
    return this.settle(channel, message, 'requeue');
  }

  private databaseAnswers(): Promise<boolean> {
    return this.dataSource.query('SELECT 1').then(
      () => true,
      () => false,
    );
  }

  private drop(channel: Channel, message: ConsumeMessage, reason: string): void {
    this.stats.dropped++;
    this.logger.warn(`Rejected a ${this.queue} message without requeue: ${reason}`);
    this.settle(channel, message, 'reject');
  }

  /** Acks or nacks on the channel the message came on; once that channel is gone, the broker redelivers. */
  private settle(channel: Channel, message: ConsumeMessage, how: 'ack' | 'requeue' | 'reject'): void {
    try {
      if (how === 'ack') channel.ack(message);
      else channel.nack(message, false, how === 'requeue');
    } catch (error) {
      this.logger.warn(`Could not ${how} a message (it will be redelivered): ${(error as Error).message}`);
    }
  }
}
