import type { NoRepeatSubmitMetadata } from '../decorators/no-repeat-submit.decorator.js';
import { IdempotencyErrorCode } from '../errors/idempotency-http.exceptions.js';
import { MAX_KEY_LENGTH, REPLAYED_HEADER } from '../idempotency.constants.js';

/** A place `@NoRepeatSubmit()` decorated: a method (with its descriptor) or a controller class. */
interface DecoratedPlace {
  target: object;
  propertyKey?: string | symbol;
  descriptor?: PropertyDescriptor;
  metadata: NoRepeatSubmitMetadata;
}

const places: DecoratedPlace[] = [];
const documented = new WeakSet<DecoratedPlace>();

/** Called by `@NoRepeatSubmit()`: the place is documented once the module loads `@nestjs/swagger`. */
export function rememberDecoratedPlace(place: DecoratedPlace): void {
  places.push(place);
}

const errorSchema = (code: string) => ({
  type: 'object',
  properties: {
    statusCode: { type: 'integer' },
    error: { type: 'string' },
    message: { type: 'string' },
    code: { type: 'string', enum: [code] },
  },
});

/**
 * Adds the key header and the guard's answers to the OpenAPI operations of every decorated
 * route, when `@nestjs/swagger` is installed; does nothing otherwise. Runs while the application
 * is created (before `SwaggerModule.createDocument()` reads the metadata).
 */
export async function documentDecoratedRoutes(): Promise<boolean> {
  let swagger: typeof import('@nestjs/swagger');
  try {
    swagger = await import('@nestjs/swagger');
  } catch {
    return false;
  }
  const { ApiHeader, ApiResponse } = swagger;
  for (const place of places) {
    if (documented.has(place)) continue;
    documented.add(place);
    const { options, key } = place.metadata;
    const decorators: (ClassDecorator & MethodDecorator)[] = [];
    if ('header' in key) {
      decorators.push(
        ApiHeader({
          name: 'Idempotency-Key',
          required: !options.useRequestFingerprint,
          description: `One unique value per operation, reused on retries (1-${MAX_KEY_LENGTH} printable characters; "key" or key). A repeat gets the first answer again with ${REPLAYED_HEADER}: true.`,
          schema: { type: 'string', minLength: 1, maxLength: MAX_KEY_LENGTH },
        }) as ClassDecorator & MethodDecorator,
      );
    }
    const source = 'path' in key ? key.path.expression : 'header' in key ? 'the Idempotency-Key header' : 'the request';
    decorators.push(
      ApiResponse({ status: 400, description: `No key in ${source}, or an invalid one (${IdempotencyErrorCode.KEY_MISSING}, ${IdempotencyErrorCode.KEY_INVALID})`, schema: errorSchema(IdempotencyErrorCode.KEY_INVALID) }),
      ApiResponse({ status: 409, description: `A request with this key is still processing (${IdempotencyErrorCode.IN_PROGRESS}); retry after Retry-After seconds`, headers: { 'Retry-After': { schema: { type: 'integer' } } }, schema: errorSchema(IdempotencyErrorCode.IN_PROGRESS) }),
      ApiResponse({ status: 422, description: `The key was used with another payload (${IdempotencyErrorCode.KEY_REUSED})`, schema: errorSchema(IdempotencyErrorCode.KEY_REUSED) }),
    );
    if (options.failMode === 'closed') {
      decorators.push(
        ApiResponse({ status: 503, description: `The idempotency store is unavailable (${IdempotencyErrorCode.STORE_UNAVAILABLE}); retry after Retry-After seconds`, headers: { 'Retry-After': { schema: { type: 'integer' } } }, schema: errorSchema(IdempotencyErrorCode.STORE_UNAVAILABLE) }) as ClassDecorator & MethodDecorator,
      );
    }
    for (const decorate of decorators) {
      if (place.propertyKey === undefined) (decorate as ClassDecorator)(place.target as () => void);
      else (decorate as MethodDecorator)(place.target, place.propertyKey, place.descriptor!);
    }
  }
  return true;
}
