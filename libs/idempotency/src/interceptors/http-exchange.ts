import { StreamableFile } from '@nestjs/common';
import { isObservable } from 'rxjs';
import { Readable } from 'node:stream';

/** The parts of an Express or Fastify request the guard reads. */
export interface HttpRequest {
  method: string;
  url: string;
  originalUrl?: string;
  ip?: string;
  headers: Record<string, string | string[] | undefined>;
  body?: unknown;
  rawBody?: Buffer;
  query?: unknown;
  params?: unknown;
  user?: unknown;
}

/** The parts of an Express response or Fastify reply the guard reads. */
export interface HttpResponse {
  statusCode: number;
  getHeader(name: string): number | string | string[] | undefined;
}

/** Whether a handler's value can be saved as JSON text and replayed as the same answer. */
export function isReplayable(value: unknown): boolean {
  if (value === null || typeof value !== 'object') return typeof value !== 'function' && typeof value !== 'symbol';
  return !(
    value instanceof StreamableFile ||
    value instanceof Readable ||
    value instanceof Response ||
    value instanceof ReadableStream ||
    Buffer.isBuffer(value) ||
    ArrayBuffer.isView(value) ||
    isObservable(value) ||
    Symbol.asyncIterator in value
  );
}

/** The allowlisted headers already set on the response, lower-case names. */
export function readHeaders(res: HttpResponse, names: readonly string[]): Record<string, string> {
  const headers: Record<string, string> = {};
  for (const name of names) {
    const value = res.getHeader(name);
    if (value !== undefined) headers[name] = Array.isArray(value) ? value.join(', ') : String(value);
  }
  return headers;
}
