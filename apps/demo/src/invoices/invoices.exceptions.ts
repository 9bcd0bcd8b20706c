import { BadRequestException, ConflictException, NotFoundException, UnprocessableEntityException } from '@nestjs/common';

export const tokenMissing = () =>
  new BadRequestException({
    statusCode: 400,
    error: 'Bad Request',
    code: 'IDEMPOTENCY_TOKEN_MISSING',
    message: 'Send a new UUID in the X-Idempotency-Token header, and the same one when you retry.',
  });

export const tokenInvalid = () =>
  new BadRequestException({
    statusCode: 400,
    error: 'Bad Request',
    code: 'IDEMPOTENCY_TOKEN_INVALID',
    message: 'The X-Idempotency-Token header must be a UUID (e.g. 3f2b8c1e-4d5a-4b6c-9e7f-0a1b2c3d4e5f).',
  });

/** 422: the token belongs to an invoice with other data. Says nothing about that invoice. */
export const tokenReused = () =>
  new UnprocessableEntityException({
    statusCode: 422,
    error: 'Unprocessable Entity',
    code: 'IDEMPOTENCY_TOKEN_REUSED',
    message: 'This X-Idempotency-Token was used for another invoice: send a new token for a new invoice.',
  });

/** 409: another request (another token) already created this terminal's invoice number. */
export const invoiceNumberExists = () =>
  new ConflictException({
    statusCode: 409,
    error: 'Conflict',
    code: 'INVOICE_NUMBER_EXISTS',
    message: 'This terminal already has an invoice with this number.',
  });

export const invoiceNotFound = () =>
  new NotFoundException({
    statusCode: 404,
    error: 'Not Found',
    code: 'INVOICE_NOT_FOUND',
    message: 'No invoice with this id exists.',
  });
