import { describe, it, expect } from '@jest/globals';
import { createHash } from 'node:crypto';
import { IdempotencyError } from '../errors/idempotency.errors.js';
import { canonicalJson, fingerprintRequest, isJsonContentType, UnmatchableBodyError, type FingerprintInput } from './fingerprint.js';

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

/**
 * An app without `rawBody` hands the guard only what its body parser made: a string (a text
 * parser), a Buffer (a raw parser), an object (JSON, urlencoded). The same bytes must give the
 * fingerprint they gave with `rawBody` on, so that records written before an upgrade still match.
 */
describe('fingerprintRequest without rawBody', () => {
  const xml = '<receipt><no>R-1</no> <note>café ☕ 😀</note></receipt>\n';
  const withRaw = (contentType: string, body: unknown, bytes: Buffer) => fp({ contentType, body, rawBody: bytes });
  const without = (contentType: string, body: unknown) => fp({ contentType, body });

  it.each([
    ['application/xml', xml],
    ['text/xml; charset=utf-8', xml],
    ['text/plain', 'plain text\r\nwith  spaces'],
    ['text/csv; charset=UTF-8', 'a,b\n1,2\n'],
    ['text/plain', ''],
  ])('hashes a %s text body (a string) as its UTF-8 bytes: what its raw bytes gave', (contentType, text) => {
    const bytes = Buffer.from(text, 'utf8');
    expect(without(contentType, text)).toBe(withRaw(contentType, text, bytes));
    expect(without(contentType, text)).toBe(sha256(`["fp1","POST","/orders",{"ref":"r1"},"raw",${bytes.length}]`, bytes));
    expect(without(contentType, `${text} `)).not.toBe(without(contentType, text));
  });

  it('hashes a Buffer body (a raw parser) as its bytes, with rawBody or without', () => {
    const bytes = Buffer.from([0x3c, 0x61, 0x3e, 0xff, 0x00, 0xfe]);
    expect(without('application/octet-stream', bytes)).toBe(withRaw('application/octet-stream', bytes, Buffer.from(bytes)));
    expect(without('application/xml', Buffer.from(xml))).toBe(without('application/xml', xml));
  });

  it('hashes JSON by its parsed value, with rawBody or without', () => {
    const body = { b: [1, { y: 2, x: 'é' }], a: null };
    expect(without('application/json', body)).toBe(withRaw('application/json', body, Buffer.from('{ "b": [1, {"y":2,"x":"é"}], "a": null }')));
  });

  it('hashes a form by its bytes when rawBody has them, else by its parsed fields (documented: not the same value)', () => {
    const bytes = Buffer.from('b=2&a=1');
    const fields = { b: '2', a: '1' };
    expect(withRaw('application/x-www-form-urlencoded', fields, bytes)).toBe(
      sha256(`["fp1","POST","/orders",{"ref":"r1"},"raw",${bytes.length}]`, bytes),
    );
    expect(without('application/x-www-form-urlencoded', fields)).toBe(without('application/x-www-form-urlencoded', { a: '1', b: '2' }));
    expect(without('application/x-www-form-urlencoded', fields)).not.toBe(withRaw('application/x-www-form-urlencoded', fields, bytes));
  });

  it('hashes the text a parser decoded from another charset as UTF-8 (documented: not its raw bytes)', () => {
    const latin1 = 'text/plain; charset=iso-8859-1';
    expect(without(latin1, 'café')).toBe(withRaw(latin1, 'café', Buffer.from('café', 'utf8')));
    expect(without(latin1, 'café')).not.toBe(withRaw(latin1, 'café', Buffer.from('café', 'latin1')));
  });

  it('hashes JSON parsed under another type (csp-report) as JSON, with rawBody or without; a form keeps its bytes', () => {
    const body = { 'csp-report': { 'blocked-uri': 'x' } };
    const json = without('application/csp-report', body);
    expect(json).toBe(sha256('["fp1","POST","/orders",{"ref":"r1"},"json"]' + canonicalJson(body)));
    for (const bytes of ['{"csp-report":{"blocked-uri":"x"}}', '\r\n [ ', '\ufeff{}']) {
      expect(withRaw('application/csp-report', body, Buffer.from(bytes))).toBe(json);
    }
    const form = Buffer.from('a[b]=1');
    expect(withRaw('application/vnd.form', { a: { b: '1' } }, form)).toBe(sha256(`["fp1","POST","/orders",{"ref":"r1"},"raw",${form.length}]`, form));
  });

  it('refuses text its parser could not decode (U+FFFD) without rawBody: different bytes would be one body', () => {
    expect(() => without('text/plain', 'caf\uFFFD')).toThrow(UnmatchableBodyError);
    expect(() => without('text/plain', 'caf\uFFFD')).toThrow(/app\.useBodyParser\('raw', \{ type: \['text\/plain'\] \}\)/);
    expect(withRaw('text/plain', 'caf\uFFFD', Buffer.from('caf\xe9', 'latin1'))).not.toBe(withRaw('text/plain', 'caf\uFFFD', Buffer.from('caf\xe8', 'latin1')));
    expect(without('application/json', { a: 'caf\uFFFD' })).toMatch(/^[0-9a-f]{64}$/);
  });

  it('tells apart text holding different lone surrogates (decoded from UTF-16) without rawBody, and keeps UTF-8 text as it was', () => {
    const utf16 = 'text/plain; charset=utf-16le';
    expect(without(utf16, 'to:\ud800 amount:100')).not.toBe(without(utf16, 'to:\udc00 amount:100'));
    expect(without(utf16, 'to:\ud800 amount:100')).not.toBe(without(utf16, 'to:\ud800\ud800 amount:100'));
    expect(without(utf16, 'to:\ud800 amount:100')).toBe(without(utf16, 'to:\ud800 amount:100'));
    const units = Buffer.from('a\udfff', 'utf16le');
    expect(without(utf16, 'a\udfff')).toBe(sha256(`["fp1","POST","/orders",{"ref":"r1"},"utf16",${units.length}]`, units));
    // A pair is well formed: its UTF-8 bytes, as rawBody holds them.
    expect(without(utf16, 'a\ud83d\ude00')).toBe(withRaw(utf16, 'a\ud83d\ude00', Buffer.from('a\ud83d\ude00', 'utf8')));
  });

  it('keeps a string under a JSON content type a JSON value', () => {
    expect(without('application/json', 'x')).toBe(sha256('["fp1","POST","/orders",{"ref":"r1"},"json"]"x"'));
  });

  it('refuses a body that arrived but that no parser read, rather than hash it as no body', () => {
    for (const contentType of ['application/xml', 'text/csv; charset=utf-8', 'application/json', undefined]) {
      const unread = () => fp({ contentType, body: undefined, hasBody: true });
      expect(unread).toThrow(IdempotencyError);
    }
    expect(() => fp({ contentType: 'text/csv', body: undefined, hasBody: true })).toThrow(/useBodyParser\('raw', \{ type: \['text\/csv'\] \}\)/);
    expect(() => fp({ contentType: '<script>', body: undefined, hasBody: true })).toThrow(/^(?!.*<script>)/);
    expect(fp({ body: undefined, hasBody: false })).toBe(fp({ body: undefined }));
    expect(fp({ body: undefined, rawBody: Buffer.from('x'), hasBody: true, contentType: 'text/csv' })).toBe(fp({ body: 'x', contentType: 'text/csv' }));
  });
});

