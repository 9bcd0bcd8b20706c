import { IsNumber, IsString, Length, Matches, Max, Min } from 'class-validator';

/** Body of `POST /orders`. */
export class CreateOrderDto {
  /** The client's own order number: also the idempotency key of the request. */
  @IsString()
  @Length(1, 64)
  @Matches(/^[A-Za-z0-9_.:-]+$/, {
    message: 'orderNo may only contain letters, digits and _ . : -',
  })
  orderNo!: string;

  /** Greater than 0, at most 2 decimals, at most 1e9. */
  @IsNumber({ allowNaN: false, allowInfinity: false, maxDecimalPlaces: 2 })
  @Min(0.01)
  @Max(1e9)
  amount!: number;
}
