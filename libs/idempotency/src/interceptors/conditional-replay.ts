import type { SavedResponse } from '../stores/idempotency-store.js';
import type { HttpRequest } from './http-request.js';

/** An entity tag without its weak prefix: If-None-Match compares tags weakly (RFC 9110, 13.1.2). */
const opaque = (tag: string) => (tag.startsWith('W/') ? tag.slice(2) : tag);

/**
 * Whether a saved `304 Not Modified` answers this duplicate too: the first request was
 * conditional and its client had the representation; the saved answer holds no body, so it fits
 * only a duplicate whose validators (`If-None-Match`, else `If-Modified-Since`) match the saved
 * ETag or Last-Modified (saved only when `last-modified` is among the replay headers), as the
 * app's own check (Express's `req.fresh`) would have found them: tags listed with commas or
 * spaces, and never for a request that asks to bypass caches (`Cache-Control: no-cache`).
 */
export function notModifiedFits(saved: SavedResponse, req: HttpRequest): boolean {
  const header = (name: string) => {
    const value = req.headers[name];
    return Array.isArray(value) ? value.join(',') : value;
  };
  if (/(?:^|,)\s*no-cache\s*(?:,|$)/i.test(header('cache-control') ?? '')) return false;
  const noneMatch = header('if-none-match');
  if (noneMatch !== undefined) {
    const etag = saved.headers.etag;
    if (noneMatch.trim() === '*') return true;
    if (typeof etag !== 'string') return false;
    return noneMatch.split(/[ ,]+/).some((tag) => tag !== '' && opaque(tag) === opaque(etag));
  }
  const modifiedSince = Date.parse(header('if-modified-since') ?? '');
  const lastModified = Date.parse(String(saved.headers['last-modified'] ?? ''));
  return Number.isFinite(modifiedSince) && Number.isFinite(lastModified) && lastModified <= modifiedSince;
}
