import type { SavedResponse } from '../idempotency-store.js';

/** One completed record held in memory. */
export interface CachedRecord {
  /** The fingerprint the record was claimed with ('' when not compared). */
  fingerprint: string;
  response: SavedResponse;
  /** When the entry stops answering, by `performance.now()`: never later than the store's expiry. */
  expiresAt: number;
}

/**
 * What V8 holds for one entry besides its strings and headers, on 64-bit Node (8-byte pointers):
 * the Map's slot (28 bytes at full load; the table runs between a half and a quarter full as it
 * grows and shrinks: up to 112), the entry (80, with its two links), its expiry's heap number
 * (16), the response and headers objects (up to 56 each). About 240 bytes measured (`--expose-gc`,
 * 20,000 entries); this counts the worst case.
 */
export const ENTRY_OVERHEAD_BYTES = 300;

/** One header besides its name and value strings: its slot in the headers object. */
export const HEADER_OVERHEAD_BYTES = 24;

/** A string besides its characters: V8's header (map, hash, length), rounded up to 8 bytes. */
const STRING_OVERHEAD_BYTES = 16;

/** A character V8 cannot keep in one byte (one-byte strings hold Latin-1). */
const TWO_BYTE = /[^\u0000-\u00ff]/;

interface Entry extends CachedRecord {
  key: string;
  bytes: number;
  /** The next less and more recently used entries. */
  older: Entry | undefined;
  newer: Entry | undefined;
}

/**
 * Completed records by storage key, least recently used first out, bounded by a number of
 * entries and by the memory they hold ({@link entryBytes}). Each entry keeps strings of its own
 * (flat copies), so that what it counts is what it holds: never a slice of a larger string (a
 * record read from Redis) nor a rope of the caller's. A record larger than `maxBytes` alone is
 * not kept. An expired entry is dropped when it is next read.
 *
 * The order of use is a list through the entries themselves, so that a hit moves two links and
 * leaves the Map alone. Moving an entry by deleting and setting its key again (a Map keeps its
 * insertion order) cost V8 ~26 µs a hit in a Map of 10,000 entries, against ~0.14 µs in an empty
 * one (bench/README.md): a full cache answered slower than Redis.
 */
export class CompletedRecords {
  private readonly entries = new Map<string, Entry>();
  private oldest: Entry | undefined;
  private newest: Entry | undefined;
  private totalBytes = 0;

  constructor(
    private readonly maxEntries: number,
    private readonly maxBytes: number,
  ) {}

  get size(): number {
    return this.entries.size;
  }

  get bytes(): number {
    return this.totalBytes;
  }

  /** The live entry of `key` at `now` (it becomes the most recently used), else undefined. */
  get(key: string, now: number): CachedRecord | undefined {
    const entry = this.entries.get(key);
    if (entry === undefined) return undefined;
    if (entry.expiresAt <= now) {
      this.remove(entry);
      return undefined;
    }
    if (entry !== this.newest) {
      this.unlink(entry);
      this.append(entry);
    }
    return entry;
  }

  /** Whether `key` holding `record` could be kept at all: no larger than `maxBytes` alone. */
  fits(key: string, record: Omit<CachedRecord, 'expiresAt'>): boolean {
    return entryBytes(key, record) <= this.maxBytes;
  }

  set(key: string, record: CachedRecord): void {
    this.delete(key);
    const bytes = entryBytes(key, record);
    if (bytes > this.maxBytes) return;
    // One JSON round trip copies every string flat, one byte a character when Latin-1 allows.
    const [ownKey, fingerprint, response] = JSON.parse(JSON.stringify([key, record.fingerprint, record.response])) as [string, string, SavedResponse];
    const entry: Entry = { fingerprint, response, expiresAt: record.expiresAt, key: ownKey, bytes, older: undefined, newer: undefined };
    this.entries.set(ownKey, entry);
    this.append(entry);
    this.totalBytes += bytes;
    while (this.entries.size > this.maxEntries || this.totalBytes > this.maxBytes) this.remove(this.oldest!);
  }

  delete(key: string): void {
    const entry = this.entries.get(key);
    if (entry !== undefined) this.remove(entry);
  }

  clear(): void {
    this.entries.clear();
    this.oldest = this.newest = undefined;
    this.totalBytes = 0;
  }

  private remove(entry: Entry): void {
    this.entries.delete(entry.key);
    this.unlink(entry);
    this.totalBytes -= entry.bytes;
  }

  private unlink(entry: Entry): void {
    if (entry.older) entry.older.newer = entry.newer;
    else this.oldest = entry.newer;
    if (entry.newer) entry.newer.older = entry.older;
    else this.newest = entry.older;
    entry.older = entry.newer = undefined;
  }

  /** Makes `entry` the most recently used. */
  private append(entry: Entry): void {
    entry.older = this.newest;
    if (this.newest) this.newest.newer = entry;
    else this.oldest = entry;
    this.newest = entry;
  }
}

/**
 * What `key` holding `record` counts against `maxBytes`: {@link ENTRY_OVERHEAD_BYTES}, plus
 * {@link HEADER_OVERHEAD_BYTES} a header, plus each string (key, fingerprint, body, each header's
 * name and value) as V8 keeps it: 16 bytes, then a byte a character for Latin-1 text, two for
 * any other (UTF-16), rounded up to 8.
 */
export function entryBytes(key: string, { fingerprint, response }: Omit<CachedRecord, 'expiresAt'>): number {
  let bytes = ENTRY_OVERHEAD_BYTES + stringBytes(key) + stringBytes(fingerprint);
  if (response.body !== undefined) bytes += stringBytes(response.body);
  for (const name in response.headers) bytes += HEADER_OVERHEAD_BYTES + stringBytes(name) + stringBytes(response.headers[name]);
  return bytes;
}

function stringBytes(text: string): number {
  const characters = TWO_BYTE.test(text) ? 2 * text.length : text.length;
  return Math.ceil((STRING_OVERHEAD_BYTES + characters) / 8) * 8;
}
