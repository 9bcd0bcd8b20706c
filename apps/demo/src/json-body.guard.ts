import {
  BadRequestException,
  Injectable,
  UnsupportedMediaTypeException,
  type CanActivate,
  type ExecutionContext,
} from '@nestjs/common';
import type { DemoRequest } from './demo-user.js';

/** The only type both adapters parse as JSON here (Express's `json()` default, Fastify's parser). */
const JSON_MEDIA_TYPE = 'application/json';

const hasBody = (headers: DemoRequest['headers']): boolean =>
  headers['transfer-encoding'] !== undefined || Number(headers['content-length'] ?? 0) > 0;

/**
 * Whether a parsed body has a `__proto__` key, or a `constructor` key holding `prototype`, at any
 * depth. Walked with a stack of its own: a body nested thousands of levels deep does not
 * overflow the call stack (the idempotency guard answers it 400 after this).
 */
const hasPrototypeKeys = (body: unknown): boolean => {
  const pending: unknown[] = [body];
  while (pending.length > 0) {
    const value = pending.pop();
    if (typeof value !== 'object' || value === null) continue;
    if (Object.hasOwn(value, '__proto__')) return true;
    const ctor: unknown = Object.hasOwn(value, 'constructor') ? (value as { constructor: unknown }).constructor : undefined;
    if (typeof ctor === 'object' && ctor !== null && Object.hasOwn(ctor, 'prototype')) return true;
    // One push per child: spreading a long array as arguments would overflow the stack.
    for (const child of Object.values(value)) pending.push(child);
  }
  return false;
};

/**
 * Answers 415 `UNSUPPORTED_MEDIA_TYPE` when a request carries a body that is not JSON. Express
 * leaves such a body unparsed and Fastify parses `text/plain` into a string, so without this the
 * handler would see `undefined` or a string and the client would get a confusing answer (a
 * missing idempotency key). Applied per controller: a route may need form bodies one day.
 *
 * Answers 400 `INVALID_JSON` for a JSON body with prototype-poisoning keys (`__proto__`,
 * `constructor.prototype`): Fastify's parser refuses those itself; Express's keeps them as plain
 * properties, which class-transformer then skips without a validation error.
 */
@Injectable()
export class JsonBodyGuard implements CanActivate {
  canActivate(context: ExecutionContext): boolean {
    const { headers, body } = context.switchToHttp().getRequest<DemoRequest & { body?: unknown }>();
    if (!hasBody(headers)) return true;
    const contentType = headers['content-type'];
    const mediaType = typeof contentType === 'string' ? contentType.split(';')[0]!.trim().toLowerCase() : '';
    if (mediaType === JSON_MEDIA_TYPE) {
      if (hasPrototypeKeys(body)) {
        throw new BadRequestException({
          statusCode: 400,
          error: 'Bad Request',
          code: 'INVALID_JSON',
          message: 'The request body is not acceptable JSON: remove the "__proto__" and "constructor" keys.',
        });
      }
      return true;
    }
    throw new UnsupportedMediaTypeException({
      statusCode: 415,
      error: 'Unsupported Media Type',
      code: 'UNSUPPORTED_MEDIA_TYPE',
      message: 'Send the request body as JSON with "Content-Type: application/json".',
    });
  }
}
