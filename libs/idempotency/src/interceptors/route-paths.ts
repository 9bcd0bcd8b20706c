import { VERSION_NEUTRAL, VersioningType, type ExecutionContext, type Type } from '@nestjs/common';
import type { ApplicationConfig, ModulesContainer } from '@nestjs/core';
import type { HttpRequest } from './http-request.js';

/** `@nestjs/common`'s route path metadata key (stable across Nest 10-12). */
const PATH_METADATA = 'path';
/** `@nestjs/common`'s version metadata key (`@Version()`, `@Controller({ version })`). */
const VERSION_METADATA = '__version__';

/** `@nestjs/common`'s key of a `RouterModule` path, with the app's id appended (Nest 10-12). */
const MODULE_PATH = '__module_path__';

/** A module of an app, as its `ModulesContainer` holds it. */
type AppModule = ModulesContainer extends Map<string, infer M> ? M : never;

/** Where a route is served: the app's configuration (global prefix, versioning) and its modules. */
export interface RouteSite {
  config?: ApplicationConfig;
  modules?: ModulesContainer;
}

/** Per app, its modules as they were when its routes were built (`noteRoutedModules`). */
const routedModules = new WeakMap<ModulesContainer, readonly AppModule[]>();

/**
 * Notes the app's modules as they are before its routes are built (`guard-placement`): those
 * are the ones whose controllers the router serves. A module loaded later (`LazyModuleLoader`)
 * serves no route, and counted, one listing an already routed controller changed that route's
 * key when it was loaded (an adversarial helper: 20 runs for 10 keys across two instances).
 */
export function noteRoutedModules(modules: ModulesContainer): void {
  if (!routedModules.has(modules)) routedModules.set(modules, [...modules.values()]);
}

/**
 * The modules of this app that list `controller` and were there when its routes were built: each
 * mounts it (at its `RouterModule` path). This app's own, never another's in the process: the
 * same class in another app, listed twice or mounted elsewhere there, changed this app's keys
 * (an adversarial helper: two instances that started their apps in another order keyed one route
 * two ways, 20 runs for 10 keys).
 */
function modulesListing(controller: object, modules: ModulesContainer | undefined): AppModule[] {
  if (!modules) return [];
  return (routedModules.get(modules) ?? [...modules.values()]).filter((module) => module.controllers.has(controller as Type));
}

/**
 * Whether one handler answers at several paths, so that the path the router matched tells its
 * operations apart: a method on several paths (`@Post([':id/like', ':id/unlike'])`), a
 * controller on several (`@Controller(['admin/users', 'public/users'])`: a second helper), or a
 * controller class two modules mount. Keyed as `Controller.method`, the unlike was answered the
 * like's saved answer, and `/public/users` the answer of `/admin/users` (an adversarial helper).
 */
