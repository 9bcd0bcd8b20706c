import { Logger, type OnApplicationBootstrap } from '@nestjs/common';
import type { ModulesContainer } from '@nestjs/core';
import type { UserLocation } from '../idempotency.config.js';

/**
 * Finds where Passport puts the user, once the app has started: `PassportModule.register({
 * property: 'account' })` makes `AuthGuard` set `request.account`, where the guard would not
 * look, and every signed-in caller would be anonymous to it (one user's replay another's answer
 * under business keys). `@nestjs/passport` is an optional peer, loaded only to look. Several
 * registrations with different properties are not guessed between: said once, `getUser` decides.
 * A property a guard sets for itself (`getAuthenticateOptions()`) is not seen: give `getUser`.
 */
export function passportUser(location: UserLocation, modules: ModulesContainer): OnApplicationBootstrap {
  return {
    async onApplicationBootstrap() {
      const passport = await import('@nestjs/passport').catch(() => undefined);
      if (!passport) return;
      const properties = new Set<string>();
      for (const module of modules.values()) {
        const options = module.providers.get(passport.AuthModuleOptions)?.instance as { property?: unknown } | undefined;
        if (typeof options?.property === 'string' && options.property !== '') properties.add(options.property);
      }
      if (properties.size === 1) location.property = [...properties][0]!;
      else if (properties.size > 1) {
        new Logger('IdempotencyModule').warn(
          `Passport is registered with several user properties (${[...properties].join(', ')}): the guard reads request.user; ` +
            'give IdempotencyModule.forRoot({ getUser }) to say where your users are.',
        );
      }
    },
  };
}
