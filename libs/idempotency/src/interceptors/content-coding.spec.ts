import { describe, expect, it } from '@jest/globals';
import { deflateRawSync, deflateSync, gzipSync } from 'node:zlib';
import { acceptsCoding, decodedForRequest } from './content-coding.js';

describe('acceptsCoding: what a request says of a content coding (RFC 9110 §12.5.3)', () => {
  it.each([
    ['gzip, deflate, br', 'br', true],
    ['gzip, deflate', 'br', false],
    ['GZIP;q=0.5', 'gzip', true],
    ['gzip;q=0', 'gzip', false],
    ['gzip; q=0.000', 'gzip', false],
    ['*', 'br', true],
    ['*;q=0, identity', 'gzip', false],
    ['br;q=0, *', 'br', false],
    ['identity', 'gzip', false],
    [undefined, 'gzip', false],
    ['', 'gzip', false],
  ])('%s accepts %s: %s', (header, coding, expected) => {
    expect(acceptsCoding(header, coding)).toBe(expected);
  });
});

describe('decodedForRequest', () => {
  const text = Buffer.from('{"order":1}');
  it('leaves bytes whose coding the request accepts, or that have none, as they are', () => {
    expect(decodedForRequest(gzipSync(text), 'gzip', 'gzip')).toBeUndefined();
    expect(decodedForRequest(text, 'identity', undefined)).toBeUndefined();
  });
  it('decodes gzip and both forms of deflate for a request that does not accept them', () => {
    expect(decodedForRequest(gzipSync(text), 'gzip', 'identity')).toEqual(text);
    expect(decodedForRequest(deflateSync(text), 'deflate', undefined)).toEqual(text);
    expect(decodedForRequest(deflateRawSync(text), 'deflate', undefined)).toEqual(text);
  });
  it('leaves a coding it cannot decode, or bytes that do not decode, as they are (labelled)', () => {
    expect(decodedForRequest(text, 'zstd-unknown', undefined)).toBeUndefined();
    expect(decodedForRequest(text, 'gzip', undefined)).toBeUndefined();
  });
});
