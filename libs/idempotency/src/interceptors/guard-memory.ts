import { Injectable, Optional, type BeforeApplicationShutdown } from '@nestjs/common';
import { ApplicationConfig, ModulesContainer } from '@nestjs/core';
import type { RouteSite } from './route-paths.js';
import type { GuardedRoute } from './route-options.js';
import type { StoreCalls } from './store-calls.js';

/**
 * What the guard remembers across calls, one per `IdempotencyModule`: each route's options, and
 * the configuration problems already logged. It lives beside the guard, not in it, because Nest
 * may build the guard more than once: a subclass that injects a request-scoped provider (a tenant
 * resolver) is request-scoped too, so Nest builds it for every request, and a guard that kept
 * this itself would work out each route's options and log its "once per route" errors anew on
 * every request.
 */
@Injectable()
export class GuardMemory implements BeforeApplicationShutdown {
  /** The guard's calls to the store, with the runs in flight and the saves still tried: one set per module. */
  private calls?: StoreCalls;
  /** Per controller class, then handler: subclasses of one base share its handler functions. */
  private readonly routes = new WeakMap<object, WeakMap<object, GuardedRoute | null>>();
  /** Configuration problems already logged (once per handler and kind). */
  private readonly logged = new Set<string>();

  /** Where the app's routes are served: its global prefix and versioning, which a route's key leaves out, and its modules (`routeKeyPath`). */
  readonly site: RouteSite;

  constructor(@Optional() config?: ApplicationConfig, @Optional() modules?: ModulesContainer) {
    this.site = { config, modules };
  }

  /** The routes of one controller class, by handler: `null` for a handler the guard leaves alone. */
  routesOf(controller: object): WeakMap<object, GuardedRoute | null> {
    let routes = this.routes.get(controller);
    if (!routes) this.routes.set(controller, (routes = new WeakMap()));
    return routes;
  }

  /** The module's `StoreCalls`, made by `make` the first time it is asked for. */
  storeCalls(make: () => StoreCalls): StoreCalls {
    return (this.calls ??= make());
  }

  /**
   * Before the app shuts down (`app.close()`, a signal under `enableShutdownHooks()`), and so
   * before the store closes its client and TypeORM its DataSource (their `onApplicationShutdown`):
   * waits for the guarded runs in flight to settle and save. Nest waits only for responses still
   * open; a run whose caller already has an answer (an outer timeout's 408, an `@Res()` 202, an
   * event) lost its store under it, its key freed after a lease, and a retry to another instance
   * ran it again (an adversarial helper: 30 of 30 keys ran twice).
   */
  async beforeApplicationShutdown(): Promise<void> {
    await this.calls?.drain();
  }

  /** Runs `log` the first time `what` is said, never again. */
  onceFor(what: string, log: () => void): void {
    if (this.logged.has(what)) return;
    this.logged.add(what);
    log();
  }
}
