import type { SettleWatch } from './idempotency-store.js';

/** In-process registry of watches per key, for stores that are told when a key settles. */
export class SettleWatchers {
  private readonly byKey = new Map<string, Set<() => void>>();

  get size(): number {
    return this.byKey.size;
  }

  watch(key: string): SettleWatch {
    let resolve!: () => void;
    const settled = new Promise<void>((done) => (resolve = done));
    let watchers = this.byKey.get(key);
    if (!watchers) this.byKey.set(key, (watchers = new Set()));
    watchers.add(resolve);
    return {
      settled,
      cancel: () => {
        watchers.delete(resolve);
        if (watchers.size === 0 && this.byKey.get(key) === watchers) this.byKey.delete(key);
      },
    };
  }

  /** Wakes every watch of `key`. */
  notify(key: string): void {
    const watchers = this.byKey.get(key);
    if (!watchers) return;
    this.byKey.delete(key);
    for (const resolve of watchers) resolve();
  }
}
