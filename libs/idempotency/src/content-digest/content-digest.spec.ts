import { describe, expect, it } from '@jest/globals';
import { Controller, Post } from '@nestjs/common';
import { Reflector } from '@nestjs/core';
import { ExecutionContextHost } from '@nestjs/core/helpers/execution-context-host.js';
import { createHash } from 'node:crypto';
import { ContentDigest } from './content-digest.decorator.js';
import { ContentDigestGuard, type ContentHashedRequest } from './content-digest.guard.js';
import { parseContentDigestHeader, parseContentHashHeader, parseIfMatchDigest, readClientDigests, sha256Hex } from './content-digest.js';
import { ContentHashHttpException } from './content-digest.exceptions.js';

const BYTES = Buffer.from('<receipt><no>R-1</no></receipt>');
const HEX = createHash('sha256').update(BYTES).digest('hex');
const OTHER = sha256Hex(Buffer.from('other'));
/** RFC 9530 `Content-Digest` of BYTES: `sha-256=:<base64>:`. */
const B64 = Buffer.from(HEX, 'hex').toString('base64');
const SHA512 = createHash('sha512').update(BYTES).digest('base64');

describe('RFC 9530 Content-Digest', () => {
  it.each([
    [`sha-256=:${B64}:`, HEX],
    [`  sha-256=:${B64}:  `, HEX],
    [`sha-512=:${SHA512}:, sha-256=:${B64}:`, HEX],
    [`sha-256=:${B64}:;note=1`, HEX],
    [[`sha-256=:${B64}:`], HEX],
    [`sha-256=:${B64}:;note="a,b"`, HEX],
    [`sha-512=:${SHA512}:;note="x, y=:z:", sha-256=:${B64}:;by="me"`, HEX],
    [`sha-256=:${B64}:;note="say \\"a,b\\""`, HEX],
    // Two field lines are one dictionary (RFC 8941 4.2), as Node.js joins them: ", ".
    [[`sha-512=:${SHA512}:`, `sha-256=:${B64}:`], HEX],
  ])('reads the sha-256 member of %p', (value, hex) => expect(parseContentDigestHeader(value)).toBe(hex));

  it.each([
    [''],
    [`sha-512=:${SHA512}:`],
    [`sha-256=${B64}`],
    [`sha-256=:${B64.slice(4)}:`],
    [`sha-256=:${HEX}:`],
    [`sha-256=:${B64}:, sha-256=:${B64}:`],
    [[`sha-256=:${B64}:`, `sha-256=:${B64}:`]],
    ['sha-256=:!!!!:'],
    [`sha-256=:${B64}:;note="a,b`],
    [`sha-256=:${B64}:;note="a", `],
  ])('refuses %p', (value) => expect(parseContentDigestHeader(value)).toHaveProperty('invalid'));

  it('is absent when the header is', () => expect(parseContentDigestHeader(undefined)).toBeUndefined());

  it('is one of the digests a request carries', () => {
    expect(readClientDigests({ 'content-digest': `sha-256=:${B64}:`, 'x-content-hash': HEX })).toEqual({
      digests: [
        { source: 'x-content-hash', hex: HEX },
        { source: 'content-digest', hex: HEX },
      ],
    });
  });
});

describe('client digests', () => {
  it('hashes bytes as lower-case hex SHA-256', () => {
    expect(sha256Hex(BYTES)).toBe(HEX);
    expect(sha256Hex(new Uint8Array())).toBe('e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855');
  });

  it.each([
    [HEX, HEX],
    [HEX.toUpperCase(), HEX],
    [`sha256:${HEX}`, HEX],
    [`SHA-256:${HEX}`, HEX],
    [`  ${HEX}\t`, HEX],
    [[HEX], HEX],
  ])('reads X-Content-Hash %p', (value, hex) => expect(parseContentHashHeader(value)).toBe(hex));

  it.each([[''], [HEX.slice(1)], [`${HEX}0`], [`md5:${HEX}`], [`"${HEX}"`], [[HEX, HEX]], ['zz'.repeat(32)]])(
    'refuses X-Content-Hash %p',
    (value) => expect(parseContentHashHeader(value)).toEqual({ invalid: expect.any(String) }),
  );

  it.each([
    [`"${HEX}"`, HEX],
    [`"sha256:${HEX}"`, HEX],
    [` "${HEX.toUpperCase()}" `, HEX],
  ])('reads If-Match %p', (value, hex) => expect(parseIfMatchDigest(value)).toBe(hex));

  it.each([[HEX], [`W/"${HEX}"`], ['*'], [`"${HEX}", "${OTHER}"`], [`"${HEX}`], ['"abc"'], [[`"${HEX}"`, `"${HEX}"`]]])(
    'refuses If-Match %p (weak, *, lists, unquoted, not a digest)',
    (value) => expect(parseIfMatchDigest(value)).toEqual({ invalid: expect.any(String) }),
  );

  it('reads both headers, or neither', () => {
    expect(readClientDigests({})).toEqual({ digests: [] });
    expect(readClientDigests({ 'x-content-hash': HEX, 'if-match': `"sha256:${OTHER}"` })).toEqual({
      digests: [
        { source: 'x-content-hash', hex: HEX },
        { source: 'if-match', hex: OTHER },
      ],
    });
  });
});

