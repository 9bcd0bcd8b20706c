import { Module, type DynamicModule } from '@nestjs/common';
import { ADMIN_TOKEN, AdminTokenGuard } from './admin-token.guard.js';
import { IdempotencyAdminController } from './idempotency-admin.controller.js';

/** Shortest `ADMIN_TOKEN` accepted: a guessable secret would be an open admin. */
export const ADMIN_TOKEN_MIN_LENGTH = 16;

/** The operators' routes (`/admin/...`), behind `AdminTokenGuard`; off (404) without a token. */
@Module({})
export class AdminModule {
  static register(token: string | undefined): DynamicModule {
    // HTTP trims a header value's spaces: such a token could never match (an adversarial helper).
    if (token !== undefined && token !== token.trim()) {
      throw new Error('ADMIN_TOKEN must not start or end with spaces (HTTP trims them from the header it is sent in)');
    }
    if (token !== undefined && token.length < ADMIN_TOKEN_MIN_LENGTH) {
      throw new Error(`ADMIN_TOKEN must be at least ${ADMIN_TOKEN_MIN_LENGTH} characters (got ${token.length}); leave it unset to turn the admin routes off`);
    }
    return {
      module: AdminModule,
      controllers: [IdempotencyAdminController],
      providers: [{ provide: ADMIN_TOKEN, useValue: token }, AdminTokenGuard],
    };
  }
}
