import { describe, it, expect } from '@jest/globals';
import { createHash } from 'node:crypto';
import { canonicalJson, fingerprintRequest, isJsonContentType, type FingerprintInput } from './fingerprint.js';

const base: FingerprintInput = {
  method: 'POST',
  path: '/orders',
  query: { ref: 'r1' },
  body: { orderNo: 'A-1', items: [{ sku: 'x', qty: 1 }, { sku: 'y', qty: 2 }], meta: { at: 't', note: null } },
  contentType: 'application/json',
};
const fp = (patch: Partial<FingerprintInput> = {}, ignore?: ReadonlySet<string>) =>
  fingerprintRequest({ ...base, ...patch }, ignore);
const sha256 = (...parts: (string | Buffer)[]) => {
  const h = createHash('sha256');
  for (const p of parts) h.update(p);
  return h.digest('hex');
};

describe('fingerprintRequest', () => {
  it('is a SHA-256 hex digest of the documented layout', () => {
    expect(fp()).toMatch(/^[0-9a-f]{64}$/);
    expect(fp()).toBe(sha256('["fp1","POST","/orders",{"ref":"r1"},"json"]' + canonicalJson(base.body)));
    const xml = Buffer.from('<a>1</a>');
    expect(fp({ body: {}, rawBody: xml, contentType: 'application/xml' })).toBe(
      sha256(`["fp1","POST","/orders",{"ref":"r1"},"raw",${xml.length}]`, xml),
    );
    expect(fp({ body: undefined, query: undefined })).toBe(sha256('["fp1","POST","/orders",null,"none"]'));
  });

  it('ignores key order at every depth', () => {
    const reordered = { meta: { note: null, at: 't' }, items: [{ qty: 1, sku: 'x' }, { qty: 2, sku: 'y' }], orderNo: 'A-1' };
    expect(fp({ body: reordered })).toBe(fp());
    expect(fp({ query: { b: '2', a: '1' } })).toBe(fp({ query: { a: '1', b: '2' } }));
  });

  it('removes ignoreFields at any depth, inside arrays too', () => {
    const ignore = new Set(['timestamp', 'nonce']);
    const withNoise = {
      ...(base.body as object), timestamp: 1,
      items: [{ sku: 'x', qty: 1, nonce: 'a' }, { sku: 'y', qty: 2, timestamp: 9 }],
    };
    expect(fp({ body: withNoise }, ignore)).toBe(fp({}, ignore));
    expect(fp({ body: withNoise }, ignore)).toBe(fp());
    expect(fp({ body: withNoise })).not.toBe(fp());
    expect(fp({ query: { ref: 'r1', nonce: 'z' } }, ignore)).toBe(fp());
  });

  it('changes with any value change', () => {
    const variants: unknown[] = [
      { ...(base.body as object), orderNo: 'A-2' },
      { ...(base.body as object), orderNo: 'A-1 ' },
      { ...(base.body as object), items: [{ sku: 'x', qty: 1 }, { sku: 'y', qty: 3 }] },
      { ...(base.body as object), items: [{ sku: 'x', qty: 1 }, { sku: 'y', qty: '2' }] },
      { ...(base.body as object), meta: { at: 't', note: false } },
      { ...(base.body as object), extra: 0 },
    ];
    const hashes = new Set([fp(), ...variants.map((body) => fp({ body }))]);
    expect(hashes.size).toBe(variants.length + 1);
  });

  it('tells null from absent, and treats undefined as absent', () => {
    expect(fp({ body: { a: 1, b: null } })).not.toBe(fp({ body: { a: 1 } }));
    expect(fp({ body: { a: 1, b: undefined } })).toBe(fp({ body: { a: 1 } }));
    expect(fp({ body: null })).not.toBe(fp({ body: undefined }));
  });

  it('keeps array order', () => {
    expect(fp({ body: { ids: [1, 2] } })).not.toBe(fp({ body: { ids: [2, 1] } }));
  });

  it('includes method (any case), path and query', () => {
    expect(fp({ method: 'post' })).toBe(fp());
    expect(fp({ method: 'PUT' })).not.toBe(fp());
    expect(fp({ path: '/orders/1' })).not.toBe(fp());
    expect(fp({ query: { ref: 'r2' } })).not.toBe(fp());
    expect(fp({ query: {} })).not.toBe(fp({ query: undefined }));
  });

  it('cannot be fooled by moving text between parts', () => {
    const a = fingerprintRequest({ method: 'POST', path: '/a","/b', body: { x: 1 } });
    const b = fingerprintRequest({ method: 'POST","/a', path: '/b', body: { x: 1 } });
    const c = fingerprintRequest({ method: 'POST', path: '/a', query: '/b', body: { x: 1 } });
    expect(new Set([a, b, c]).size).toBe(3);
    const raw = fingerprintRequest({ method: 'POST', path: '/p', body: 'x', rawBody: Buffer.from('"x"'), contentType: 'text/plain' });
    const json = fingerprintRequest({ method: 'POST', path: '/p', body: 'x' });
    const none = fingerprintRequest({ method: 'POST', path: '/p' });
    expect(new Set([raw, json, none]).size).toBe(3);
  });

  it('hashes non-JSON bodies as raw bytes, so whitespace matters', () => {
    const xml = (text: string) => fp({ body: { parsed: true }, rawBody: Buffer.from(text), contentType: 'application/xml' });
    expect(xml('<order><no>1</no></order>')).toBe(xml('<order><no>1</no></order>'));
    expect(xml('<order><no>1</no></order>')).not.toBe(xml('<order> <no>1</no></order>'));
    const text = (s: string) => fp({ body: s, rawBody: Buffer.from(s), contentType: 'text/plain; charset=utf-8' });
    expect(text('a b')).not.toBe(text('a  b'));
  });

  it('hashes a Buffer body as bytes, and raw bytes when nothing was parsed', () => {
    const bytes = Buffer.from([0, 1, 2, 255]);
    expect(fp({ body: bytes, contentType: 'application/octet-stream' })).toBe(fp({ body: Buffer.from(bytes) }));
    expect(fp({ body: bytes })).not.toBe(fp({ body: Buffer.from([0, 1, 2, 254]) }));
    expect(fp({ body: undefined, rawBody: bytes })).toBe(fp({ body: bytes }));
  });

  it('uses the parsed body for JSON even when raw bytes are given', () => {
    const compact = fp({ rawBody: Buffer.from('{"a":1,"b":2}'), body: { a: 1, b: 2 } });
    const spaced = fp({ rawBody: Buffer.from('{ "b": 2, "a": 1 }'), body: { b: 2, a: 1 } });
    expect(compact).toBe(spaced);
    expect(fp({ rawBody: Buffer.from('ignored'), contentType: undefined })).toBe(fp());
  });

  it('hashes bodies larger than its internal buffer consistently', () => {
    const items = Array.from({ length: 30_000 }, (_, i) => ({ id: i, name: `n${i}`, price: i / 3 }));
    const shuffled = items.map(({ price, name, id }) => ({ price, name, id }));
    expect(fp({ body: { items } })).toBe(fp({ body: { items: shuffled } }));
    expect(fp({ body: { items } })).toBe(sha256('["fp1","POST","/orders",{"ref":"r1"},"json"]', canonicalJson({ items })!));
  });
});

describe('isJsonContentType', () => {
  it.each([
    ['application/json', true],
    ['Application/JSON; charset=utf-8', true],
    ['application/vnd.api+json', true],
    ['application/problem+json;q=1', true],
    ['application/xml', false],
    ['text/plain', false],
    ['application/x-www-form-urlencoded', false],
    ['multipart/form-data; boundary=x', false],
    ['application/jsonp', false],
    ['', false],
  ])('%j is JSON: %s', (type, json) => {
    expect(isJsonContentType(type)).toBe(json);
  });
});
