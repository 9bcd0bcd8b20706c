import type { OnApplicationBootstrap } from '@nestjs/common';
import type { ModulesContainer } from '@nestjs/core';
import type { UserLocation } from '../idempotency.config.js';

/**
 * Finds where Passport puts the user, once the app has started: `PassportModule.register({
 * property: 'account' })` makes the `AuthGuard`s of that module set `request.account`, where the
 * guard would not look, and their callers would be anonymous to it (one user's replay another's
 * answer under business keys). Each such property is read before `user`, which the guards of
 * other modules (and Passport registered without a property) keep setting. `@nestjs/passport` is
 * an optional peer, loaded only to look. A property a guard sets for itself
 * (`getAuthenticateOptions()`) is not seen: give `getUser`.
 */
export function passportUser(location: UserLocation, modules: ModulesContainer): OnApplicationBootstrap {
  return {
    async onApplicationBootstrap() {
      const passport = await import('@nestjs/passport').catch(() => undefined);
      if (!passport) return;
      const properties = new Set<string>();
      for (const module of modules.values()) {
        const options = module.providers.get(passport.AuthModuleOptions)?.instance as { property?: unknown } | undefined;
        if (typeof options?.property === 'string' && options.property !== '' && options.property !== 'user') properties.add(options.property);
      }
      if (properties.size > 0) location.properties = [...properties, 'user'];
    },
  };
}
