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
  /** Fault injection, FOR TESTS ONLY: each fault happens once, to the first message it can. */
  faults?: PaymentEventsFaults;
}

export interface PaymentEventsFaults {
  /** Nack with requeue after the transaction committed, as a crash between commit and ack would. */
  nackAfterCommitOnce?: boolean;
  /** Throw inside the transaction after the order changed, as a database failure would. */
  failInTransactionOnce?: boolean;
}

export const PAYMENT_EVENTS_OPTIONS = Symbol('PAYMENT_EVENTS_OPTIONS');

/** The consumer's name in the consume log (`idempotency_consume_log.consumer`). */
export const PAYMENT_SUCCEEDED_CONSUMER = 'orders.payment-succeeded';
