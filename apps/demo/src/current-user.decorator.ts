import { createParamDecorator, type ExecutionContext } from '@nestjs/common';
import type { DemoRequest, DemoUser } from './demo-user.js';

/** The `request.user` set by `DemoUserGuard`, or undefined for an anonymous request. */
export const CurrentUser = createParamDecorator(
  (_data: unknown, context: ExecutionContext): DemoUser | undefined =>
    context.switchToHttp().getRequest<DemoRequest>().user,
);
