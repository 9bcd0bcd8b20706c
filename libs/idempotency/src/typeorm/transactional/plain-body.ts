/** What `IdempotentTransactions` makes of a work's body before it saves and answers it. */
export type SerializeBody = (body: unknown) => unknown;

let classTransformer: Promise<SerializeBody | undefined> | undefined;

/**
 * The body as the app's client sees it, the form saved, answered and replayed. The record commits
 * inside the work's transaction, before Nest's `ClassSerializerInterceptor` could see the body, and
 * `JSON.stringify` knows nothing of `@Exclude()`: an entity's password hash was sent, replayed and
 * saved (an adversarial helper). So the body goes through class-transformer's `instanceToPlain`,
 * as that interceptor does with no options, where the app has class-transformer; else it is
 * taken as it is. `serialize` (the options') replaces that: the interceptor's own options
 * (`excludeExtraneousValues`, groups) are the app's, and only it knows them.
 */
export function serializerOf(serialize: SerializeBody | undefined): Promise<SerializeBody | undefined> {
  if (serialize) return Promise.resolve(serialize);
  return (classTransformer ??= import('class-transformer').then(
    ({ instanceToPlain }) => (body: unknown) => (body !== null && typeof body === 'object' ? instanceToPlain(body) : body),
    () => undefined,
  ));
}
