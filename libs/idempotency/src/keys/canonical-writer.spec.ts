import { describe, it, expect } from '@jest/globals';
import { IdempotencyError } from '../errors/idempotency.errors.js';
import { MAX_CANONICAL_DEPTH } from './canonical-writer.js';
import { canonicalJson } from './fingerprint.js';

/** Obviously-correct reference: JSON.stringify for leaves, code-unit-sorted keys for objects. */
function reference(value: unknown): string | undefined {
  if (value !== null && typeof value === 'object' && typeof (value as { toJSON?: unknown }).toJSON === 'function') {
    return reference((value as { toJSON(): unknown }).toJSON());
  }
  if (Array.isArray(value)) return '[' + value.map((v) => reference(v) ?? 'null').join(',') + ']';
  if (value !== null && typeof value === 'object') {
    const parts: string[] = [];
    for (const key of Object.keys(value).sort()) {
      const text = reference((value as Record<string, unknown>)[key]);
      if (text !== undefined) parts.push(JSON.stringify(key) + ':' + text);
    }
    return '{' + parts.join(',') + '}';
  }
  return JSON.stringify(value);
}

describe('canonicalJson', () => {
  it('sorts keys at every depth and keeps array order', () => {
    expect(canonicalJson({ b: 1, a: { d: [3, 1, { z: 1, y: 2 }], c: 2 } })).toBe(
      '{"a":{"c":2,"d":[3,1,{"y":2,"z":1}]},"b":1}',
    );
  });

  it('sorts by code unit, integer-like keys included', () => {
    expect(canonicalJson({ b: 1, 10: 2, 2: 3, B: 4, é: 5, '': 6 })).toBe('{"":6,"10":2,"2":3,"B":4,"b":1,"é":5}');
  });

  it('sorts objects with many keys (the native sort path)', () => {
    const wide: Record<string, number> = {};
    for (let i = 0; i < 300; i++) wide[`k${(i * 7919) % 1000}`] = i;
    expect(canonicalJson(wide)).toBe(reference(wide));
  });

  it('omits undefined properties like absent ones, and keeps null', () => {
    expect(canonicalJson({ a: 1, b: undefined, c: () => 1, d: Symbol('s') })).toBe('{"a":1}');
    expect(canonicalJson({ a: 1, b: undefined })).toBe(canonicalJson({ a: 1 }));
    expect(canonicalJson({ a: 1, b: null })).toBe('{"a":1,"b":null}');
    expect(canonicalJson({ a: 1, b: null })).not.toBe(canonicalJson({ a: 1 }));
    expect(canonicalJson([undefined, null, () => 1])).toBe('[null,null,null]');
  });

  it('writes primitives as JSON.stringify does, but non-finite numbers, which are not null', () => {
    for (const v of ['', 'x', 0, -0, 1.5, 1e21, 1e-7, -12, true, false, null]) {
      expect(canonicalJson(v)).toBe(JSON.stringify(v));
    }
    expect([NaN, Infinity, -Infinity].map((v) => canonicalJson(v))).toEqual(['NaN', 'Infinity', '-Infinity']);
    expect(canonicalJson(12345678901234567890n)).toBe('12345678901234567890');
    expect(canonicalJson(undefined)).toBeUndefined();
  });

  it('escapes strings exactly as JSON.stringify does', () => {
    const samples = [
      'plain', 'quote " backslash \\ slash /', 'new\nline\ttab\r\u0000\u001f\u007f', 'Grüße 東京 😀',
      'lone \ud800 high', 'lone \udc00 low', 'end \ud83d', '\ud83d\ude00\ud83d', 'x'.repeat(40) + '😀"',
      '\u2028\u2029', 'é'.repeat(31) + '😀', 'a'.repeat(6000), '😀'.repeat(3000) + '\\',
    ];
    for (const s of samples) expect(canonicalJson(s)).toBe(JSON.stringify(s));
    expect(canonicalJson({ 'k"\n': 'v', 'ключ😀': 1 })).toBe(reference({ 'k"\n': 'v', 'ключ😀': 1 }));
  });

  it('removes ignoreFields at any depth, inside arrays too', () => {
    const ignore = new Set(['timestamp', 'nonce']);
    const value = { timestamp: 1, a: { nonce: 'n', b: [{ timestamp: 2, c: 3 }, [{ nonce: 4 }]] }, list: ['timestamp'] };
    expect(canonicalJson(value, ignore)).toBe('{"a":{"b":[{"c":3},[{}]]},"list":["timestamp"]}');
    expect(canonicalJson(value, new Set())).toBe(reference(value));
  });

  it('honours toJSON (Dates, Buffers)', () => {
    const date = new Date('2026-01-02T03:04:05.000Z');
    expect(canonicalJson({ at: date, buf: Buffer.from('hi') })).toBe(
      '{"at":"2026-01-02T03:04:05.000Z","buf":{"data":[104,105],"type":"Buffer"}}',
    );
  });

  it('matches the reference on output larger than its buffer', () => {
    const items = Array.from({ length: 20_000 }, (_, i) => ({
      id: i, name: `item ${i} ü 😀`, tags: ['a', 'b"c'], price: i / 7, on: i % 2 === 0, none: null,
    }));
    const big = { items, blob: 'z'.repeat(100_000), uni: 'ü'.repeat(30_000) };
    const text = canonicalJson(big)!;
    expect(text.length).toBeGreaterThan(1_000_000);
    expect(text).toBe(reference(big));
  });

  it('works when a toJSON re-enters it', () => {
    const inner = { toJSON: () => canonicalJson({ y: 1, x: 2 }) };
    expect(canonicalJson({ b: inner, a: 1 })).toBe('{"a":1,"b":"{\\"x\\":2,\\"y\\":1}"}');
  });

  it('refuses nesting deeper than the limit with a clear error', () => {
    let deep: unknown = 1;
    for (let i = 0; i < MAX_CANONICAL_DEPTH; i++) deep = [deep];
    expect(canonicalJson(deep)).toBe('['.repeat(MAX_CANONICAL_DEPTH) + '1' + ']'.repeat(MAX_CANONICAL_DEPTH));
    const tooDeep = JSON.parse('{"a":'.repeat(MAX_CANONICAL_DEPTH + 1) + '1' + '}'.repeat(MAX_CANONICAL_DEPTH + 1));
    expect(() => canonicalJson(tooDeep)).toThrow(IdempotencyError);
    expect(() => canonicalJson(tooDeep)).toThrow(/deeper than 1000 levels/);
    expect(canonicalJson({ b: 2, a: 1 })).toBe('{"a":1,"b":2}'); // still usable afterwards
  });
});
