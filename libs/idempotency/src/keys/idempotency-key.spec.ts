import { describe, it, expect } from '@jest/globals';
import fc from 'fast-check';
import { MAX_KEY_LENGTH } from '../idempotency.constants.js';
import { parseKeyHeader, validateKey } from './idempotency-key.js';

describe('parseKeyHeader', () => {
  it('treats an absent header as missing', () => {
    expect(parseKeyHeader(undefined)).toBeUndefined();
    expect(parseKeyHeader([])).toBeUndefined();
  });

  it.each([
    ['abc', 'abc'],
    ['"abc"', 'abc'],
    ['  abc\t', 'abc'],
    ['\t "abc" ', 'abc'],
    ['" abc "', ' abc '],
    ['"a\\"b"', 'a"b'],
    ['"a\\\\b"', 'a\\b'],
    ['8e03978e-40d5-43e8-bc93-6894a57f9324', '8e03978e-40d5-43e8-bc93-6894a57f9324'],
    ['a"b', 'a"b'],
    ['a, b', 'a, b'],
    ['ключ-🔑', 'ключ-🔑'],
  ])('reads %j as the key %j', (header, key) => {
    expect(parseKeyHeader(header)).toEqual({ key });
  });

  it('gives the bare and quoted forms the same key', () => {
    expect(parseKeyHeader('"order-1"')).toEqual(parseKeyHeader('order-1'));
  });

  it('reads a one-element array like its element', () => {
    expect(parseKeyHeader(['"k"'])).toEqual({ key: 'k' });
  });

  it('refuses a repeated header instead of calling it missing', () => {
    expect(parseKeyHeader(['a', 'b'])).toEqual({ invalid: 'the header was sent more than once' });
    expect(parseKeyHeader('"a", "b"')).toEqual({ invalid: expect.stringMatching(/more than once/) });
  });

  it.each([
    ['', /empty/],
    ['   ', /empty/],
    ['""', /empty/],
    ['"abc', /malformed/],
    ['"ab"c"', /malformed/],
    ['"abc"x', /malformed/],
    ['"a\\nb"', /malformed/],
    ['"abc\\"', /malformed/],
    ['"', /malformed/],
    ['a\u0000b', /control/],
    ['"a\u0007b"', /control/],
  ])('refuses %j', (header, reason) => {
    const result = parseKeyHeader(header);
    expect(result).toEqual({ invalid: expect.stringMatching(reason) });
  });
});

describe('validateKey', () => {
  it('accepts ordinary keys', () => {
    expect(validateKey('k')).toBeUndefined();
    expect(validateKey('x'.repeat(MAX_KEY_LENGTH))).toBeUndefined();
  });

  it('refuses an empty key', () => {
    expect(validateKey('')).toMatch(/empty/);
  });

  // helper-195: the header's spaces were trimmed to an empty key (400), a body field or a quoted
  // header of them was a key: every blank order of a user one record.
  it.each([' ', '   ', '\u00A0', ' \u2003 ', '\u3000'])('refuses a key of white space only (%j)', (key) => {
    expect(validateKey(key)).toMatch(/only white space/);
    expect(parseKeyHeader(`"${key}"`)).toEqual({ invalid: expect.stringMatching(/only white space/) });
  });

  // A key of characters drawn as nothing looks blank to whoever reads it, as spaces do: every such
  // key of a user (a template over an empty field that inserts a zero-width space) was one record.
  it.each(['\u200B', '\u200B\u200B', ' \u2060 ', '\u00AD', '\u3164', '\u200D\uFE0F'])('refuses a key of invisible characters only (%j)', (key) => {
    expect(validateKey(key)).toMatch(/only white space or invisible characters/);
    expect(parseKeyHeader(`"${key}"`)).toEqual({ invalid: expect.stringMatching(/only white space or invisible characters/) });
  });

  it('accepts invisible characters beside visible ones', () => {
    expect(validateKey('a\u200Bb')).toBeUndefined();
    expect(validateKey('\u2800')).toBeUndefined(); // the braille blank is a character of its own
  });

  it('counts the length in code points, not UTF-16 units', () => {
    const emoji = '😀'; // two UTF-16 units, one code point
    expect(validateKey(emoji.repeat(MAX_KEY_LENGTH))).toBeUndefined();
    expect(validateKey(emoji.repeat(MAX_KEY_LENGTH + 1))).toMatch(/longer than 255/);
    expect(validateKey('x'.repeat(MAX_KEY_LENGTH + 1))).toMatch(/longer than 255/);
  });

  it.each([
    ['NUL', '\u0000'],
    ['tab', '\t'],
    ['newline', '\n'],
    ['unit separator', '\u001F'],
    ['DEL', '\u007F'],
    ['C1 start', '\u0080'],
    ['C1 end', '\u009F'],
  ])('refuses a %s', (_name, ch) => {
    expect(validateKey(`a${ch}b`)).toMatch(/control character/);
  });

  it('accepts the first printable characters after the control ranges', () => {
    expect(validateKey(' a~\u00A0\u00FF')).toBeUndefined();
  });

  it.each([
    ['lone high surrogate', 'a\uD800b'],
    ['lone low surrogate', 'a\uDC00b'],
    ['trailing high surrogate', 'ab\uD83D'],
    ['replacement character', 'a\uFFFDb'],
  ])('refuses a %s', (_name, key) => {
    expect(validateKey(key)).toMatch(/not valid UTF-8/);
  });

  // The regular expressions alone, as validateKey ran them on every key before its ASCII fast path.
  const byRegExps = (key: string): string | undefined => {
    if (key.length === 0) return 'it is empty';
    if (!/[^\s\p{Default_Ignorable_Code_Point}]/u.test(key)) return 'it is only white space or invisible characters';
    if (/[\u0000-\u001F\u007F-\u009F]/.test(key)) return 'it contains a control character';
    if (/[\p{Cs}\uFFFD]/u.test(key)) return 'it is not valid UTF-8 text';
    return validateKey(key);
  };
  const edges = ['\u0000', '\t', ' ', '!', 'a', '~', '\u007F', '\u0080', '\u009F', '\u00A0', '\u2003', '\uD800', '\uDC00', '\uFFFD', 'é', '\u200B', '\u3164'];

  it('answers as its regular expressions do, printable ASCII or not', () => {
    const key = fc.array(fc.oneof(fc.constantFrom(...edges), fc.string({ maxLength: 3 })), { maxLength: 12 }).map((parts) => parts.join(''));
    fc.assert(fc.property(key, (k) => expect(validateKey(k)).toBe(byRegExps(k))), { numRuns: 2000 });
  });
});
