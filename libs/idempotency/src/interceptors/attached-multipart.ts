import { createHash } from 'node:crypto';
import { IdempotencyError } from '../errors/idempotency.errors.js';
import type { FingerprintFile } from '../keys/fingerprint.js';

/** A part as `@fastify/multipart` attaches it to the body with `attachFieldsToBody: true`. */
interface AttachedPart {
  type: 'file' | 'field';
  fieldname: string;
  /** A field's value. */
  value?: unknown;
  /** A file's name, type and bytes (`null` until the plugin buffers them). */
  filename?: unknown;
  mimetype?: unknown;
  _buf?: unknown;
}

/** A multipart body split as the fingerprint covers an upload: its text fields, and its files. */
export interface AttachedMultipart {
  fields: Record<string, unknown>;
  files: FingerprintFile[];
}

const MULTIPART = /^\s*multipart\/form-data\s*(;|$)/i;

/** True for a `multipart/form-data` Content-Type. */
export function isMultipartContentType(contentType: string | undefined): boolean {
  return contentType !== undefined && MULTIPART.test(contentType);
}

/**
 * A multipart body as `@fastify/multipart` attaches it (`attachFieldsToBody`), split as the
 * fingerprint covers an upload: the text fields as an object (a field sent more than once is an
 * array, in order), and the files, by field in the order the fields came, each field's files in
 * order. With `true`, each value is a part: a field's `value`; a file's name, type and bytes,
 * which the plugin buffered. With `'keyValues'`, a file is its Buffer, without name or type.
 * Undefined when the body holds no part and no Buffer: it is hashed as it is.
 *
 * @throws IdempotencyError for a file part whose bytes the plugin did not buffer (an `onFile`
 *   handler read its stream)
 */
export function attachedMultipart(body: unknown): AttachedMultipart | undefined {
  if (body === null || typeof body !== 'object' || Array.isArray(body) || body instanceof Uint8Array) return undefined;
  const fields: Record<string, unknown> = {};
  const files: FingerprintFile[] = [];
  let attached = false;
  for (const [name, entry] of Object.entries(body)) {
    const values: unknown[] = [];
    for (const item of Array.isArray(entry) ? (entry as unknown[]) : [entry]) {
      if (item instanceof Uint8Array) {
        files.push(fileOf(name, '', '', item));
      } else if (isPart(item)) {
        if (item.type === 'field') values.push(item.value);
        else files.push(fileOf(name, String(item.filename ?? ''), String(item.mimetype ?? ''), bytesOf(item)));
      } else {
        values.push(item);
        continue;
      }
      attached = true;
    }
    if (values.length > 0) fields[name] = Array.isArray(entry) ? values : values[0];
  }
  return attached ? { fields, files } : undefined;
}

function isPart(value: unknown): value is AttachedPart {
  if (value === null || typeof value !== 'object') return false;
  const part = value as Partial<AttachedPart>;
  return (part.type === 'file' || part.type === 'field') && typeof part.fieldname === 'string';
}

function bytesOf(part: AttachedPart): Uint8Array {
  if (part._buf instanceof Uint8Array) return part._buf;
  throw new IdempotencyError(
    "the bytes of an uploaded file are not available to the guard: @fastify/multipart did not buffer them (an onFile " +
      'handler read its stream); let the plugin buffer the files, or guard the route with FileInterceptor.',
  );
}

function fileOf(field: string, name: string, type: string, bytes: Uint8Array): FingerprintFile {
  return { field, name, type, size: bytes.byteLength, sha256: createHash('sha256').update(bytes).digest('hex') };
}
