import type { ServerResponse } from 'node:http';

/** The parts of an Express or Fastify request the guard reads. */
export interface HttpRequest {
  method: string;
  url: string;
  ip?: string;
  headers: Record<string, string | string[] | undefined>;
  body?: unknown;
  rawBody?: Buffer;
  query?: unknown;
  params?: unknown;
  user?: unknown;
}

/** The Express response, or the Fastify reply (whose Node.js response is `raw`). */
export type HttpResponse = ServerResponse | { raw: ServerResponse };
