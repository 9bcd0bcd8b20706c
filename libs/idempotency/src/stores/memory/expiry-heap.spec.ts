import { describe, expect, it } from '@jest/globals';
import { ExpiryHeap } from './expiry-heap.js';

/** A small deterministic generator, so a failure replays. */
function numbers(seed: number): () => number {
  let state = seed;
  return () => (state = (state * 1_103_515_245 + 12_345) % 2 ** 31) % 10_000;
}

describe('ExpiryHeap', () => {
  it('pops items soonest first, through interleaved pushes and pops and past its first capacity', () => {
    const heap = new ExpiryHeap<{ at: number }>();
    const next = numbers(7);
    const popped: number[] = [];
    const expected: number[] = [];
    for (let round = 0; round < 5_000; round++) {
      const at = next();
      heap.push({ at }, at);
      expected.push(at);
      if (round % 3 === 0) {
        expected.sort((a, b) => a - b);
        expect(heap.peekTime()).toBe(expected[0]);
        popped.push(heap.pop()!.at);
        expected.shift();
      }
    }
    expect(popped.length).toBeGreaterThan(1024);
    while (heap.length > 0) popped.push(heap.pop()!.at);
    expect(heap.peek()).toBeUndefined();
    expect(heap.peekTime()).toBeNaN();
    expect(popped.slice(-expected.length)).toEqual([...expected].sort((a, b) => a - b));
  });

  it('rebuilds from a list in expiry order', () => {
    const heap = new ExpiryHeap<{ at: number }>();
    const next = numbers(11);
    const items = Array.from({ length: 3_000 }, () => ({ at: next() }));
    heap.push({ at: -1 }, -1);
    heap.rebuild(items, (item) => item.at);
    expect(heap.length).toBe(3_000);
    const out: number[] = [];
    while (heap.length > 0) out.push(heap.pop()!.at);
    expect(out).toEqual(items.map((item) => item.at).sort((a, b) => a - b));
  });
});
