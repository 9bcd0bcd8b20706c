/**
 * A binary min-heap of items by an expiry time (epoch ms) given at push: push and pop are
 * O(log n), the soonest item is read in O(1). The times sit in a typed array beside the items,
 * so ordering compares numbers without visiting the items. The memory store pushes one slot per
 * expiry an entry gets and skips the slots that no longer match (lazy deletion), so nothing here
 * needs to find or remove an item in the middle.
 */
export class ExpiryHeap<T> {
  private items: T[] = [];
  private times = new Float64Array(1024);

  get length(): number {
    return this.items.length;
  }

  /** The item that expires first, or undefined when empty. */
  peek(): T | undefined {
    return this.items[0];
  }

  /** The expiry time of `peek()`'s item (NaN when empty). */
  peekTime(): number {
    return this.items.length > 0 ? this.times[0] : NaN;
  }

  push(item: T, expiresAt: number): void {
    const i = this.items.length;
    if (i === this.times.length) this.grow(2 * i);
    this.items.push(item);
    this.siftUp(item, expiresAt, i);
  }

  pop(): T | undefined {
    const { items, times } = this;
    const top = items[0];
    const last = items.length - 1;
    if (last > 0) this.siftDown(items[last], times[last], 0, last);
    items.pop();
    return top;
  }

  /** Replaces the content with `items`, in O(n) (bottom-up heapify). */
  rebuild(items: Iterable<T>, expiryOf: (item: T) => number): void {
    this.items = [...items];
    const n = this.items.length;
    this.times = new Float64Array(Math.max(1024, n * 2));
    for (let i = 0; i < n; i++) this.times[i] = expiryOf(this.items[i]);
    for (let i = (n >> 1) - 1; i >= 0; i--) this.siftDown(this.items[i], this.times[i], i, n);
  }

  private grow(capacity: number): void {
    const times = new Float64Array(capacity);
    times.set(this.times);
    this.times = times;
  }

  private siftUp(item: T, time: number, from: number): void {
    const { items, times } = this;
    let i = from;
    while (i > 0) {
      const parent = (i - 1) >> 1;
      if (times[parent] <= time) break;
      items[i] = items[parent];
      times[i] = times[parent];
      i = parent;
    }
    items[i] = item;
    times[i] = time;
  }

  /** Places `item` at or below `from` among the first `n` slots. */
  private siftDown(item: T, time: number, from: number, n: number): void {
    const { items, times } = this;
    let i = from;
    for (;;) {
      let child = 2 * i + 1;
      if (child >= n) break;
      if (child + 1 < n && times[child + 1] < times[child]) child++;
      if (times[child] >= time) break;
      items[i] = items[child];
      times[i] = times[child];
      i = child;
    }
    items[i] = item;
    times[i] = time;
  }
}
