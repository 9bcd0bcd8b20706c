import type { ExecutionContext } from '@nestjs/common';
import type { HttpRequest } from './http-request.js';

/** `@nestjs/common`'s route path metadata key (stable across Nest 10-12). */
const PATH_METADATA = 'path';

/** Guarded controller classes that more than one module lists (`guard-placement`): mounted at several paths. */
const mountedTwice = new WeakSet<object>();

/** Notes a controller class that a second module lists too (`RouterModule` mounting one class at `admin/` and `public/`). */
export function markMountedTwice(controller: object): void {
  mountedTwice.add(controller);
}

/**
 * Whether one handler answers at several paths, so that the path the router matched tells its
 * operations apart: a method on several paths (`@Post([':id/like', ':id/unlike'])`), a
 * controller on several (`@Controller(['admin/users', 'public/users'])`: a second helper), or a
 * controller class two modules mount. Keyed as `Controller.method`, the unlike was answered the
 * like's saved answer, and `/public/users` the answer of `/admin/users` (an adversarial helper).
 */
export function answersAtSeveralPaths(ctx: ExecutionContext): boolean {
  const several = (target: object) => {
    const paths: unknown = Reflect.getMetadata(PATH_METADATA, target);
    return Array.isArray(paths) && paths.length > 1;
  };
  return several(ctx.getHandler()) || several(ctx.getClass()) || mountedTwice.has(ctx.getClass());
}

/**
 * The route path the router matched (`/posts/:id/like`: the pattern, never the URL, so every
 * spelling of one route stays one): Express's `req.route.path`, Fastify's `routeOptions.url`.
 */
export function matchedRoutePath(req: HttpRequest): string | undefined {
  const r = req as { route?: { path?: unknown }; routeOptions?: { url?: unknown } };
  const path = r.routeOptions?.url ?? r.route?.path;
  return typeof path === 'string' ? path : undefined;
}
