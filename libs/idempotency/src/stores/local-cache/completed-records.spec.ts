import { afterEach, describe, expect, it, jest } from '@jest/globals';
import { CompletedRecords, ENTRY_OVERHEAD_BYTES, entryBytes, HEADER_OVERHEAD_BYTES, type CachedRecord } from './completed-records.js';

const record = (body: string, expiresAt = Number.POSITIVE_INFINITY): CachedRecord => ({
  fingerprint: 'fp',
  response: { statusCode: 201, headers: { 'content-type': 'text/plain' }, body },
  expiresAt,
});

/** What `key` holding `record(body)` counts against maxBytes. */
const sizeOf = (key: string, body: string) => entryBytes(key, record(body));

/** A string as V8 keeps it: 16 bytes, then `bytesPerCharacter` a character, rounded up to 8. */
const text = (length: number, bytesPerCharacter = 1) => Math.ceil((16 + length * bytesPerCharacter) / 8) * 8;

describe('CompletedRecords', () => {
  it('holds at most maxEntries, dropping the least recently used first', () => {
    const records = new CompletedRecords(3, 1_000_000);
    for (const key of ['a', 'b', 'c']) records.set(key, record(key));
    records.get('a', 0); // a is now the most recently used
    records.set('d', record('d'));
    expect(records.size).toBe(3);
    expect(records.get('b', 0)).toBeUndefined();
    expect(['a', 'c', 'd'].map((key) => records.get(key, 0)?.response.body)).toEqual(['a', 'c', 'd']);
  });

  it('keeps the order of use through any mix of hits, replacements, deletions and evictions', () => {
    // Against a plain model: an array, least recently used first.
    const max = 5;
    const records = new CompletedRecords(max, 1_000_000);
    let model: string[] = [];
    let seed = 7;
    const next = (n: number) => ((seed = (seed * 1103515245 + 12345) % 2 ** 31), seed % n);
    for (let step = 0; step < 2000; step++) {
      const key = `k${next(8)}`;
      const op = next(3);
      if (op === 0) {
        const hit = records.get(key, 0);
        expect(hit !== undefined).toBe(model.includes(key));
        if (hit) model = [...model.filter((k) => k !== key), key];
      } else if (op === 1) {
        records.set(key, record(key));
        model = [...model.filter((k) => k !== key), key].slice(-max);
      } else {
        records.delete(key);
        model = model.filter((k) => k !== key);
      }
      expect(records.size).toBe(model.length);
      // Each new key evicts the least recently used one. The reads in the model's order keep it.
      if (step % 50 === 49) {
        expect(model.filter((k) => records.get(k, 0) !== undefined)).toEqual(model);
        records.set(`new${step}`, record('n'));
        model = [...model, `new${step}`].slice(-max);
        expect(model.every((k) => records.get(k, 0) !== undefined)).toBe(true);
        expect(records.size).toBe(model.length);
      }
    }
  });

  describe('a hit', () => {
    afterEach(() => {
      jest.restoreAllMocks();
    });

    it('moves the entry without taking it out of its Map and putting it back (V8 rehashes a large Map for that)', () => {
      const records = new CompletedRecords(10_000, 1_000_000_000);
      for (let i = 0; i < 1000; i++) records.set(`k${i}`, record(`v${i}`));
      const set = jest.spyOn(Map.prototype, 'set');
      const remove = jest.spyOn(Map.prototype, 'delete');
      for (let i = 0; i < 100; i++) expect(records.get(`k${i % 10}`, 0)).toBeDefined();
      expect([set.mock.calls.length, remove.mock.calls.length]).toEqual([0, 0]);
      // ...and it still counts as a use: k0-k9 outlive the others.
      jest.restoreAllMocks();
      const small = new CompletedRecords(3, 1_000_000);
      for (const key of ['a', 'b', 'c']) small.set(key, record(key));
      small.get('a', 0);
      small.get('b', 0);
      small.set('d', record('d'));
      expect(['a', 'b', 'c', 'd'].map((key) => small.get(key, 0) !== undefined)).toEqual([true, true, false, true]);
    });
  });

  it('holds at most maxBytes, counting keys, fingerprints, bodies and headers plus the overheads', () => {
    const body = 'x'.repeat(1000);
    const one = sizeOf('k0', body);
    const records = new CompletedRecords(1000, one * 3 + one / 2);
    for (let i = 0; i < 10; i++) {
      records.set(`k${i}`, record(body));
      expect(records.bytes).toBeLessThanOrEqual(one * 3 + one / 2);
    }
    expect(records.size).toBe(3);
    expect(records.bytes).toBe(one * 3);
    expect(records.get('k9', 0)).toBeDefined();
    expect(records.get('k6', 0)).toBeUndefined();
  });

  it('counts each string as V8 keeps it: a byte a Latin-1 character, two for any other, plus the overheads', () => {
    const fixed = ENTRY_OVERHEAD_BYTES + text(1) + text(2) + HEADER_OVERHEAD_BYTES + text('content-type'.length) + text('text/plain'.length);
    expect(entryBytes('k', record('a'.repeat(1000)))).toBe(fixed + text(1000));
    expect(entryBytes('k', record('é'.repeat(1000)))).toBe(fixed + text(1000));
    expect(entryBytes('k', record(`a${'日'.repeat(999)}`))).toBe(fixed + text(1000, 2));
    expect(entryBytes('k', record(`${'a'.repeat(999)}😀`))).toBe(fixed + text(1001, 2)); // a surrogate pair: two UTF-16 units
    expect(entryBytes('日', record('a'))).toBe(fixed - text(1) + text(1, 2) + text(1));
    const noBody = { fingerprint: '', response: { statusCode: 204, headers: {} }, expiresAt: 1 };
    expect(entryBytes('k', noBody)).toBe(ENTRY_OVERHEAD_BYTES + text(1) + text(0));
  });

  it('keeps copies of its own: a later change of the caller\'s record does not reach the entry', () => {
    const records = new CompletedRecords(10, 1_000_000);
    const mine = record('body');
    records.set('k', mine);
    mine.response.headers['content-type'] = 'changed';
    mine.response.body = 'changed';
    expect(records.get('k', 0)?.response).toEqual(record('body').response);
  });

  it('does not keep a record larger than maxBytes alone, and keeps the others', () => {
    const records = new CompletedRecords(10, 2000);
    records.set('small', record('s'));
    records.set('big', record('x'.repeat(2000)));
    expect(records.get('big', 0)).toBeUndefined();
    expect(records.get('small', 0)).toBeDefined();
    expect(records.bytes).toBe(sizeOf('small', 's'));
  });

  it('never answers an entry at or past its expiry, and frees its bytes', () => {
    const records = new CompletedRecords(10, 1_000_000);
    records.set('k', record('v', 100));
    expect(records.get('k', 99.9)).toBeDefined();
    expect(records.get('k', 100)).toBeUndefined();
    expect(records.size).toBe(0);
    expect(records.bytes).toBe(0);
  });

  it('replaces an entry of the same key without counting it twice; delete and clear free the bytes', () => {
    const records = new CompletedRecords(10, 1_000_000);
    records.set('k', record('one'));
    records.set('k', record('three'));
    expect(records.size).toBe(1);
    expect(records.bytes).toBe(sizeOf('k', 'three'));
    records.delete('k');
    expect(records.bytes).toBe(0);
    records.set('a', record('a'));
    records.clear();
    expect([records.size, records.bytes]).toEqual([0, 0]);
  });
});
