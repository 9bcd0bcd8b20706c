/** Options of the `payment.succeeded` consumer (see `PaymentEventsConsumer`). */
export interface PaymentEventsOptions {
  /** AMQP URL of the broker, e.g. `amqp://guest:guest@127.0.0.1:5672`. */
  url: string;
  /** Queue consumed (asserted durable at start). Default `payment.succeeded`. */
  queue?: string;
  /** Unacknowledged messages handled at once. Default 10. */
  prefetch?: number;
  /** Wait before a message whose processing failed is put back, in ms (no hot loop while the database is down). Default 1000. */
  requeueDelayMs?: number;
  /**
   * Failed attempts after which a message is rejected without requeue (a poison message: its
   * processing fails every time). Counted per message id in this process; an attempt that failed
   * while the database did not answer (an outage, not the message) does not count. Default 5.
   */
  maxAttempts?: number;
  /**
   * Queue that rejected messages (invalid, or failed `maxAttempts` times) are dead-lettered to:
   * asserted durable, and set as the dead-letter route of `queue` (`x-dead-letter-exchange` "",
   * `x-dead-letter-routing-key`). The broker refuses that on a queue declared before without
   * these arguments: there, set a dead-letter policy instead. Default: none (a rejected message
   * goes to the dead-letter exchange a policy sets, else it is dropped).
   */
  deadLetterQueue?: string;
  /** Fault injection, FOR TESTS ONLY: each fault happens once, to the first message it can. */
  faults?: PaymentEventsFaults;
}

export interface PaymentEventsFaults {
  /** Nack with requeue after the transaction committed, as a crash between commit and ack would. */
  nackAfterCommitOnce?: boolean;
  /** Throw inside the transaction after the order changed, as a database failure would. */
  failInTransactionOnce?: boolean;
  /** Throw inside the transaction on every attempt for these message ids: poison messages that pass validation. */
  alwaysFailMessageIds?: string[];
  /** Run a statement PostgreSQL refuses (a NUL in a text value) in the transaction for these message ids: a validation gap. */
  refusedByPostgresMessageIds?: string[];
}

export const PAYMENT_EVENTS_OPTIONS = Symbol('PAYMENT_EVENTS_OPTIONS');

/** `maxAttempts` when not set. */
export const DEFAULT_MAX_ATTEMPTS = 5;

/** The consumer's name in the consume log (`idempotency_consume_log.consumer`). */
export const PAYMENT_SUCCEEDED_CONSUMER = 'orders.payment-succeeded';
