import { IsNumber, IsString, Matches, Max, Min } from 'class-validator';
import { ORDER_NO, ORDER_NO_MESSAGE } from '../orders/order-no.js';

/** Body of `POST /payments`. */
export class CreatePaymentDto {
  @IsString()
  @Matches(ORDER_NO, { message: ORDER_NO_MESSAGE })
  orderNo!: string;

  /** Greater than 0, at most 2 decimals, at most 1e9. */
  @IsNumber({ allowNaN: false, allowInfinity: false, maxDecimalPlaces: 2 })
  @Min(0.01)
  @Max(1e9)
  amount!: number;
}
