import { Injectable, type CanActivate, type ExecutionContext } from '@nestjs/common';
import type { DemoRequest } from '../demo-user.js';
import { xmlMediaTypeRequired } from './uploads.exceptions.js';

/** The media types the XML parser is registered for (`demo-app.factory.ts`), on both adapters. */
export const XML_MEDIA_TYPES = ['application/xml', 'text/xml'];

/**
 * Answers 415 `UNSUPPORTED_MEDIA_TYPE` to an upload whose `Content-Type` is not
 * `application/xml` or `text/xml` (parameters such as `charset` allowed), or is missing. Runs
 * before the content digest guard, which needs the raw bytes only the XML parser keeps.
 */
@Injectable()
export class XmlBodyGuard implements CanActivate {
  canActivate(context: ExecutionContext): boolean {
    const { headers } = context.switchToHttp().getRequest<DemoRequest>();
    const contentType = headers['content-type'];
    const mediaType = typeof contentType === 'string' ? contentType.split(';')[0]!.trim().toLowerCase() : '';
    if (!XML_MEDIA_TYPES.includes(mediaType)) throw xmlMediaTypeRequired();
    return true;
  }
}
