/**
 * What `headerLines` reads a request's header lines from: an Express or Node.js request, a
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
 * The values of header `name` (lower case), one per line the request carried it on; `undefined`
 * when it carried none. In `headers`, Node joins two lines into one value (`a, b`), which reads as
 * one key: its request's `headersDistinct` keeps them apart; HTTP/2's compatibility request has
 * none, and its `rawHeaders` tell. A request that has neither (a test's plain object) gives its
 * `headers` value.
 */
export function headerLines(request: RequestHeaders, name: string): readonly string[] | undefined {
  const node = ('raw' in request ? (request as { raw: unknown }).raw : request) as NodeHeaders;
  if (node.headersDistinct) return node.headersDistinct[name];
  if (node.rawHeaders) {
    const raw = node.rawHeaders;
    let lines: string[] | undefined;
    for (let i = 0; i < raw.length; i += 2) if (raw[i]!.toLowerCase() === name) (lines ??= []).push(raw[i + 1]!);
    return lines;
  }
  const value = request.headers[name];
  return value === undefined ? undefined : typeof value === 'string' ? [value] : value;
}

/** Whether the request carried header `name` (lower case) on more than one line (see `headerLines`). */
export function sentMoreThanOnce(request: RequestHeaders, name: string): boolean {
  return (headerLines(request, name)?.length ?? 0) > 1;
}
