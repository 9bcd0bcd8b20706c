import type { ExecutionContext } from '@nestjs/common';
import { IdempotencyKeyError } from '../errors/idempotency.errors.js';
import { readKeyHeader, validateKey } from '../keys/idempotency-key.js';
import { sentMoreThanOnce } from '../keys/header-lines.js';
import { evaluateKeyPath, keyText } from '../keys/key-expression.js';
import type { HttpRequest } from './http-request.js';
import { KEY_TEMPLATE_OF_NOTHING, userObjectOf } from './key-user.js';
import type { GuardedRoute } from './route-options.js';

/**
 * The client key a call carries: what the route's expression or function reads, else the key
 * header (`keyHeader`, default `Idempotency-Key`; a message has none). Undefined when the call
 * carries none. `#user.*` reads the user where the guard finds it (`userProperties`: Passport's
 * other property, then `user`; on Fastify also the Node.js request's).
 *
 * @throws IdempotencyKeyError for an unusable key, over any transport (each answers it its own way)
 */
export function readClientKey(ctx: ExecutionContext, route: GuardedRoute, userProperties?: readonly string[]): string | undefined {
  const source = route.metadata.key;
  const req = ctx.getType() === 'http' ? ctx.getArgByIndex<HttpRequest>(0) : undefined;
  let clientKey: string | undefined;
  if ('header' in source) {
    const parsed = req ? readKeyHeader(req, route.keyHeader) : undefined;
    if (parsed && 'invalid' in parsed) throw new IdempotencyKeyError(parsed.invalid);
    clientKey = parsed?.key;
  } else if ('resolve' in source) {
    return checkedKey(source.resolve(ctx), route, () => 'the idempotentKey function');
  } else {
    clientKey = evaluateKeyPath(
      source.path,
      req
        ? { body: req.body, headers: req.headers, query: req.query, params: req.params, user: userObjectOf(req, userProperties) }
        : { data: ctx.switchToRpc().getData() },
    );
    // `#headers.x`, as for the key header: two lines of it are no one key.
    const { root, segments } = source.path;
    if (root === 'headers' && clientKey?.includes(',') && segments.length === 1 && sentMoreThanOnce(req!, segments[0]!.toLowerCase())) {
      throw new IdempotencyKeyError('the header was sent more than once');
    }
  }
  return validKey(clientKey);
}

/**
 * A key the app's code gave (a key function, a subclass's `getKey`), checked as any key. Typed
 * to give a string, such code reads what the client sent: `req.body.ref` may be null (no key), a
 * number (its text) or an object (refused: it threw a TypeError, a 500, or all keyed one
 * `[object Object]`), and a template over missing fields writes `undefined:undefined`.
 *
 * @throws IdempotencyKeyError for an unusable key; a TypeError for a promise or an Observable
 */
export function checkedKey(value: unknown, route: GuardedRoute, giver: () => string): string | undefined {
  // A promise or an Observable is the developer's mistake, not the client's: said loudly (a 500
  // Nest logs), never a 400 that blames the client.
  if (answersLater(value)) {
    throw new TypeError(`${route.handler}: ${giver()} returned a promise or an Observable; it must return the key itself`);
  }
  return validKey(keyText(value, () => `the value ${giver()} read`));
}

/** A promise or an Observable: what app code gave where it must answer at once (a key function, `skipIf`). */
export function answersLater(value: unknown): boolean {
  const later = value as { then?: unknown; subscribe?: unknown } | null;
  return typeof later?.then === 'function' || typeof later?.subscribe === 'function';
}

function validKey(clientKey: string | undefined): string | undefined {
  if (clientKey === undefined) return undefined;
  const problem = validateKey(clientKey);
  if (problem) throw new IdempotencyKeyError(problem);
  // `Idempotency-Key: ${key}` over a key the client never made, or a key function's
  // `${cartId}:${checkoutId}` over a missing field: every such call was one key, and a second
  // purchase got the first one's answer (an adversarial helper).
  if (KEY_TEMPLATE_OF_NOTHING.test(clientKey)) {
    throw new IdempotencyKeyError(`it is what a template writes for a missing value (${JSON.stringify(clientKey)})`);
  }
  return clientKey;
}
