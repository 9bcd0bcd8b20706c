import { describe, expect, it } from '@jest/globals';
import { createHash } from 'node:crypto';
import { IdempotencyError } from '../errors/idempotency.errors.js';
import { attachedMultipart, isMultipartContentType } from './attached-multipart.js';

const sha256 = (bytes: string) => createHash('sha256').update(bytes).digest('hex');

/** Parts as `@fastify/multipart` attaches them (`attachFieldsToBody: true`): each refers back to the whole body. */
function attach(parts: Record<string, object | object[]>): Record<string, unknown> {
  const body: Record<string, unknown> = {};
  for (const [name, value] of Object.entries(parts)) {
    body[name] = Array.isArray(value) ? value.map((part) => ({ ...part, fieldname: name, fields: body })) : { ...value, fieldname: name, fields: body };
  }
  return body;
}
const field = (value: unknown) => ({ type: 'field', value, mimetype: 'text/plain', encoding: '7bit' });
const file = (text: string | null, filename = 'a.txt') => ({
  type: 'file',
  filename,
  mimetype: 'text/plain',
  encoding: '7bit',
  file: { readable: true },
  _buf: text === null ? null : Buffer.from(text),
});

describe('attachedMultipart', () => {
  it('splits attached parts into text fields and files (by field in order, each field\'s files in order), without the parts\' back-references', () => {
    const split = attachedMultipart(attach({ title: field('t'), tags: [field('a'), field('b')], doc: file('one'), pics: [file('two', 'x.png'), file('three', 'y.png')] }));
    expect(split).toEqual({
      fields: { title: 't', tags: ['a', 'b'] },
      files: [
        { field: 'doc', name: 'a.txt', type: 'text/plain', size: 3, sha256: sha256('one') },
        { field: 'pics', name: 'x.png', type: 'text/plain', size: 3, sha256: sha256('two') },
        { field: 'pics', name: 'y.png', type: 'text/plain', size: 5, sha256: sha256('three') },
      ],
    });
  });

  it("takes keyValues' Buffers as files without name or type, and its strings as fields", () => {
    expect(attachedMultipart({ title: 't', doc: Buffer.from('one'), more: [Buffer.from('two'), 'note'] })).toEqual({
      fields: { title: 't', more: ['note'] },
      files: [
        { field: 'doc', name: '', type: '', size: 3, sha256: sha256('one') },
        { field: 'more', name: '', type: '', size: 3, sha256: sha256('two') },
      ],
    });
  });

  it('lists files by field name whatever order the fields came in, and keeps an empty array value', () => {
    const one = attachedMultipart(attach({ b: file('two'), a: file('one') }));
    const other = attachedMultipart(attach({ a: file('one'), b: file('two') }));
    expect(one).toEqual(other);
    expect(one!.files.map((f) => f.field)).toEqual(['a', 'b']);
    expect(attachedMultipart({ tags: [], doc: Buffer.from('x') })!.fields).toEqual({ tags: [] });
  });

  it('takes an object shaped like a part, but not referring back to the body, for a value (bracket names a form parser nested, JSON)', () => {
    const lookalike = { q: { type: 'field', fieldname: 'email', value: 'v' }, f: [{ type: 'file', fieldname: 'cv' }] };
    expect(attachedMultipart(lookalike)).toBeUndefined();
    const body = attach({ doc: file('one') });
    body.q = { type: 'field', fieldname: 'q', value: 'v', fields: {} };
    expect(attachedMultipart(body)!.fields).toEqual({ q: body.q });
  });

  it('knows the parts of a body a hook copied: their fields still hold them under their names', () => {
    const made = attach({ title: field('t'), doc: file('one'), pics: [file('two')] });
    const copied = { ...made, tenant: 'acme' };
    expect(attachedMultipart(copied)).toEqual({ ...attachedMultipart(made), fields: { title: 't', tenant: 'acme' } });
  });

  it('leaves a body with no part and no Buffer as it is (undefined)', () => {
    expect(attachedMultipart({ title: 't', nested: { type: 'other' } })).toBeUndefined();
    expect(attachedMultipart(undefined)).toBeUndefined();
    expect(attachedMultipart('text')).toBeUndefined();
    expect(attachedMultipart(Buffer.from('raw'))).toBeUndefined();
    expect(attachedMultipart([field('a')])).toBeUndefined();
  });

  it('refuses a file part whose bytes the plugin did not buffer (an onFile handler read its stream)', () => {
    expect(() => attachedMultipart(attach({ doc: file(null) }))).toThrow(IdempotencyError);
    expect(() => attachedMultipart(attach({ doc: file(null) }))).toThrow(/onFile/);
  });

  it('knows multipart/form-data, parameters and case aside', () => {
    expect(isMultipartContentType('multipart/form-data; boundary=x')).toBe(true);
    expect(isMultipartContentType('Multipart/Form-Data')).toBe(true);
    expect(isMultipartContentType('multipart/mixed')).toBe(false);
    expect(isMultipartContentType('application/json')).toBe(false);
    expect(isMultipartContentType(undefined)).toBe(false);
  });
});
