import {
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
 * Answers 415 `UNSUPPORTED_MEDIA_TYPE` when a request carries a body that is not JSON.
 *
 * Express leaves such a body unparsed and Fastify parses `text/plain` into a string, so without
 * this the handler would see `undefined` or a string and the client would get a confusing answer
 * (a missing idempotency key). Applied per controller: a later payment-callback route may need
 * form bodies.
 */
@Injectable()
export class JsonBodyGuard implements CanActivate {
  canActivate(context: ExecutionContext): boolean {
    const { headers } = context.switchToHttp().getRequest<DemoRequest>();
    if (!hasBody(headers)) return true;
    const contentType = headers['content-type'];
    const mediaType = typeof contentType === 'string' ? contentType.split(';')[0]!.trim().toLowerCase() : '';
    if (mediaType === JSON_MEDIA_TYPE) return true;
    throw new UnsupportedMediaTypeException({
      statusCode: 415,
      error: 'Unsupported Media Type',
      code: 'UNSUPPORTED_MEDIA_TYPE',
      message: 'Send the request body as JSON with "Content-Type: application/json".',
    });
  }
}
