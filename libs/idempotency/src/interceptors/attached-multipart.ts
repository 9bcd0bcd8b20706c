import { createHash } from 'node:crypto';
import { IdempotencyError } from '../errors/idempotency.errors.js';
import type { FingerprintFile } from '../keys/fingerprint.js';

/**
 * A part as `@fastify/multipart` attaches it to the body with `attachFieldsToBody: true`: it
 * refers back to the body the plugin made (`fields`), which holds it under its field name. No
 * parsed value can refer to itself so (bracket names that a form parser nests, JSON in a part).
 */
interface AttachedPart {
  type: 'file' | 'field';
  fieldname: string;
  fields: unknown;
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
 * A multipart body as `@fastify/multipart` attaches it on Fastify (`attachFieldsToBody`), split
 * as the fingerprint covers an upload: the text fields as an object (a field sent more than once
 * is an array, in order), and the files, by field name, each field's files in order. With
 * `true`, each value is a part (known by its reference back to the body): a field's `value`; a
 * file's name, type and bytes, which the plugin buffered. With `'keyValues'`, a file is its
 * Buffer, without name or type. Undefined when the body holds no part and no Buffer: it is
 * hashed as it is. Only for Fastify's bodies: multer's and Nest's upload interceptors put text
 * fields in the body, and their files on the request.
 *
 * @throws IdempotencyError for a file part whose bytes the plugin did not buffer (an `onFile`
 *   handler read its stream)
 */
export function attachedMultipart(body: unknown): AttachedMultipart | undefined {
  if (body === null || typeof body !== 'object' || Array.isArray(body) || body instanceof Uint8Array) return undefined;
  const fields: Record<string, unknown> = {};
  const files: FingerprintFile[] = [];
  let attached = false;
  for (const name of Object.keys(body).sort()) {
    const entry = (body as Record<string, unknown>)[name];
    const values: unknown[] = [];
    for (const item of Array.isArray(entry) ? (entry as unknown[]) : [entry]) {
      if (item instanceof Uint8Array) {
        files.push(fileOf(name, '', '', item));
      } else if (isPartOf(body, item)) {
        if (item.type === 'field') values.push(item.value);
        else files.push(fileOf(name, String(item.filename ?? ''), String(item.mimetype ?? ''), bytesOf(item)));
      } else {
        values.push(item);
        continue;
      }
      attached = true;
    }
    // A field of files only is in `files`; an empty array (a JSON part's []) is a value.
    if (values.length > 0 || (Array.isArray(entry) && entry.length === 0)) fields[name] = Array.isArray(entry) ? values : values[0];
  }
  return attached ? { fields, files } : undefined;
}

/**
 * The plugin's part: its `fields` is the body, or the body the plugin made when a hook replaced
 * it with a copy (`{ ...req.body, tenant }`), which holds the part itself under its field name.
 */
function isPartOf(body: object, value: unknown): value is AttachedPart {
  if (value === null || typeof value !== 'object') return false;
  const part = value as Partial<AttachedPart>;
  if ((part.type !== 'file' && part.type !== 'field') || typeof part.fieldname !== 'string') return false;
  if (part.fields === body) return true;
  if (part.fields === null || typeof part.fields !== 'object') return false;
  const held = (part.fields as Record<string, unknown>)[part.fieldname];
  return held === part || (Array.isArray(held) && held.includes(part));
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
