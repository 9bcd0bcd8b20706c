import { BadRequestException, Injectable, type CanActivate, type ExecutionContext } from '@nestjs/common';
import type { DemoRequest } from './demo-user.js';

export const USER_ID_HEADER = 'x-user-id';
export const USER_ID = /^[A-Za-z0-9_.-]{1,64}$/;

/**
 * DEMO ONLY, NOT AUTHENTICATION: trusts whatever the client sends in `X-User-Id`, so any caller
 * can act as any user. It stands in for a real auth guard (JWT, session...) so the demo can show
 * that the idempotency guard keys records per user (`request.user.id`).
 *
 * - header absent: no `request.user` (anonymous);
 * - header present: trimmed, 1 to 64 characters of `[A-Za-z0-9_.-]`, else 400 `INVALID_USER_ID`.
 */
@Injectable()
export class DemoUserGuard implements CanActivate {
  canActivate(context: ExecutionContext): boolean {
    if (context.getType() !== 'http') return true;
    const request = context.switchToHttp().getRequest<DemoRequest>();
    const raw = request.headers[USER_ID_HEADER];
    if (raw === undefined) return true;
    const id = typeof raw === 'string' ? raw.trim() : '';
    if (!USER_ID.test(id)) {
      throw new BadRequestException({
        statusCode: 400,
        error: 'Bad Request',
        code: 'INVALID_USER_ID',
        message: 'The X-User-Id header must be 1 to 64 characters of letters, digits, "_", "." or "-".',
      });
    }
    request.user = { id };
    return true;
  }
}
