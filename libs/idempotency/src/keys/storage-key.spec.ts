import { describe, it, expect } from '@jest/globals';
import fc from 'fast-check';
import { buildStorageKey, type StorageKeyParts } from './storage-key.js';

const PREFIX = 'no_repeat';
const build = (user: StorageKeyParts['user'], handler: string, key: StorageKeyParts['key']) =>
  buildStorageKey({ prefix: PREFIX, user, handler, key });

/** Inverse of buildStorageKey for one prefix: if it always recovers the triple, no two collide. */
function parse(storageKey: string): Omit<StorageKeyParts, 'prefix'> {
  expect(storageKey.startsWith(`${PREFIX}:`)).toBe(true);
  const parts = storageKey.slice(PREFIX.length + 1).split(':');
  const dec = (s: string) => {
    // Split on the %uXXXX lone-surrogate escapes, decode the rest normally.
    let out = '';
    for (const piece of s.split(/(%u[0-9A-F]{4})/)) {
      out += piece.startsWith('%u') ? String.fromCharCode(parseInt(piece.slice(2), 16)) : decodeURIComponent(piece);
    }
    return out;
  };
  const key = (s: string) => (s.startsWith('fp=') ? { fingerprint: dec(s.slice(3)) } : dec(s));
  if (parts.length === 3) {
    const user = parts[0].includes(',') ? { parts: parts[0].split(',').map(dec) } : { id: dec(parts[0]) };
    return { user, handler: dec(parts[1]), key: key(parts[2]) };
  }
  expect(parts).toHaveLength(4);
  expect(parts[0]).toBe('ip');
  return { user: { ip: dec(parts[1]) }, handler: dec(parts[2]), key: key(parts[3]) };
}

