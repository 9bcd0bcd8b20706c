import { IsString, Matches } from 'class-validator';
import { CreateOrderDto } from './create-order.dto.js';

/** `orders.create` over the Redis transport: the HTTP body plus who the order is for. */
export class CreateOrderMessage extends CreateOrderDto {
  @IsString()
  @Matches(/^[A-Za-z0-9_.-]{1,64}$/)
  userId!: string;
}
