import { BadRequestException, Injectable, type PipeTransform } from '@nestjs/common';
import { ORDER_NO, ORDER_NO_MESSAGE } from './order-no.js';

/**
 * The `:orderNo` of a path, checked before any query: 400 `VALIDATION_FAILED` for a value no
 * order can have (too long, other characters, a NUL that PostgreSQL would refuse with a 500).
 */
@Injectable()
export class OrderNoPipe implements PipeTransform<string, string> {
  transform(value: string): string {
    if (typeof value === 'string' && ORDER_NO.test(value)) return value;
    throw new BadRequestException({
      statusCode: 400,
      error: 'Bad Request',
      code: 'VALIDATION_FAILED',
      message: [`${ORDER_NO_MESSAGE} (in the path)`],
    });
  }
}
