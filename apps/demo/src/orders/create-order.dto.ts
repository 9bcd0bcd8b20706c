import { IsNotIn, IsNumber, IsString, Length, Matches, Max, Min } from 'class-validator';
import { DOT_SEGMENT_MESSAGE, DOT_SEGMENTS, ORDER_NO_CHARACTERS, ORDER_NO_MAX_LENGTH } from './order-no.js';

/** Body of `POST /orders`. */
export class CreateOrderDto {
  /** The client's own order number: also the idempotency key of the request. */
  @IsString()
  @Length(1, ORDER_NO_MAX_LENGTH)
  @Matches(ORDER_NO_CHARACTERS, {
    message: 'orderNo may only contain letters, digits and _ . : -',
  })
  @IsNotIn(DOT_SEGMENTS, { message: DOT_SEGMENT_MESSAGE })
  orderNo!: string;

  /** Greater than 0, at most 2 decimals, at most 1e9. */
  @IsNumber({ allowNaN: false, allowInfinity: false, maxDecimalPlaces: 2 })
  @Min(0.01)
  @Max(1e9)
  amount!: number;
}
