import { Injectable } from '@nestjs/common';
import type { GuardedRoute } from './route-options.js';

/**
 * What the guard remembers across calls, one per `IdempotencyModule`: each route's options, and
 * the configuration problems already logged. It lives beside the guard, not in it, because Nest
 * may build the guard more than once: a subclass that injects a request-scoped provider (a tenant
 * resolver) is request-scoped too, so Nest builds it for every request, and a guard that kept
 * this itself would work out each route's options and log its "once per route" errors anew on
 * every request.
 */
@Injectable()
export class GuardMemory {
  /** Per controller class, then handler: subclasses of one base share its handler functions. */
  private readonly routes = new WeakMap<object, WeakMap<object, GuardedRoute | null>>();
  /** Configuration problems already logged (once per handler and kind). */
  private readonly logged = new Set<string>();

  /** The routes of one controller class, by handler: `null` for a handler the guard leaves alone. */
  routesOf(controller: object): WeakMap<object, GuardedRoute | null> {
    let routes = this.routes.get(controller);
    if (!routes) this.routes.set(controller, (routes = new WeakMap()));
    return routes;
  }

  /** Runs `log` the first time `what` is said, never again. */
  onceFor(what: string, log: () => void): void {
    if (this.logged.has(what)) return;
    this.logged.add(what);
    log();
  }
}
