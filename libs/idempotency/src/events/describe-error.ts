import { inspect } from 'node:util';

/** What a `store_error` event carries of the store's error (see `IdempotencyStoreErrorEvent.error`). */
export type StoreErrorDescription = Error & { code?: string };

/**
 * A thrown value as text and a stack, whatever it is: an `Error`, a string, an object with no
 * prototype (no `toString`), a Proxy whose traps throw. Never throws.
 */
export function describeThrown(thrown: unknown): { message: string; stack: string | undefined } {
  try {
    const message = (thrown as { message?: unknown } | null | undefined)?.message;
    const stack = (thrown as { stack?: unknown } | null | undefined)?.stack;
    return {
      message:
        typeof message === 'string'
          ? message
          : typeof thrown === 'object' && thrown !== null
            ? inspect(thrown, { depth: 2, breakLength: Infinity })
            : String(thrown),
      stack: typeof stack === 'string' ? stack : undefined,
    };
  } catch {
    return { message: 'a value that cannot be described', stack: undefined };
  }
}

/**
 * The store's error as an event carries it: a new `Error` with its `name`, its `code` (else its
 * cause's: `ECONNREFUSED`, a PostgreSQL SQLSTATE) and its `message` with the storage key replaced
 * by `keyHash`, and the frames of its stack. Never its `cause` nor a driver's own fields (command
 * arguments, query parameters), which hold the client key, the saved answer and the claim token.
 */
export function describeStoreError(error: unknown, storageKey: string, keyHash: string): StoreErrorDescription {
  try {
    const { message, stack } = describeThrown(error);
    const clean = message.split(storageKey).join(keyHash);
    const name = nameOf(error);
    const description: StoreErrorDescription = new Error(clean);
    description.name = name;
    const code = codeOf(error) ?? codeOf((error as { cause?: unknown } | null | undefined)?.cause);
    if (code !== undefined) description.code = code;
    // The frames only: the first lines of a stack repeat the message, storage key included.
    const frames = stack?.split('\n').filter((line) => /^\s+at /.test(line)) ?? [];
    description.stack = [`${name}: ${clean}`, ...frames].join('\n');
    return description;
  } catch {
    return new Error('The store failed with an error that cannot be described');
  }
}

function nameOf(error: unknown): string {
  const name = (error as { name?: unknown } | null | undefined)?.name;
  return typeof name === 'string' && name !== '' ? name : 'Error';
}

function codeOf(error: unknown): string | undefined {
  const code = (error as { code?: unknown } | null | undefined)?.code;
  return typeof code === 'string' || typeof code === 'number' ? String(code) : undefined;
}
