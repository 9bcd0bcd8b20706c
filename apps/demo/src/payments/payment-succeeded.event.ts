import { plainToInstance } from 'class-transformer';
import { IsString, Matches, validateSync } from 'class-validator';
import { jsonProblemOf, MAX_JSON_DEPTH, MAX_JSON_VALUES } from '../json-shape.js';
import { ORDER_NO, ORDER_NO_MESSAGE } from '../orders/order-no.js';
import { PaymentCallbackDto } from '../orders/payment-callback.dto.js';

/** The JSON body of a `payment.succeeded` message. Unknown properties are ignored. */
export class PaymentSucceededEvent extends PaymentCallbackDto {
  @IsString()
  @Matches(ORDER_NO, { message: ORDER_NO_MESSAGE })
  orderNo!: string;
}

/** Largest message body read: an event is a few hundred bytes. */
export const MAX_EVENT_BYTES = 64 * 1024;

/** The event in a message body, or why there is none (too large, not JSON, too complex, missing or bad fields). */
export function parsePaymentSucceeded(content: Buffer): { event: PaymentSucceededEvent } | { error: string } {
  if (content.length > MAX_EVENT_BYTES) return { error: `the body is over ${MAX_EVENT_BYTES} bytes` };
  let json: unknown;
  try {
    json = JSON.parse(content.toString('utf8'));
  } catch {
    return { error: 'the body is not JSON' };
  }
  if (typeof json !== 'object' || json === null || Array.isArray(json)) return { error: 'the body is not a JSON object' };
  // Refused before plainToInstance, which is quadratic in the keys of an object.
  const problem = jsonProblemOf(json);
  if (problem === 'too-complex') return { error: `the body holds more than ${MAX_JSON_VALUES} values or nests deeper than ${MAX_JSON_DEPTH} levels` };
  if (problem === 'prototype-keys') return { error: 'the body has a "__proto__" or "constructor" key' };
  const event = plainToInstance(PaymentSucceededEvent, json);
  const errors = validateSync(event);
  if (errors.length > 0) {
    return { error: errors.flatMap((error) => Object.values(error.constraints ?? {})).join('; ') };
  }
  return { event };
}