describe('fingerprintRequest with uploaded files', () => {
  const file = { field: 'file', name: 'a.txt', type: 'text/plain', size: 3, sha256: sha256('abc') };
  const fields = { caption: 'me' };

  it('hashes each file by field, name, type, size and SHA-256 before the body kind (the documented layout)', () => {
    expect(fp({ contentType: 'multipart/form-data; boundary=x', body: fields, files: [file] })).toBe(
      sha256(`["fp1","POST","/orders",{"ref":"r1"},"files",[["file","a.txt","text/plain",3,"${file.sha256}"]],"json"]{"caption":"me"}`),
    );
    expect(fp({ contentType: 'multipart/form-data', body: fields, files: [] })).toBe(fp({ contentType: 'multipart/form-data', body: fields }));
  });

  it('tells files apart by any part, and by their order', () => {
    const other = { ...file, field: 'b', sha256: sha256('abd') };
    const hashes = new Set(
      [[file], [other], [file, other], [other, file], [{ ...file, name: 'b.txt' }], [{ ...file, type: 'text/csv' }], [{ ...file, size: 4 }], []].map(
        (files) => fp({ contentType: 'multipart/form-data', body: fields, files }),
      ),
    );
    expect(hashes.size).toBe(8);
  });

  it('never lets ignoreFields drop a file', () => {
    const ignore = new Set(['file', 'a.txt', 'field', 'name']);
    expect(fp({ body: fields, files: [file] }, ignore)).not.toBe(fp({ body: fields }, ignore));
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

describe('fingerprintRequest: what ignoreFields can and cannot remove', () => {
  const route = (params: Record<string, string>, query: Record<string, string>, hosts?: Record<string, string>): Partial<FingerprintInput> => ({
    params,
    query,
    hosts,
  });

  it('keeps the path and host parameters whatever ignoreFields names: they are the route', () => {
    const ignore = new Set(['id', 'account', 'params', 'hosts']);
    expect(fp(route({ id: '1' }, {}), ignore)).not.toBe(fp(route({ id: '2' }, {}), ignore));
    expect(fp(route({}, {}, { account: 'a' }), ignore)).not.toBe(fp(route({}, {}, { account: 'b' }), ignore));
  });

  it('keeps the query whatever ignoreFields names, and removes its fields', () => {
    expect(fp(route({}, { page: '1' }), new Set(['query']))).not.toBe(fp(route({}, { page: '2' }), new Set(['query'])));
    expect(fp(route({}, { page: '1', trace: 'a' }), new Set(['trace']))).toBe(fp(route({}, { page: '1', trace: 'b' }), new Set(['trace'])));
  });

  it('hashes the route as it did: {"hosts","params","query"} with sorted keys, absent ones left out', () => {
    const layout = '["fp1","POST","/orders",{"hosts":{"account":"a"},"params":{"id":"1"},"query":{"ref":"r1"}},"json"]';
    expect(fp(route({ id: '1' }, { ref: 'r1' }, { account: 'a' }))).toBe(sha256(layout + canonicalJson(base.body)));
    expect(fp(route({ id: '1' }, { ref: 'r1' }))).toBe(sha256('["fp1","POST","/orders",{"params":{"id":"1"},"query":{"ref":"r1"}},"json"]' + canonicalJson(base.body)));
  });
});

describe('fingerprintRequest: numbers JSON.parse cannot hold', () => {
  it('tells an infinite number (1e400) from null and from its negative; one infinity is another', () => {
    const amount = (value: unknown) => fp({ body: { amount: value } });
    expect(amount(JSON.parse('1e400'))).not.toBe(amount(null));
    expect(amount(JSON.parse('1e400'))).not.toBe(amount(JSON.parse('-1e400')));
    expect(amount(JSON.parse('1e400'))).toBe(amount(JSON.parse('2e400')));
    expect(fp({ body: [JSON.parse('1e400')] })).not.toBe(fp({ body: [null] }));
  });
});
