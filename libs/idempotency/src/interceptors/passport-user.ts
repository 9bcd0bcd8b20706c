import type { OnApplicationBootstrap } from '@nestjs/common';
import type { ModulesContainer } from '@nestjs/core';
import type { UserLocation } from '../idempotency.config.js';

/**
 * Finds where Passport puts the user, once the app has started: `PassportModule.register({
 * property: 'account' })` makes the `AuthGuard`s of that module set `request.account`, where the
 * guard would not look, and their callers would be anonymous to it (one user's replay another's
 * answer under business keys). Each such property is read before `user`, which the guards of
 * other modules (and Passport registered without a property) keep setting. The registrations are
 * `@nestjs/passport`'s `AuthModuleOptions` providers, known by the class's name: nothing is
 * imported (the app's copy of the package is the one that counts, wherever it is installed). A
 * property a guard sets for itself (`getAuthenticateOptions()`) is not seen: give `getUser`.
 */
export function passportUser(location: UserLocation, modules: ModulesContainer): OnApplicationBootstrap {
  return {
    onApplicationBootstrap() {
      const properties = new Set<string>();
      for (const module of modules.values()) {
        for (const [token, wrapper] of module.providers) {
          if (typeof token !== 'function' || token.name !== 'AuthModuleOptions') continue;
          const property = (wrapper.instance as { property?: unknown } | undefined)?.property;
          if (typeof property === 'string' && property !== '' && property !== 'user') properties.add(property);
        }
      }
      if (properties.size > 0) location.properties = [...properties, 'user'];
    },
  };
}
