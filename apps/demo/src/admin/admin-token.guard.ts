import { ForbiddenException, Inject, Injectable, NotFoundException, type CanActivate, type ExecutionContext } from '@nestjs/common';
import { createHash, timingSafeEqual } from 'node:crypto';

export const ADMIN_TOKEN_HEADER = 'x-admin-token';
/** DI token of the admin token (`ADMIN_TOKEN`); `undefined` turns the admin routes off. */
export const ADMIN_TOKEN = Symbol('ADMIN_TOKEN');

const digest = (text: string) => createHash('sha256').update(text).digest();

/**
 * The demo's admin check, a Nest guard on the admin routes: the `X-Admin-Token` header must equal
 * `ADMIN_TOKEN` (compared in constant time). Without `ADMIN_TOKEN` the admin routes answer 404,
 * as a route that does not exist: a demo must not ship an open admin, and a server without one
 * need not say it has one. A missing or wrong token is 403 `ADMIN_TOKEN_INVALID`.
 *
 * One shared secret is a demo's admin: a real app puts these routes behind its own operators'
 * authentication and authorization, and logs who used them.
 */
@Injectable()
export class AdminTokenGuard implements CanActivate {
  private readonly expected: Buffer | undefined;

  constructor(@Inject(ADMIN_TOKEN) token: string | undefined) {
    this.expected = token ? digest(token) : undefined;
  }

  canActivate(context: ExecutionContext): boolean {
    if (!this.expected) throw new NotFoundException();
    const sent = context.switchToHttp().getRequest<{ headers: Record<string, string | string[] | undefined> }>().headers[ADMIN_TOKEN_HEADER];
    // Equal-length digests, so the comparison's time says nothing about the token.
    if (typeof sent === 'string' && timingSafeEqual(digest(sent), this.expected)) return true;
    throw new ForbiddenException({
      statusCode: 403,
      error: 'Forbidden',
      code: 'ADMIN_TOKEN_INVALID',
      message: `Send the admin token in the ${ADMIN_TOKEN_HEADER} header.`,
    });
  }
}
