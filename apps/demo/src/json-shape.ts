/**
 * Most values (object properties and array elements, counted over the whole document) a JSON
 * body or message may hold. The demo's have two to four fields. class-transformer's
 * `plainToInstance` (the ValidationPipe's `transform`) removes duplicate keys with `indexOf`,
 * quadratic in the keys of an object: a 1 MiB body of ~95,000 unknown keys held the event loop
 * for ~20 s.
 */
export const MAX_JSON_VALUES = 1000;
/** Deepest nesting of objects and arrays (the document itself is level 1): class-transformer recurses. */
export const MAX_JSON_DEPTH = 32;

/** Why a parsed JSON document is refused before it is transformed. */
export type JsonProblem = 'too-complex' | 'prototype-keys';

/**
 * What makes a parsed JSON document unacceptable, if anything: more than {@link MAX_JSON_VALUES}
 * values or deeper than {@link MAX_JSON_DEPTH} (`too-complex`), a `__proto__` key or a
 * `constructor` key holding `prototype` (`prototype-keys`). Walked with a stack of its own (a
 * document nested thousands of levels deep does not overflow the call stack); it stops at the
 * first problem, so it never looks at more than {@link MAX_JSON_VALUES} values.
 */
export function jsonProblemOf(document: unknown): JsonProblem | undefined {
  const pending: Array<{ value: unknown; depth: number }> = [{ value: document, depth: 1 }];
  let values = 0;
  while (pending.length > 0) {
    const { value, depth } = pending.pop()!;
    if (typeof value !== 'object' || value === null) continue;
    if (depth > MAX_JSON_DEPTH) return 'too-complex';
    if (Object.hasOwn(value, '__proto__')) return 'prototype-keys';
    const ctor: unknown = Object.hasOwn(value, 'constructor') ? (value as { constructor: unknown }).constructor : undefined;
    if (typeof ctor === 'object' && ctor !== null && Object.hasOwn(ctor, 'prototype')) return 'prototype-keys';
    // Counted before any value is read: Object.values() of a 95,000-key object alone takes ~100 ms.
    const keys = Array.isArray(value) ? undefined : Object.keys(value);
    values += keys ? keys.length : (value as unknown[]).length;
    if (values > MAX_JSON_VALUES) return 'too-complex';
    // One push per child: spreading a long array as arguments would overflow the stack.
    if (keys) for (const key of keys) pending.push({ value: (value as Record<string, unknown>)[key], depth: depth + 1 });
    else for (const child of value as unknown[]) pending.push({ value: child, depth: depth + 1 });
  }
  return undefined;
}
