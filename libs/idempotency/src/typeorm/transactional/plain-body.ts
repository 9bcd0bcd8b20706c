/** What `IdempotentTransactions` makes of a work's body before it saves and answers it, given as `serialize`. */
export type SerializeBody = (body: unknown) => unknown;

type InstanceToPlain = (value: object) => unknown;

let classTransformer: Promise<InstanceToPlain | undefined> | undefined;

/**
 * The work's body as JSON text, as the app's client sees it: saved, answered and replayed. The
 * record commits inside the work's transaction, before Nest's `ClassSerializerInterceptor` could
 * see the body, and `JSON.stringify` alone knows nothing of `@Exclude()`: an entity's password
 * hash was sent, replayed and saved (an adversarial helper). So, where the app has
 * class-transformer, each class instance without a `toJSON` of its own keeps only the properties
 * class-transformer's `instanceToPlain` keeps (`@Exclude()`, `@Expose()`, a class's strategy),
 * with their own values (a `@Transform`ed one when it gives a primitive or an array; one that
 * gives an object is the property's own value), a Set as an array. Everything else is as
 * `JSON.stringify` writes it: a `toJSON` (a dayjs, a Decimal, a URL, an entity that hides its
 * own fields) is honoured (a first version took every body apart through `instanceToPlain`, and
 * what a `toJSON` hid was sent: the review and a helper). `serialize` (the options') replaces all
 * that: a serializer's own options (`excludeExtraneousValues`, groups) are the app's.
 */
export async function bodyText(body: unknown, serialize: SerializeBody | undefined): Promise<string | undefined> {
  if (body === undefined) return undefined;
  if (serialize) return JSON.stringify(serializedOnce(serialize, body));
  const toPlain = await (classTransformer ??= import('class-transformer').then(
    ({ instanceToPlain }) => instanceToPlain as InstanceToPlain,
    () => undefined,
  ));
  return JSON.stringify(body, toPlain && keptBy(toPlain));
}

/** A `JSON.stringify` replacer: a class instance without `toJSON` keeps the properties `instanceToPlain` keeps. */
function keptBy(toPlain: InstanceToPlain) {
  return function (_key: string, value: unknown): unknown {
    if (value === null || typeof value !== 'object' || Array.isArray(value)) return value;
    const prototype: unknown = Object.getPrototypeOf(value);
    if (prototype === Object.prototype || prototype === null || typeof (value as { toJSON?: unknown }).toJSON === 'function') return value;
    let plain: unknown;
    try {
      plain = toPlain(value);
    } catch {
      // Say a cycle (class-transformer overflows the stack): JSON.stringify says what it says.
      return value;
    }
    // A Set, as class-transformer gives it: an array (its keys read as properties made
    // {"0":...,"1":...}, where ClassSerializerInterceptor sends the array; an adversarial helper).
    if (plain === null || typeof plain !== 'object' || Array.isArray(plain)) return plain;
    const kept: Record<string, unknown> = {};
    for (const name of Object.keys(plain)) {
      const own = name in value ? (value as Record<string, unknown>)[name] : undefined;
      const made = (plain as Record<string, unknown>)[name];
      kept[name] = own === undefined || made === null || typeof made !== 'object' ? made : own;
    }
    return kept;
  };
}

/** `serialize(body)`, refusing a result that is a promise (saved as `{}`, it would be answered so). */
function serializedOnce(serialize: SerializeBody, body: unknown): unknown {
  const plain = serialize(body);
  if (typeof (plain as { then?: unknown } | null)?.then === 'function') {
    throw new TypeError('IdempotentTransactions: serialize returned a promise; it must return the body itself');
  }
  return plain;
}
