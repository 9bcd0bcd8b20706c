import { IsISO8601, IsString, Length, Matches } from 'class-validator';
import { IsStorableText } from '../storable-text.js';

/** Body of `POST /orders/:orderNo/payment-callback`, as a payment provider sends it. */
export class PaymentCallbackDto {
  /** The provider's id of the payment: 1 to 128 characters, no control characters (NUL...). */
  @IsString()
  @Length(1, 128)
  @IsStorableText()
  transactionId!: string;

  /**
   * When the payment happened: an ISO 8601 date-time as RFC 3339 profiles it, with its offset
   * (e.g. `2026-11-30T10:15:00Z`). ISO 8601's other forms (a week `2026-W05`, the basic
   * `20260202T000000Z`) passed `IsISO8601`, which JavaScript's Date cannot read: PostgreSQL
   * refused them (an adversarial helper).
   */
  @IsISO8601({ strict: true })
  @Matches(/^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d{1,9})?(?:Z|[+-]\d{2}:\d{2})$/i, {
    message: 'paidAt must be an RFC 3339 date-time with an offset, such as 2026-11-30T10:15:00Z',
  })
  paidAt!: string;
}
