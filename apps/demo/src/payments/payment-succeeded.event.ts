import { plainToInstance } from 'class-transformer';
import { IsString, Length, validateSync } from 'class-validator';
import { PaymentCallbackDto } from '../orders/payment-callback.dto.js';

/** The JSON body of a `payment.succeeded` message. Unknown properties are ignored. */
export class PaymentSucceededEvent extends PaymentCallbackDto {
  @IsString()
  @Length(1, 64)
  orderNo!: string;
}

/** The event in a message body, or why there is none (not JSON, missing or bad fields). */
export function parsePaymentSucceeded(content: Buffer): { event: PaymentSucceededEvent } | { error: string } {
  let json: unknown;
  try {
    json = JSON.parse(content.toString('utf8'));
  } catch {
    return { error: 'the body is not JSON' };
  }
  if (typeof json !== 'object' || json === null || Array.isArray(json)) return { error: 'the body is not a JSON object' };
  const event = plainToInstance(PaymentSucceededEvent, json);
  const errors = validateSync(event);
  if (errors.length > 0) {
    return { error: errors.flatMap((error) => Object.values(error.constraints ?? {})).join('; ') };
  }
  return { event };
}
