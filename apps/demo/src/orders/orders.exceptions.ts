import { ConflictException, NotFoundException } from '@nestjs/common';

/** 409: the orderNo is taken (by this user or another). Says nothing about the existing order. */
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
