import { createHash } from 'node:crypto';

/** Width of the `key` column (`varchar(1024)`), in characters. */
const KEY_COLUMN_CHARS = 1024;
const DIGEST_MARK = '#sha256:';
/** The mark and 64 hex digits: ASCII, one byte (and one character) each. */
export const DIGEST_BYTES = DIGEST_MARK.length + 64;
/** Most bytes of the readable head of a digest-form key (cut back to a whole character). */
const HEAD_MAX_BYTES = KEY_COLUMN_CHARS - DIGEST_BYTES;

/**
 * Keys of at most this many UTF-8 bytes are stored as they are. A digest form always has more
 * (its head keeps at least `HEAD_MAX_BYTES - 3` bytes, as a character has at most 4), so a key
 * stored as it is never meets the digest form of another.
 */
export const RAW_KEY_MAX_BYTES = HEAD_MAX_BYTES - 3 + DIGEST_BYTES - 1;

/**
 * The `key` column's value for a store key, whatever its length. Keys up to
 * {@link RAW_KEY_MAX_BYTES} UTF-8 bytes (every key a default `keyPrefix` and a usual user id
 * make) are stored as they are. A longer key (a client key of 255 four-byte characters
 * percent-encodes to 3,060 characters; a user id has no bound) is stored as its first ~950 bytes
 * (for reading), `#sha256:` and the SHA-256 of the whole key: deterministic, so claim, complete,
 * release and get find the same row, at most 1,024 bytes, so it fits the column and stays well
 * under PostgreSQL's b-tree row limit (~2,700 bytes), which a wider column would not.
 *
 * Both forms are computed on the key's UTF-8 bytes, as the driver sends it (a lone surrogate is
 * sent as U+FFFD; keys from `buildStorageKey` have none).
 */
export function recordKey(key: string): string {
  // A UTF-16 unit is at most 3 UTF-8 bytes, so short keys need no counting.
  if (key.length * 3 <= RAW_KEY_MAX_BYTES || Buffer.byteLength(key, 'utf8') <= RAW_KEY_MAX_BYTES) return key;
  return digestForm(key, HEAD_MAX_BYTES);
}

/**
 * A key's digest form: a readable head of its first `headMaxBytes` UTF-8 bytes at most (never a
 * cut character; a NUL, which PostgreSQL text cannot hold, shown as `?`, also one byte),
 * `#sha256:` and the SHA-256 of the whole key's UTF-8 bytes. At most `headMaxBytes +
 * DIGEST_BYTES` bytes, and as many characters or fewer. Each column that keeps keys decides
 * which keys take this form.
 */
export function digestForm(key: string, headMaxBytes: number): string {
  const bytes = Buffer.from(key, 'utf8');
  let headEnd = Math.min(headMaxBytes, bytes.length);
  // Never cut a character: back up while the first byte left out continues one (0b10xxxxxx).
  while ((bytes[headEnd] & 0xc0) === 0x80) headEnd--;
  const digest = createHash('sha256').update(bytes).digest('hex');
  return `${bytes.toString('utf8', 0, headEnd).replaceAll('\0', '?')}${DIGEST_MARK}${digest}`;
}
