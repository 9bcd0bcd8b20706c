import * as zlib from 'node:zlib';

/** The most bytes a decoded replay may have: the app's own bytes, but bounded all the same. */
const MAX_DECODED_BYTES = 64 * 1024 * 1024;
const bounded = { maxOutputLength: MAX_DECODED_BYTES };

/** zstd, which @fastify/compress prefers where Node has it (22.15+, 23.8+); absent on Node 20. */
const zstdDecompressSync = (zlib as { zstdDecompressSync?: (bytes: Buffer, options?: object) => Buffer }).zstdDecompressSync;

/** Decoders of the content codings a compression plugin sends (RFC 9110 §8.4.1). */
const DECODERS: Record<string, (bytes: Buffer) => Buffer> = {
  gzip: (bytes) => zlib.gunzipSync(bytes, bounded),
  'x-gzip': (bytes) => zlib.gunzipSync(bytes, bounded),
  br: (bytes) => zlib.brotliDecompressSync(bytes, bounded),
  // "deflate" is zlib-wrapped; some servers send it raw.
  deflate: (bytes) => {
    try {
      return zlib.inflateSync(bytes, bounded);
    } catch {
      return zlib.inflateRawSync(bytes, bounded);
    }
  },
  ...(zstdDecompressSync ? { zstd: (bytes: Buffer) => zstdDecompressSync(bytes, bounded) } : {}),
};

/**
 * Whether a request's `Accept-Encoding` accepts a content coding: named with a weight above 0,
 * or covered by `*` above 0 and not named at 0. A request without the header is taken to want
 * the body as it is (`identity`), as compression plugins take it: they compress nothing for it.
 */
export function acceptsCoding(acceptEncoding: string | undefined, coding: string): boolean {
  if (!acceptEncoding) return false;
  let wildcard = false;
  for (const member of acceptEncoding.split(',')) {
    const [name, ...params] = member.split(';');
    const token = name!.trim().toLowerCase();
    const weight = params.map((p) => p.trim().toLowerCase()).find((p) => p.startsWith('q='));
    const accepted = weight === undefined || Number(weight.slice(2)) > 0;
    if (token === coding) return accepted;
    if (token === '*') wildcard = accepted;
  }
  return wildcard;
}

/**
 * The saved bytes in a coding the request accepts: as they are when it accepts their coding (or
 * they have none), else decoded to the content itself. `undefined` when it accepts neither and
 * the coding is one this process cannot decode (they go as they are: the coding is labelled).
 */
export function decodedForRequest(body: Buffer, coding: string, acceptEncoding: string | undefined): Buffer | undefined {
  const name = coding.trim().toLowerCase();
  if (name === '' || name === 'identity' || acceptsCoding(acceptEncoding, name)) return undefined;
  const decode = DECODERS[name];
  if (!decode) return undefined;
  try {
    return decode(body);
  } catch {
    return undefined;
  }
}
