import type { Logger } from '@nestjs/common';

/** One line per kind in this window at most (by the monotonic clock, the global `performance`: fake timers stand in for it in tests). */
const WINDOW_MS = 10_000;

interface Window {
  startedAt: number;
  /** What the held-back lines were, counted: "requests ran unguarded". */
  more: string;
  /** Lines held back since `startedAt`, and the last of them. */
  held: number;
  last: string;
  timer?: NodeJS.Timeout;
}

/**
 * The warnings of a store outage (a request refused 503, or run unguarded, per handler; a save
 * given up), one line of a kind every 10 s at most: the first at once, then how many more came
 * in the window, with the last one's words. A line per request flooded the log at the rate of the
 * traffic for as long as the outage lasted (an adversarial helper: 2,010 lines for 500 requests),
 * and writing it cost each request more than the guard.
 */
export class OutageLog {
  private readonly windows = new Map<string, Window>();

  constructor(private readonly logger: Logger) {}

  /** Logs `message` of the kind `id`, or counts it as one `more` (e.g. "requests refused") in the window's next line. */
  warn(id: string, message: string, more: string): void {
    const window = this.windows.get(id);
    const now = performance.now();
    if (!window || now - window.startedAt >= WINDOW_MS) {
      if (window) this.flush(id, window);
      this.logger.warn(message);
      this.windows.set(id, { startedAt: now, more, held: 0, last: message });
      return;
    }
    window.held++;
    window.last = message;
    if (window.timer) return;
    window.timer = setTimeout(() => this.flush(id, window), window.startedAt + WINDOW_MS - now);
    window.timer.unref();
  }

  /** Says what every window held back so far (at shutdown, before the app's logger goes). */
  flushAll(): void {
    for (const [id, window] of [...this.windows]) this.flush(id, window);
  }

  /** Says how many lines the window held back; a quiet window is forgotten. */
  private flush(id: string, window: Window): void {
    clearTimeout(window.timer);
    window.timer = undefined;
    if (window.held === 0) {
      if (this.windows.get(id) === window) this.windows.delete(id);
      return;
    }
    // The window's own length: shorter when flushed early (at shutdown).
    const now = performance.now();
    const seconds = Math.round(Math.min(now - window.startedAt, WINDOW_MS) / 100) / 10;
    this.logger.warn(`${window.held} more ${window.more} in ${seconds} s; the last: ${window.last}`);
    window.held = 0;
    window.startedAt = now;
  }
}
