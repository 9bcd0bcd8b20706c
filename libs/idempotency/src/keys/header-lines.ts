/**
 * What `sentMoreThanOnce` counts a request's header lines in: an Express or Node.js request, a
 * Fastify request (its Node.js request is `raw`), or HTTP/2's compatibility request.
 */
export interface RequestHeaders {
  headers: Record<string, string | string[] | undefined>;
  /** Node's: each header's lines apart. */
  headersDistinct?: Record<string, string[] | undefined>;
  /** Names and values in the order received (HTTP/2's compatibility request has no `headersDistinct`). */
  rawHeaders?: string[];
}

type NodeHeaders = Omit<RequestHeaders, 'headers'>;

/**
 * Whether the request carried header `name` (lower case) on more than one line. In `headers`,
 * Node joins two lines into one value (`a, b`), which reads as one key: its request's
 * `headersDistinct` keeps them apart; HTTP/2's compatibility request has none, and its
 * `rawHeaders` tell. A request that has neither (a test's plain object) has one line a header.
 */
export function sentMoreThanOnce(request: RequestHeaders, name: string): boolean {
  // Fastify's Node.js request, not a `raw` of an app's own on an Express request (helper-216: a
  // Buffer there let two lines through, undefined threw).
  const fastify = (request as { raw?: NodeHeaders }).raw;
  const node: NodeHeaders = typeof fastify === 'object' && fastify !== null && (fastify.headersDistinct || fastify.rawHeaders) ? fastify : request;
  if (node.headersDistinct) return (node.headersDistinct[name]?.length ?? 0) > 1;
  let lines = 0;
  const raw = node.rawHeaders ?? [];
  for (let i = 0; i < raw.length; i += 2) if (raw[i]!.toLowerCase() === name && ++lines > 1) return true;
  return Array.isArray(request.headers[name]) && request.headers[name].length > 1;
}
