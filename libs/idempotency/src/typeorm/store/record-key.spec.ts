import { describe, expect, it } from '@jest/globals';
import { createHash } from 'node:crypto';
import { buildStorageKey } from '../../index.js';
import { RAW_KEY_MAX_BYTES, recordKey } from './record-key.js';

const bytes = (text: string) => Buffer.byteLength(text, 'utf8');

describe('recordKey (the PostgreSQL key column)', () => {
  it('keeps keys up to the bound as they are, counted in UTF-8 bytes', () => {
    const usual = buildStorageKey({ prefix: 'no_repeat', user: { id: 'user-1' }, handler: 'OrdersController.create', key: 'ORD-1' });
    expect(recordKey(usual)).toBe(usual);
    expect(RAW_KEY_MAX_BYTES).toBe(1020);
    const ascii = 'k'.repeat(RAW_KEY_MAX_BYTES);
    expect(recordKey(ascii)).toBe(ascii);
    const wide = 'é'.repeat(RAW_KEY_MAX_BYTES / 2); // 2 bytes each: at the bound
    expect(recordKey(wide)).toBe(wide);
    expect(recordKey(`${wide}x`)).not.toBe(`${wide}x`);
  });

  it('stores a longer key as a readable head and the SHA-256 of the whole key, within 1,024 bytes', () => {
    const key = buildStorageKey({
      prefix: 'no_repeat',
      user: { id: '\u{1F47E}'.repeat(1000) },
      handler: 'OrdersController.create',
      key: '\u{1F600}'.repeat(255),
    });
    const stored = recordKey(key);
    const digest = createHash('sha256').update(key, 'utf8').digest('hex');
    expect(stored.endsWith(`#sha256:${digest}`)).toBe(true);
    expect(key.startsWith(stored.slice(0, stored.indexOf('#sha256:')))).toBe(true);
    expect(stored.startsWith('no_repeat:%F0%9F%91%BE')).toBe(true);
    expect(bytes(stored)).toBeGreaterThan(RAW_KEY_MAX_BYTES);
    expect(bytes(stored)).toBeLessThanOrEqual(1024);
    expect(recordKey(key)).toBe(stored);
  });

  it('never cuts a character in the head, and never gives a digest form at or under the bound', () => {
    for (const unit of ['a', 'é', '€', '\u{1F600}']) {
      for (let pad = 0; pad < 4; pad++) {
        const key = 'x'.repeat(pad) + unit.repeat(2000);
        const stored = recordKey(key);
        const head = stored.slice(0, stored.indexOf('#sha256:'));
        expect(head).not.toContain('\uFFFD');
        expect(key.startsWith(head)).toBe(true);
        expect(bytes(stored)).toBeGreaterThan(RAW_KEY_MAX_BYTES);
        expect(bytes(stored)).toBeLessThanOrEqual(1024);
        expect(stored.length).toBeLessThanOrEqual(1024);
      }
    }
  });

  it('keeps long keys that differ only in their last character apart', () => {
    const base = 'k'.repeat(5000);
    expect(recordKey(`${base}a`)).not.toBe(recordKey(`${base}b`));
    expect(recordKey(`${base}a`).slice(0, 900)).toBe(recordKey(`${base}b`).slice(0, 900));
  });
});