describe('ContentDigestGuard', () => {
  @Controller()
  class Routes {
    @Post('optional')
    @ContentDigest()
    optional() {}

    @Post('required')
    @ContentDigest({ required: true })
    required() {}
  }
  const guard = new ContentDigestGuard(new Reflector());
  const run = (route: 'optional' | 'required', request: ContentHashedRequest) => {
    const context = new ExecutionContextHost([request, {}], Routes, Routes.prototype[route]);
    context.setType('http');
    return guard.canActivate(context);
  };
  const request = (headers: Record<string, string> = {}, rawBody: Buffer | undefined = BYTES): ContentHashedRequest => ({
    headers: { 'content-type': 'application/xml', 'content-length': String(rawBody?.length ?? 0), ...headers },
    rawBody,
  });
  const failure = (route: 'optional' | 'required', req: ContentHashedRequest) => {
    try {
      run(route, req);
    } catch (error) {
      return error as ContentHashHttpException;
    }
    throw new Error('expected the guard to refuse');
  };

  it('computes the hash when the client sends none, and checks every digest it sends', () => {
    for (const headers of <Record<string, string>[]>[{}, { 'x-content-hash': HEX }, { 'if-match': `"${HEX}"` }, { 'x-content-hash': HEX, 'if-match': `"sha256:${HEX}"` }, { 'content-digest': `sha-256=:${B64}:` }]) {
      const req = request(headers);
      expect(run('optional', req)).toBe(true);
      expect(req.contentHash).toBe(HEX);
    }
  });

  it('answers 400 CONTENT_HASH_MISMATCH naming Content-Digest when its sha-256 differs', () => {
    const other = Buffer.from(OTHER, 'hex').toString('base64');
    const error = failure('optional', request({ 'content-digest': `sha-256=:${other}:` }));
    expect(error.getResponse()).toMatchObject({ code: 'CONTENT_HASH_MISMATCH', contentHash: HEX });
    expect(JSON.stringify(error.getResponse())).toContain('Content-Digest');
    expect(run('required', request({ 'content-digest': `sha-256=:${B64}:` }))).toBe(true);
  });

  it('answers 400 CONTENT_HASH_MISMATCH with the hash it computed', () => {
    for (const headers of <Record<string, string>[]>[{ 'x-content-hash': OTHER }, { 'if-match': `"${OTHER}"` }, { 'x-content-hash': HEX, 'if-match': `"${OTHER}"` }]) {
      const error = failure('optional', request(headers));
      expect(error.getStatus()).toBe(400);
      expect(error.getResponse()).toMatchObject({ code: 'CONTENT_HASH_MISMATCH', contentHash: HEX, bytes: BYTES.length });
    }
  });

  it('answers 400 CONTENT_HASH_INVALID for an unusable digest and 400 CONTENT_HASH_MISSING where one is required', () => {
    expect(failure('optional', request({ 'if-match': `W/"${HEX}"` })).getResponse()).toMatchObject({ code: 'CONTENT_HASH_INVALID' });
    // It names every header the guard reads (helper-200: Content-Digest was left out).
    expect(failure('required', request()).getResponse()).toMatchObject({ code: 'CONTENT_HASH_MISSING', message: expect.stringMatching(/Content-Digest: sha-256=/) });
    expect(run('required', request({ 'x-content-hash': HEX }))).toBe(true);
  });

  it('hashes the Buffer a raw parser made the body, without rawBody; rawBody when the app keeps it', () => {
    const parsed: ContentHashedRequest = { headers: { 'content-type': 'application/xml', 'content-length': String(BYTES.length) }, body: Buffer.from(BYTES) };
    expect(run('required', { ...parsed, headers: { ...parsed.headers, 'x-content-hash': HEX } })).toBe(true);
    expect(run('optional', parsed)).toBe(true);
    expect(parsed.contentHash).toBe(HEX);
    const both = { ...request(), body: { parsed: true } };
    expect(run('optional', both)).toBe(true);
    expect(both.contentHash).toBe(HEX);
  });

  it('answers 415 for a decoded string or a parsed object without rawBody: neither is the bytes received', () => {
    for (const body of [BYTES.toString('utf8'), { receipt: { no: 'R-1' } }]) {
      const error = failure('optional', { headers: { 'content-type': 'application/xml', 'content-length': String(BYTES.length) }, body });
      expect(error.getResponse()).toMatchObject({ code: 'CONTENT_HASH_UNAVAILABLE', statusCode: 415 });
    }
  });

  it.each([['gzip'], ['br'], ['GZIP'], ['identity, gzip'], ['x-custom']])(
    'answers 415 CONTENT_HASH_ENCODING_UNSUPPORTED for a body under Content-Encoding %p, with a digest or without: the bytes seen may be decoded ones',
    (coding) => {
      for (const headers of <Record<string, string>[]>[{}, { 'x-content-hash': HEX }, { 'content-digest': `sha-256=:${B64}:` }]) {
        const error = failure('optional', request({ 'content-encoding': coding, ...headers }));
        expect(error.getStatus()).toBe(415);
        expect(error.getResponse()).toMatchObject({ code: 'CONTENT_HASH_ENCODING_UNSUPPORTED', statusCode: 415 });
        expect(error.message).toContain('Content-Encoding');
      }
    },
  );

  it('takes Content-Encoding: identity (or none) as the bytes sent', () => {
    for (const coding of ['identity', 'Identity', ' identity ', '']) {
      const req = request({ 'content-encoding': coding, 'x-content-hash': HEX });
      expect(run('optional', req)).toBe(true);
      expect(req.contentHash).toBe(HEX);
    }
  });

  it('hashes an absent body as no bytes, and answers 415 when a body came without raw bytes', () => {
    const empty: ContentHashedRequest = { headers: {} };
    expect(run('optional', empty)).toBe(true);
    expect(empty.contentHash).toBe(sha256Hex(Buffer.alloc(0)));
    const error = failure('optional', { headers: { 'content-type': 'application/octet-stream', 'content-length': '12' } });
    expect(error.getResponse()).toMatchObject({ code: 'CONTENT_HASH_UNAVAILABLE', statusCode: 415 });
  });
});
