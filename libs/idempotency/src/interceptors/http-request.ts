import type { ServerResponse } from 'node:http';

/** The parts of an Express or Fastify request the guard reads. */
export interface HttpRequest {
  method: string;
  url: string;
  ip?: string;
  headers: Record<string, string | string[] | undefined>;
  /** What the body parser made: an object (JSON, form), a string (text), a Buffer (raw); undefined if none ran. */
  body?: unknown;
  /** The bytes as received, set by Nest's `rawBody: true` in the parsers it registers; not required. */
  rawBody?: Buffer;
  /** Multer's upload (`FileInterceptor`): one file. */
  file?: unknown;
  /** Multer's uploads (`FilesInterceptor`, `FileFieldsInterceptor`): an array, or arrays by field. */
  files?: unknown;
  query?: unknown;
  params?: unknown;
  /** Host parameters (`@Controller({ host: ':account.example.com' })`), set by Nest's router on host-bound routes. */
  hosts?: Record<string, string>;
  /** The host name without its port (Express and Fastify), as Nest's router matches hosts. */
  hostname?: string;
  user?: unknown;
}

/** The Express response, or the Fastify reply (whose Node.js response is `raw`). */
export type HttpResponse = ServerResponse | { raw: ServerResponse };
