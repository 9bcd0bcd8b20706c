import { describe, expect, it } from '@jest/globals';
import { IdempotencyHttpException } from '../../index.js';
import { answerHttp, type HttpReply } from './http-answer.js';

function recorder(): { reply: HttpReply; headers: Record<string, string> } {
  const headers: Record<string, string> = {};
  return { headers, reply: { status: () => undefined, header: (name, value) => (headers[name.toLowerCase()] = value) } };
}

function refusalOf(run: () => unknown): IdempotencyHttpException {
  try {
    run();
  } catch (error) {
    if (error instanceof IdempotencyHttpException) return error;
    throw error;
  }
  throw new Error('answerHttp did not refuse');
}

describe('answerHttp refusals', () => {
  it.each([
    ['in progress', { status: 'in_progress', retryAfterMs: 1500 } as const, 409, 'IDEMPOTENCY_IN_PROGRESS', { 'retry-after': '2' }],
    ['key reused', { status: 'mismatch' } as const, 422, 'IDEMPOTENCY_KEY_REUSED', {}],
  ])('%s: Nest JSON by default, problem details with their media type under problem+json', (_what, result, status, code, headers) => {
    const nest = recorder();
    expect(refusalOf(() => answerHttp(result, nest.reply)).getResponse()).toEqual(expect.objectContaining({ statusCode: status, code }));
    expect(nest.headers).toEqual(headers);

    const problem = recorder();
    expect(refusalOf(() => answerHttp(result, problem.reply, 'problem+json')).getResponse()).toEqual(
      expect.objectContaining({ type: `tag:nestjs-idempotency,2026:${code}`, status, code, detail: expect.any(String) }),
    );
    expect(problem.headers).toEqual({ ...headers, 'content-type': 'application/problem+json' });
  });
});
