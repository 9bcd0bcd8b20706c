import { describe, expect, it } from '@jest/globals';
import { createHash } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { IdempotencyError } from '../errors/idempotency.errors.js';
import type { HttpRequest } from './http-request.js';
import { uploadedFiles } from './uploaded-files.js';

const sha256 = (bytes: string) => createHash('sha256').update(bytes).digest('hex');
const request = (extra: Partial<HttpRequest>): HttpRequest => ({ method: 'POST', url: '/', headers: {}, ...extra });
const inMemory = (fieldname: string, text: string) => ({ fieldname, originalname: `${fieldname}.txt`, mimetype: 'text/plain', size: text.length, buffer: Buffer.from(text) });

describe('uploadedFiles', () => {
  it('is undefined, synchronously, for a request without files', () => {
    expect(uploadedFiles(request({}))).toBeUndefined();
    expect(uploadedFiles(request({ files: [] }))).toBeUndefined();
  });

  it('lists req.file, then req.files in order (arrays by field: fields sorted), each by its buffer\'s SHA-256', () => {
    const files = uploadedFiles(request({ file: inMemory('a', 'one'), files: { z: [inMemory('z', 'two')], b: [inMemory('b', 'three'), inMemory('b', 'four')] } }));
    expect(files).toEqual([
      { field: 'a', name: 'a.txt', type: 'text/plain', size: 3, sha256: sha256('one') },
      { field: 'b', name: 'b.txt', type: 'text/plain', size: 5, sha256: sha256('three') },
      { field: 'b', name: 'b.txt', type: 'text/plain', size: 4, sha256: sha256('four') },
      { field: 'z', name: 'z.txt', type: 'text/plain', size: 3, sha256: sha256('two') },
    ]);
  });

  it('hashes a file on disk (multer diskStorage), and refuses one gone or changed', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'uploaded-files-'));
    try {
      const path = join(dir, 'f');
      writeFileSync(path, 'on disk');
      const onDisk = { fieldname: 'f', originalname: 'f.bin', mimetype: 'application/octet-stream', size: 7, path };
      await expect(uploadedFiles(request({ file: onDisk }))).resolves.toEqual([
        { field: 'f', name: 'f.bin', type: 'application/octet-stream', size: 7, sha256: sha256('on disk') },
      ]);
      await expect(uploadedFiles(request({ file: { ...onDisk, size: 8 } }))).rejects.toThrow(/changed on disk/);
      await expect(uploadedFiles(request({ file: { ...onDisk, path: join(dir, 'gone') } }))).rejects.toThrow(IdempotencyError);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('refuses a file whose storage kept neither a buffer nor a path', () => {
    expect(() => uploadedFiles(request({ file: { fieldname: 'f', originalname: 'f', mimetype: 'x/y', size: 1 } }))).toThrow(IdempotencyError);
  });
});
