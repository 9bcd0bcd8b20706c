import { describe, expect, it } from '@jest/globals';
import { decodeRecord, encodeProcessing, encodeResponse, tokenPrefix } from './redis-record.js';

/** What the complete script writes: `C` + the processing head + `\n` + the response part. */
const completedFrom = (processing: string, response: Parameters<typeof encodeResponse>[0]) =>
  `C${processing.slice(1)}\n${encodeResponse(response)}`;

describe('Redis record encoding', () => {
  it('reads back a processing record, marked by a waiter or not', () => {
    const processing = encodeProcessing('tok', 'fp', 1234);
    expect(decodeRecord(processing)).toEqual({ state: 'processing', token: 'tok', fingerprint: 'fp', leaseEndMs: 1234 });
    expect(decodeRecord(`W${processing.slice(1)}`)).toMatchObject({ state: 'processing', token: 'tok' });
  });

  it('reads back a completed record whose body holds newlines, quotes and non-ASCII', () => {
    const response = { statusCode: 201, headers: { location: '/a\nb' }, body: '{"note":"line\\nbreak ü"}\n\n' };
    expect(decodeRecord(completedFrom(encodeProcessing('t', 'f', 1), response))).toEqual({
      state: 'completed',
      token: 't',
      fingerprint: 'f',
      response,
    });
  });

  it('keeps an empty body apart from no body', () => {
    const processing = encodeProcessing('t', '', 1);
    expect(decodeRecord(completedFrom(processing, { statusCode: 204, headers: {} })).state).toBe('completed');
    expect(decodeRecord(completedFrom(processing, { statusCode: 204, headers: {} }))).not.toHaveProperty('response.body');
    expect(decodeRecord(completedFrom(processing, { statusCode: 200, headers: {}, body: '' }))).toHaveProperty('response.body', '');
  });

  it('keeps a base64 body and an unreplayable reason, and leaves them absent when unset', () => {
    const processing = encodeProcessing('t', 'f', 1);
    const binary = { statusCode: 200, headers: { 'content-type': 'image/png' }, body: 'AP8KgA==', encoding: 'base64' as const };
    const tooLarge = { statusCode: 201, headers: {}, unreplayable: 'too_large' as const };
    const both = { statusCode: 200, headers: {}, body: '', encoding: 'base64' as const, unreplayable: 'not_delivered' as const };
    for (const response of [binary, tooLarge, both]) {
      expect(decodeRecord(completedFrom(processing, response))).toStrictEqual({ state: 'completed', token: 't', fingerprint: 'f', response });
    }
    const plain = decodeRecord(completedFrom(processing, { statusCode: 200, headers: {}, body: 'x' }));
    expect(plain).toStrictEqual({ state: 'completed', token: 't', fingerprint: 'f', response: { statusCode: 200, headers: {}, body: 'x' } });
  });

  it('writes a plain response as before (two-element meta), so older readers and records agree', () => {
    const headers = { 'content-type': 'application/json' };
    expect(encodeResponse({ statusCode: 201, headers, body: '{"a":1}' })).toBe(`${JSON.stringify([201, headers])}\n{"a":1}`);
    expect(encodeResponse({ statusCode: 204, headers: {} })).toBe('[204,{}]');
    expect(encodeResponse({ statusCode: 201, headers: {}, unreplayable: 'server_error' })).toBe(
      '[201,{},{"unreplayable":"server_error"}]',
    );
    // A record as the format before the flags wrote it.
    expect(decodeRecord('C["t","f",1]\n[201,{"location":"/a"}]\nbody')).toStrictEqual({
      state: 'completed',
      token: 't',
      fingerprint: 'f',
      response: { statusCode: 201, headers: { location: '/a' }, body: 'body' },
    });
  });

  it('starts a head with its own token only: no token is a prefix match for another', () => {
    const head = encodeProcessing('ab', 'f', 1).slice(1);
    expect(head.startsWith(tokenPrefix('ab'))).toBe(true);
    expect(head.startsWith(tokenPrefix('a'))).toBe(false);
    expect(encodeProcessing('a"b', 'f', 1).slice(1).startsWith(tokenPrefix('a"b'))).toBe(true);
  });

  it('writes a head exactly as JSON.stringify would, for plain and for escaped strings', () => {
    for (const [token, fingerprint] of [
      ['0f8a.1z', 'ab12'],
      ['a"b\\c', 'ü\n'],
      ['', ''],
    ]) {
      expect(encodeProcessing(token, fingerprint, 1_700_000_000_123)).toBe(`P${JSON.stringify([token, fingerprint, 1_700_000_000_123])}`);
      expect(tokenPrefix(token)).toBe(`[${JSON.stringify(token)},`);
    }
  });

  it('refuses a value that is not a record', () => {
    expect(() => decodeRecord('hello')).toThrow('not an idempotency record');
  });

  // An adversarial helper: a value the app wrote that starts as a record does (`C["a"]\n[200,null]`)
  // was taken for one, and the admin's inspect failed 500 on its null headers.
  it("reads back a message handler's answer (status 0) and any status Node sends (100 to 999)", () => {
    for (const statusCode of [0, 100, 599, 799, 999]) {
      expect(decodeRecord(completedFrom(encodeProcessing('t', 'f', 1), { statusCode, headers: {}, body: '"ok"' }))).toMatchObject({ state: 'completed' });
    }
  });

  it.each([
    ['null headers', 'C["a",""]\n[200,null]'],
    ['a status that is no number', 'C["a",""]\n["200",{}]'],
    ['a status out of range', 'C["a",""]\n[42,{}]'],
    ['a status past 999', 'C["a",""]\n[1000,{}]'],
    ['a header value that is no text', 'C["a",""]\n[200,{"etag":1}]'],
    ['a head that is no pair of strings', 'C[1,2]\n[200,{}]'],
    ['a processing head without a lease end', 'P["a","f"]'],
    ['no JSON at all', 'C{oops'],
  ])('refuses a value shaped almost as a record: %s', (_what, value) => {
    expect(() => decodeRecord(value)).toThrow();
  });
});