describe('buildStorageKey', () => {
  it('keeps ordinary keys readable', () => {
    expect(build({ id: 'u42' }, 'OrdersController.create', 'k-1')).toBe('no_repeat:u42:OrdersController.create:k-1');
    expect(build({ ip: '10.0.0.1' }, 'Orders.create', 'k')).toBe('no_repeat:ip:10.0.0.1:Orders.create:k');
    expect(build({ ip: '::1' }, 'Orders.create', 'k')).toBe('no_repeat:ip:%3A%3A1:Orders.create:k');
  });

  it('uses the prefix verbatim', () => {
    expect(buildStorageKey({ prefix: 'app:{idem}', user: { id: 'u' }, handler: 'h', key: 'k' })).toBe('app:{idem}:u:h:k');
  });

  it.each([
    ['colon in user vs colon in handler', [{ id: 'a:b' }, 'c', 'k'], [{ id: 'a' }, 'b:c', 'k']],
    ['colon in handler vs colon in key', [{ id: 'u' }, 'h:k', 'x'], [{ id: 'u' }, 'h', 'k:x']],
    ['user id that looks like an address', [{ id: 'ip:1.2.3.4' }, 'h', 'k'], [{ ip: '1.2.3.4' }, 'h', 'k']],
    ['user id "ip" vs address', [{ id: 'ip' }, '1.2.3.4', 'h:k'], [{ ip: '1.2.3.4' }, 'h', 'k']],
    ['IPv6 address vs user and handler', [{ ip: '::1' }, 'h', 'k'], [{ id: '' }, ':1:h', 'k']],
    ['literal %3A vs colon', [{ id: 'u' }, 'h', '%3A'], [{ id: 'u' }, 'h', ':']],
    ['literal %25 vs percent', [{ id: 'u' }, 'h', '%25'], [{ id: 'u' }, 'h', '%']],
    ['empty user vs empty handler', [{ id: '' }, 'h', 'k'], [{ id: 'h' }, '', 'k']],
    ['hash tags', [{ id: '{a}' }, 'h', 'k'], [{ id: '%7Ba%7D' }, 'h', 'k']],
    ['lone surrogate vs its escape text', [{ id: 'u' }, 'h', '\ud800'], [{ id: 'u' }, 'h', '%uD800']],
    ['lone surrogate vs replacement char', [{ id: 'u' }, 'h', '\ud800'], [{ id: 'u' }, 'h', '\ufffd']],
    ['parts vs an id with a comma', [{ parts: ['t1', '42'] }, 'h', 'k'], [{ id: 't1,42' }, 'h', 'k']],
    ['parts vs an id with a colon', [{ parts: ['t1', '42'] }, 'h', 'k'], [{ id: 't1:42' }, 'h', 'k']],
    ['parts vs parts with a comma inside', [{ parts: ['a,b', 'c'] }, 'h', 'k'], [{ parts: ['a', 'b,c'] }, 'h', 'k']],
    ['parts vs more parts', [{ parts: ['a', 'b'] }, 'h', 'k'], [{ parts: ['a', 'b', 'c'] }, 'h', 'k']],
    ['a client key equal to a fingerprint', [{ id: 'u' }, 'h', 'ab12'], [{ id: 'u' }, 'h', { fingerprint: 'ab12' }]],
    ['a client key that spells a fingerprint\'s segment', [{ id: 'u' }, 'h', 'fp=ab12'], [{ id: 'u' }, 'h', { fingerprint: 'ab12' }]],
  ] as const)('separates %s', (_name, a, b) => {
    const [ka, kb] = [build(a[0], a[1], a[2]), build(b[0], b[1], b[2])];
    expect(ka).not.toBe(kb);
    expect(parse(ka)).toEqual({ user: a[0], handler: a[1], key: a[2] });
    expect(parse(kb)).toEqual({ user: b[0], handler: b[1], key: b[2] });
  });

  it('never lets a segment inject a Redis hash tag', () => {
    const key = build({ id: '{tenant}' }, 'h{x}', '{k}');
    expect(key).not.toMatch(/[{}]/);
  });

  it('handles unicode, including lone surrogates, without throwing', () => {
    const key = build({ id: 'ユーザー😀' }, 'Orders.create', 'clé\udc00');
    expect(parse(key)).toEqual({ user: { id: 'ユーザー😀' }, handler: 'Orders.create', key: 'clé\udc00' });
  });

  it('round-trips random triples over a hostile alphabet (so no two collide)', () => {
    const alphabet = [':', '%', '3', 'A', 'i', 'p', '{', '}', '.', '', 'é', '😀', '\ud800', 'u', '%u', 'f', '=', 'fp='];
    let seed = 7;
    const rand = (n: number) => (seed = (seed * 1103515245 + 12345) & 0x7fffffff) % n;
    const text = () => Array.from({ length: rand(5) }, () => alphabet[rand(alphabet.length)]).join('');
    const seen = new Map<string, string>();
    for (let i = 0; i < 3000; i++) {
      // Parts are two or more non-empty texts, as `getUser` may give them (one part is an id).
      const part = () => text() || 'x';
      const kind = rand(3);
      const user = kind === 0 ? { id: text() } : kind === 1 ? { ip: text() } : { parts: Array.from({ length: 2 + rand(3) }, part) };
      const triple = { user, handler: text(), key: rand(4) === 0 ? { fingerprint: text() } : text() };
      const storageKey = build(triple.user, triple.handler, triple.key);
      expect(parse(storageKey)).toEqual(triple);
      const id = JSON.stringify(triple);
      expect(seen.get(storageKey) ?? id).toBe(id);
      seen.set(storageKey, id);
    }
  });
  // encodeSegment tells which segments go as they are by a table of characters: every other
  // well-formed text is encodeURIComponent's, each printable ASCII character tried.
  it('writes each well-formed segment as encodeURIComponent does', () => {
    const ascii = Array.from({ length: 95 }, (_, i) => String.fromCharCode(0x20 + i));
    const text = fc.array(fc.oneof(fc.constantFrom(...ascii, '\u007F', '\u0080', 'é', '😀'), fc.string({ maxLength: 2 })), { maxLength: 8 })
      .map((parts) => parts.join(''))
      .filter((value) => (value as string & { isWellFormed(): boolean }).isWellFormed());
    fc.assert(
      fc.property(text, (key) => expect(build({ id: 'u' }, 'H.m', key)).toBe(`${PREFIX}:u:H.m:${encodeURIComponent(key)}`)),
      { numRuns: 3000 },
    );
  });
});
