import { ConflictException, NotFoundException } from '@nestjs/common';

/** 409: the orderNo is taken (by another user, or with another amount). Says nothing about the existing order. */
export const orderExists = () =>
  new ConflictException({
    statusCode: 409,
    error: 'Conflict',
    code: 'ORDER_EXISTS',
    message: 'An order with this orderNo already exists.',
  });

export const orderNotFound = () =>
  new NotFoundException({
    statusCode: 404,
    error: 'Not Found',
    code: 'ORDER_NOT_FOUND',
    message: 'No order with this orderNo exists.',
  });

/** 409: the order is in a state a payment cannot apply to (e.g. CANCELLED). */
export const orderNotPayable = (status: string) =>
  new ConflictException({
    statusCode: 409,
    error: 'Conflict',
    code: 'ORDER_NOT_PAYABLE',
    message: `The order is ${status} and cannot be paid: refund the payment.`,
    status,
  });

/** 409: the order is in a state it cannot be cancelled from (e.g. PAID). */
export const orderNotCancellable = (status: string) =>
  new ConflictException({
    statusCode: 409,
    error: 'Conflict',
    code: 'ORDER_NOT_CANCELLABLE',
    message: `The order is ${status} and cannot be cancelled.`,
    status,
  });
