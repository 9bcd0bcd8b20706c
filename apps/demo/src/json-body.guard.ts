import {
  BadRequestException,
  HttpException,
  HttpStatus,
  Injectable,
  UnsupportedMediaTypeException,
  type CanActivate,
  type ExecutionContext,
} from '@nestjs/common';
import type { DemoRequest } from './demo-user.js';
import { jsonProblemOf, MAX_JSON_DEPTH, MAX_JSON_VALUES } from './json-shape.js';

/** The only type both adapters parse as JSON here (Express's `json()` default, Fastify's parser). */
const JSON_MEDIA_TYPE = 'application/json';

const hasBody = (headers: DemoRequest['headers']): boolean =>
  headers['transfer-encoding'] !== undefined || Number(headers['content-length'] ?? 0) > 0;

const tooComplex = () =>
  new HttpException(
    {
      statusCode: 413,
      error: 'Payload Too Large',
      code: 'PAYLOAD_TOO_COMPLEX',
      message: `The request body holds more than ${MAX_JSON_VALUES} values or nests deeper than ${MAX_JSON_DEPTH} levels: send only the documented fields.`,
    },
    HttpStatus.PAYLOAD_TOO_LARGE,
  );

const prototypeKeys = () =>
  new BadRequestException({
    statusCode: 400,
    error: 'Bad Request',
    code: 'INVALID_JSON',
    message: 'The request body is not acceptable JSON: remove the "__proto__" and "constructor" keys.',
  });

/**
 * Answers 415 `UNSUPPORTED_MEDIA_TYPE` when a request carries a body that is not JSON. Express
 * leaves such a body unparsed and Fastify parses `text/plain` into a string, so without this the
 * handler would see `undefined` or a string and the client would get a confusing answer (a
 * missing idempotency key). Applied per controller: a route may need form bodies one day.
 *
 * Answers 413 `PAYLOAD_TOO_COMPLEX` for a JSON body with more than {@link MAX_JSON_VALUES} values
 * or deeper than {@link MAX_JSON_DEPTH} levels. Guards run before interceptors and pipes, so such
 * a body reaches neither the idempotency guard's fingerprint nor the ValidationPipe's transform
 * (quadratic in the keys of an object; recursive, so a deep body overflowed the stack: a 500).
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
    if (mediaType !== JSON_MEDIA_TYPE) {
      throw new UnsupportedMediaTypeException({
        statusCode: 415,
        error: 'Unsupported Media Type',
        code: 'UNSUPPORTED_MEDIA_TYPE',
        message: 'Send the request body as JSON with "Content-Type: application/json".',
      });
    }
    const problem = jsonProblemOf(body);
    if (problem === 'too-complex') throw tooComplex();
    if (problem === 'prototype-keys') throw prototypeKeys();
    return true;
  }
}
