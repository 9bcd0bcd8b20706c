import { createParamDecorator, type ExecutionContext } from '@nestjs/common';
import type { DemoRequest } from '../demo-user.js';
import { tokenInvalid, tokenMissing } from './invoices.exceptions.js';

export const IDEMPOTENCY_TOKEN_HEADER = 'x-idempotency-token';
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

/**
 * The request's `X-Idempotency-Token`, lower-cased (as PostgreSQL returns a uuid). Throws 400
 * `IDEMPOTENCY_TOKEN_MISSING` without it, 400 `IDEMPOTENCY_TOKEN_INVALID` when it is not a UUID.
 */
export const IdempotencyToken = createParamDecorator((_data: unknown, context: ExecutionContext): string => {
  const raw = context.switchToHttp().getRequest<DemoRequest>().headers[IDEMPOTENCY_TOKEN_HEADER];
  if (raw === undefined) throw tokenMissing();
  const token = typeof raw === 'string' ? raw.trim() : '';
  if (!UUID.test(token)) throw tokenInvalid();
  return token.toLowerCase();
});
