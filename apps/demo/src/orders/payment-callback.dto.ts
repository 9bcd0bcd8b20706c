import { IsISO8601, IsString, Length } from 'class-validator';
import { IsStorableText } from '../storable-text.js';

/** Body of `POST /orders/:orderNo/payment-callback`, as a payment provider sends it. */
export class PaymentCallbackDto {
  /** The provider's id of the payment: 1 to 128 characters, no control characters (NUL...). */
  @IsString()
  @Length(1, 128)
  @IsStorableText()
  transactionId!: string;

  /** When the payment happened: an ISO 8601 date-time (e.g. `2026-11-30T10:15:00Z`). */
  @IsISO8601({ strict: true })
  paidAt!: string;
}
