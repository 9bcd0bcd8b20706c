import { VersioningType, type ExecutionContext } from '@nestjs/common';
import type { ApplicationConfig } from '@nestjs/core';
import type { HttpRequest } from './http-request.js';

/** `@nestjs/common`'s route path metadata key (stable across Nest 10-12). */
const PATH_METADATA = 'path';
/** `@nestjs/common`'s version metadata key (`@Version()`, `@Controller({ version })`). */
const VERSION_METADATA = '__version__';

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

/**
 * The matched route path as the handler's key segment (`keyHandler`): without the app's global
 * prefix and its URI version segment, which the router puts in front of every path. A handler at
 * several paths that serves several versions (`@Version(['1', '2'])`) is one route per path, as
 * one at a single path is: keyed with them, a retry under the other version ran it again (an
 * adversarial helper: 20 of 20 keys), and a prefix set or changed between deploys changed every
 * such key. `RouterModule` prefixes stay: they tell the mounts of one controller apart.
 */
export function routeKeyPath(ctx: ExecutionContext, config: ApplicationConfig | undefined): (matched: string) => string {
  const prefix = config ? `/${config.getGlobalPrefix().replace(/^\/+|\/+$/g, '')}` : '/';
  const versioning = config?.getVersioning();
  const uriPrefix = versioning?.type === VersioningType.URI ? (versioning.prefix === false ? '' : (versioning.prefix ?? 'v')) : undefined;
  // The versions the router put this handler under, as Nest picks them: the method's, else the
  // controller's, else the app's default. A version-neutral route has no version segment, and
  // its own first segment (`v1/...`) is its own.
  const declared: unknown =
    Reflect.getMetadata(VERSION_METADATA, ctx.getHandler()) ?? Reflect.getMetadata(VERSION_METADATA, ctx.getClass()) ?? versioning?.defaultVersion;
  const versions = new Set(([] as unknown[]).concat(declared ?? []).filter((version): version is string => typeof version === 'string'));
  return (matched) => {
    let rest = matched;
    if (prefix !== '/' && (rest === prefix || rest.startsWith(`${prefix}/`))) rest = rest.slice(prefix.length);
    if (uriPrefix !== undefined && versions.size > 0) {
      const segment = /^\/([^/]+)/.exec(rest)?.[1];
      if (segment?.startsWith(uriPrefix) && versions.has(segment.slice(uriPrefix.length))) rest = rest.slice(segment.length + 1);
    }
    return rest.startsWith('/') ? rest : `/${rest}`;
  };
}
