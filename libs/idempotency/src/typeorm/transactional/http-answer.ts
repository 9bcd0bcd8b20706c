import { IdempotencyRefusals, PROBLEM_JSON_CONTENT_TYPE, REPLAYED_HEADER, type ErrorFormat } from '../../index.js';
import type { IdempotentRunResult } from './idempotent-run.js';

/** The part of an Express response or a Fastify reply `answerHttp` sets: take it with `@Res({ passthrough: true })`. */
export interface HttpReply {
  status(code: number): unknown;
  header(name: string, value: string): unknown;
}

/**
 * Answers a transactional run over HTTP the way the guard answers a guarded route: the work's
 * status and body, marked `Idempotent-Replayed: true` when replayed; 409
 * `IDEMPOTENCY_IN_PROGRESS` with `Retry-After` while another transaction holds the key; 422
 * `IDEMPOTENCY_KEY_REUSED` for the key with another fingerprint. Return what it returns from the
 * controller method; the refusals are thrown as the guard's `IdempotencyHttpException`s, in
 * `errorFormat` (the module option's values: `'problem+json'` also sets the Content-Type).
 */
export function answerHttp<T>(result: IdempotentRunResult<T>, reply: HttpReply, errorFormat: ErrorFormat = 'nest'): T {
  switch (result.status) {
    case 'ran':
    case 'replayed':
      reply.status(result.statusCode);
      if (result.status === 'replayed') reply.header(REPLAYED_HEADER, 'true');
      return result.body;
    case 'in_progress': {
      const seconds = Math.max(1, Math.ceil(result.retryAfterMs / 1000));
      reply.header('retry-after', String(seconds));
      throw refusal(reply, errorFormat, IdempotencyRefusals.inProgress(seconds, errorFormat));
    }
    case 'mismatch':
      throw refusal(reply, errorFormat, IdempotencyRefusals.keyReused(errorFormat));
  }
}

function refusal<E>(reply: HttpReply, errorFormat: ErrorFormat, exception: E): E {
  if (errorFormat === 'problem+json') reply.header('content-type', PROBLEM_JSON_CONTENT_TYPE);
  return exception;
}