export function answersAtSeveralPaths(ctx: ExecutionContext, site: RouteSite): boolean {
  const several = (target: object) => {
    const paths: unknown = Reflect.getMetadata(PATH_METADATA, target);
    return Array.isArray(paths) && paths.length > 1;
  };
  return several(ctx.getHandler()) || several(ctx.getClass()) || modulesListing(ctx.getClass(), site.modules).length > 1;
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
export function routeKeyPath(ctx: ExecutionContext, { config, modules }: RouteSite): (matched: string) => string {
  const prefix = config ? `/${config.getGlobalPrefix().replace(/^\/+|\/+$/g, '')}` : '/';
  const versioning = config?.getVersioning();
  const uriPrefix = versioning?.type === VersioningType.URI ? (versioning.prefix === false ? '' : (versioning.prefix ?? 'v')) : undefined;
  // The versions the router put this handler under, as Nest picks them: the method's, else the
  // controller's, else the app's default. A version-neutral route has no version segment, and
  // its own first segment (`v1/...`) is its own.
  const declared: unknown =
    Reflect.getMetadata(VERSION_METADATA, ctx.getHandler()) ?? Reflect.getMetadata(VERSION_METADATA, ctx.getClass()) ?? versioning?.defaultVersion;
  const declaredList = ([] as unknown[]).concat(declared ?? []);
  // Numbers too (a version list from JSON or JavaScript: Nest serves `defaultVersion: [1, 2]` at
  // /v1 and /v2; left out, a retry under the other version ran again).
  const versions = new Set(
    declaredList.filter((version) => typeof version === 'string' || typeof version === 'number').map(String),
  );
  // Version-neutral and versioned at once ([VERSION_NEUTRAL, '1']): the router built each path
  // once without a version segment and once under each version, so a matched path that is one
  // of the neutral paths has none, even where its own first segment reads as one ('v1/drafts'
  // is served at /v1/drafts and /v1/v1/drafts: an adversarial helper, keyed apart, ran twice).
  const neutralPaths = uriPrefix !== undefined && versions.size > 0 && declaredList.includes(VERSION_NEUTRAL) ? pathsWithoutVersion(ctx, modules) : undefined;
  return (matched) => {
    let rest = matched;
    if (prefix !== '/' && (rest === prefix || rest.startsWith(`${prefix}/`))) rest = rest.slice(prefix.length);
    if (uriPrefix !== undefined && versions.size > 0 && !neutralPaths?.has(wildcardsAlike(trimmed(rest)))) {
      const segment = /^\/([^/]+)/.exec(rest)?.[1];
      if (segment?.startsWith(uriPrefix) && versions.has(segment.slice(uriPrefix.length))) rest = rest.slice(segment.length + 1);
    }
    return rest.startsWith('/') ? rest : `/${rest}`;
  };
}

/**
 * The paths Nest builds for a handler without a version segment or global prefix: each mount's
 * `RouterModule` path, the controller's paths, the method's, joined as `RoutePathFactory` joins
 * them (`wildcardsAlike`: the adapter may rewrite their wildcards before the router sees them).
 */
function pathsWithoutVersion(ctx: ExecutionContext, modules: ModulesContainer | undefined): Set<string> {
  const listed = (target: object): string[] => {
    const path: unknown = Reflect.getMetadata(PATH_METADATA, target);
    return ([] as unknown[]).concat(path ?? '').map((part) => (typeof part === 'string' ? part : ''));
  };
  const applicationId = modules?.applicationId ?? '';
  const mounts = modulesListing(ctx.getClass(), modules).map((module): unknown =>
    Reflect.getMetadata(MODULE_PATH + applicationId, module.metatype) ?? Reflect.getMetadata(MODULE_PATH, module.metatype),
  );
  const paths = new Set<string>();
  for (const mount of mounts.length > 0 ? mounts : ['']) {
    for (const controller of listed(ctx.getClass())) {
      for (const method of listed(ctx.getHandler())) {
        paths.add(wildcardsAlike(trimmed(joined([typeof mount === 'string' ? mount : '', controller, method]))));
      }
    }
  }
  return paths;
}

/**
 * A route path with its wildcards written one way: Nest's adapters rewrite a legacy `*`, `(.*)`
 * or `+` into a named one (`{*path}`, `*path`) before the router sees it, so the matched path is
 * not the one declared (an adversarial helper: `files/*` under a `RouterModule` path `v1`).
 */
function wildcardsAlike(path: string): string {
  return path.replace(/\{\*[^}]*\}|\*\w*|\(\.\*\)|\/\+(?=\/|$)/g, (wildcard) => (wildcard.startsWith('/') ? '/*' : '*'));
}

/** Path fragments joined with one slash between each (empty ones skipped), as Nest joins them. */
function joined(parts: string[]): string {
  let path = '';
  for (const part of parts) if (part) path = path.replace(/\/+$/, '') + (part.startsWith('/') ? part : `/${part}`);
  return path;
}

/** A path with a leading slash and no trailing one (`/` for the root), as the router's. */
function trimmed(path: string): string {
  const lead = path.startsWith('/') ? path : `/${path}`;
  return lead.length > 1 ? lead.replace(/\/+$/, '') || '/' : lead;
}
