import { describe, it } from '@jest/globals';
import fc from 'fast-check';
import { fingerprintRequest } from './fingerprint.js';
import { buildStorageKey, type StorageKeyParts, type KeyUser } from './storage-key.js';

/** Rebuilds a value with the keys of every object in reverse (a different insertion order). */
function reorder(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(reorder);
  if (value === null || typeof value !== 'object') return value;
  return Object.fromEntries(Object.keys(value).reverse().map((k) => [k, reorder((value as Record<string, unknown>)[k])]));
}

/** Adds `field` with `noise` to every object, at any depth (own properties, `__proto__` too). */
function addNoise(value: unknown, field: string, noise: unknown): unknown {
  if (Array.isArray(value)) return value.map((v) => addNoise(v, field, noise));
  if (value === null || typeof value !== 'object') return value;
  const entries = Object.entries(value).map(([k, v]) => [k, addNoise(v, field, noise)] as const);
  return Object.fromEntries([...entries, [field, noise]]);
}

const fp = (body: unknown, ignore?: ReadonlySet<string>) =>
  fingerprintRequest({ method: 'POST', path: '/orders', body, contentType: 'application/json' }, ignore);

const json = fc.jsonValue({ maxDepth: 4 }).map((v) => JSON.parse(JSON.stringify(v)) as unknown);

describe('fingerprint properties', () => {
  it('ignores key order at every depth', () => {
    fc.assert(fc.property(json, (body) => fp(reorder(body)) === fp(body)), { numRuns: 500 });
  });

  it('ignores ignored fields at every depth', () => {
    const ignore = new Set(['nonce']);
    fc.assert(
      fc.property(json, json, (body, noise) => {
        const clean = JSON.parse(JSON.stringify(body, (k, v) => (k === 'nonce' ? undefined : v)));
        return fp(addNoise(clean, 'nonce', noise), ignore) === fp(clean, ignore);
      }),
      { numRuns: 500 },
    );
  });

  it('tells apart any two bodies whose canonical JSON differs', () => {
    fc.assert(
      fc.property(json, json, (a, b) => {
        const canonical = (v: unknown) => JSON.stringify(sortDeep(v));
        return (canonical(a) === canonical(b)) === (fp(a) === fp(b));
      }),
      { numRuns: 1000 },
    );
  });

  it('changes when any single leaf value changes', () => {
    fc.assert(
      fc.property(fc.dictionary(fc.string(), fc.oneof(fc.string(), fc.integer(), fc.boolean())), fc.string(), (body, key) => {
        fc.pre(Object.hasOwn(body, key));
        const changed = { ...body, [key]: typeof body[key] === 'string' ? `${body[key]}!` : String(body[key]) };
        return fp(changed) !== fp(body);
      }),
      { numRuns: 300 },
    );
  });
});

function sortDeep(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(sortDeep);
  if (value === null || typeof value !== 'object') return value;
  return Object.fromEntries(Object.keys(value).sort().map((k) => [k, sortDeep((value as Record<string, unknown>)[k])]));
}

describe('storage key properties', () => {
  const text = fc.string({ unit: 'binary', maxLength: 12 });
  const chars = fc.constantFrom(':', '%', '{', '}', '*', 'ip', '3A', '%uD800', 'a', '', '\ud800', '\udfff');
  const tricky = fc.array(fc.oneof(chars, text), { maxLength: 4 }).map((parts) => parts.join(''));
  const parts: fc.Arbitrary<StorageKeyParts> = fc.record({
    prefix: fc.constant('no_repeat'),
    user: fc.oneof(fc.record({ id: tricky }), fc.record({ ip: tricky }), fc.constant({ anonymous: true as const })),
    handler: tricky,
    key: tricky,
  });

  /** The inverse of buildStorageKey: that it exists is what makes the key injective. */
  function decode(storageKey: string): StorageKeyParts {
    const segments = storageKey.split(':');
    const [prefix, ...rest] = segments;
    const tagged = rest.length === 4;
    if (!(rest.length === 3 || (tagged && rest[0] === 'ip') || (tagged && rest[0] === 'anon' && rest[1] === ''))) {
      throw new Error(`undecodable ${storageKey}`);
    }
    const user: KeyUser = !tagged ? { id: unescape(rest[0]) } : rest[0] === 'ip' ? { ip: unescape(rest[1]) } : { anonymous: true };
    const [handler, key] = rest.slice(-2).map(unescape);
    return { prefix, user, handler, key };
  }
  const unescape = (segment: string) =>
    segment
      .split(/(%u[0-9A-F]{4})/)
      .map((part) => (part.startsWith('%u') ? String.fromCharCode(parseInt(part.slice(2), 16)) : decodeURIComponent(part)))
      .join('');

  it('decodes back to the same (user, handler, key) triple, so no two triples share a key', () => {
    fc.assert(fc.property(parts, (a) => JSON.stringify(decode(buildStorageKey(a))) === JSON.stringify(a)), {
      numRuns: 20_000,
    });
  });

  it('never maps two different (user, handler, key) triples to one key', () => {
    fc.assert(
      fc.property(parts, parts, (a, b) => {
        const same = JSON.stringify(a) === JSON.stringify(b);
        return same === (buildStorageKey(a) === buildStorageKey(b));
      }),
      { numRuns: 20_000 },
    );
  });
});
