import { brotliDecompressSync, gunzipSync, inflateRawSync, inflateSync } from 'node:zlib';

/** Decoders of the content codings a compression plugin sends (RFC 9110 §8.4.1). */
const DECODERS: Record<string, (bytes: Buffer) => Buffer> = {
  gzip: gunzipSync,
  'x-gzip': gunzipSync,
  br: brotliDecompressSync,
  // "deflate" is zlib-wrapped; some servers send it raw.
  deflate: (bytes) => {
    try {
      return inflateSync(bytes);
    } catch {
      return inflateRawSync(bytes);
    }
  },
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
