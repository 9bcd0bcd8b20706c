import { createHash } from 'node:crypto';
import { createReadStream } from 'node:fs';
import { IdempotencyError } from '../errors/idempotency.errors.js';
import type { FingerprintFile } from '../keys/fingerprint.js';
import type { HttpRequest } from './http-request.js';

/** A file as multer describes it: memory storage keeps its `buffer`, disk storage its `path`. */
interface MulterFile {
  fieldname?: unknown;
  originalname?: unknown;
  mimetype?: unknown;
  size?: unknown;
  buffer?: unknown;
  path?: unknown;
  /** A file handed to the handler as a stream (Nest's Fastify `FileStreamInterceptor`). */
  stream?: unknown;
}

/**
 * The files of a multipart upload, as the fingerprint covers them: multer's `req.file`, then
 * `req.files` (an array in its order, or arrays by field, fields sorted), as multer and Nest's
 * upload interceptors for Express and Fastify set them. Each by its SHA-256: of its buffer
 * (memory storage), or of the file on disk (disk storage), read before the handler runs.
 * Undefined when the request has none; a promise only when a file is on disk. Methods named
 * `file` and `files` (which `@fastify/multipart` puts on every request) are no files.
 *
 * @throws IdempotencyError (also as the promise's rejection) for a file whose bytes cannot be
 *   read: a storage engine that keeps neither a buffer nor a path, a file handed to the handler
 *   as a stream, a file gone or changed on disk
 */
export function uploadedFiles(req: HttpRequest): FingerprintFile[] | Promise<FingerprintFile[]> | undefined {
  const one = typeof req.file === 'function' ? undefined : req.file;
  const many = typeof req.files === 'function' ? undefined : req.files;
  if (one === undefined && many === undefined) return undefined;
  const listed = listFiles(one, many);
  if (listed.length === 0) return undefined;
  const files = listed.map(fileOf);
  return files.some((f) => f instanceof Promise) ? Promise.all(files) : (files as FingerprintFile[]);
}

function listFiles(file: unknown, files: unknown): unknown[] {
  const list: unknown[] = file == null ? [] : [file];
  if (Array.isArray(files)) {
    list.push(...(files as unknown[]));
  } else if (files !== null && typeof files === 'object') {
    const byField = files as Record<string, unknown>;
    for (const field of Object.keys(byField).sort()) {
      const group = byField[field];
      list.push(...(Array.isArray(group) ? (group as unknown[]) : [group]));
    }
  }
  return list;
}

function fileOf(entry: unknown): FingerprintFile | Promise<FingerprintFile> {
  const file = (entry ?? {}) as MulterFile;
  const described = {
    field: String(file.fieldname ?? ''),
    name: String(file.originalname ?? ''),
    type: String(file.mimetype ?? ''),
  };
  if (file.buffer instanceof Uint8Array) {
    return { ...described, size: file.buffer.byteLength, sha256: createHash('sha256').update(file.buffer).digest('hex') };
  }
  if (typeof file.path === 'string' && typeof file.size === 'number') {
    return digestOnDisk(file.path, file.size).then((sha256) => ({ ...described, size: file.size as number, sha256 }));
  }
  if (file.stream !== undefined) {
    throw new IdempotencyError(
      'its uploaded file is handed to the handler as a stream (FileStreamInterceptor), so the guard cannot read its bytes ' +
        'before the handler runs; guard the route with FileInterceptor (memory or disk storage) instead.',
    );
  }
  throw new IdempotencyError(
    'the bytes of an uploaded file are not available to the guard: the upload\'s storage keeps neither a buffer ' +
      '(memory storage) nor a path on disk (disk storage).',
  );
}

/** SHA-256 of a file on disk; refused when it cannot be read or is not the size the upload gave. */
async function digestOnDisk(path: string, size: number): Promise<string> {
  const hash = createHash('sha256');
  let read = 0;
  try {
    for await (const chunk of createReadStream(path)) {
      hash.update(chunk as Buffer);
      read += (chunk as Buffer).byteLength;
    }
  } catch (error) {
    throw new IdempotencyError(`its uploaded file cannot be read from disk (${(error as NodeJS.ErrnoException).code ?? 'error'}).`, { cause: error });
  }
  if (read !== size) throw new IdempotencyError(`its uploaded file changed on disk (${read} bytes where the upload had ${size}).`);
  return hash.digest('hex');
}
