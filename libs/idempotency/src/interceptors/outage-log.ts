import type { Logger } from '@nestjs/common';

/** One line per handler and outage policy in this window at most. */
const WINDOW_MS = 10_000;

interface Window {
  startedAt: number;
  /** Lines held back since `startedAt`, and the last of them. */
  held: number;
  last: string;
  timer?: NodeJS.Timeout;
}

/**
 * The warnings of a store outage (a request refused 503, or run unguarded), one line per
 * handler and policy every 10 s at most: the first at once, then how many more came in the
 * window, with the last one's words. A line per request flooded the log at the rate of the
 * traffic for as long as the outage lasted (an adversarial helper: 2,010 lines for 500 requests),
 * and writing it cost each request more than the guard.
 */
export class OutageLog {
  private readonly windows = new Map<string, Window>();

  constructor(private readonly logger: Logger) {}

  warn(handler: string, policy: 'refused' | 'unguarded', message: string): void {
    const id = `${handler}\0${policy}`;
    const window = this.windows.get(id);
    const now = Date.now();
    if (!window || now - window.startedAt >= WINDOW_MS) {
      if (window) this.flush(id, window);
      this.logger.warn(message);
      this.windows.set(id, { startedAt: now, held: 0, last: message });
      return;
    }
    window.held++;
    window.last = message;
    if (window.timer) return;
    window.timer = setTimeout(() => this.flush(id, window), window.startedAt + WINDOW_MS - now);
    window.timer.unref();
  }

  /** Says how many lines the window held back; a quiet window is forgotten. */
  private flush(id: string, window: Window): void {
    clearTimeout(window.timer);
    window.timer = undefined;
    if (window.held === 0) {
      if (this.windows.get(id) === window) this.windows.delete(id);
      return;
    }
    const policy = id.slice(id.indexOf('\0') + 1);
    this.logger.warn(`${window.held} more requests ${policy === 'refused' ? 'refused' : 'ran unguarded'} in ${WINDOW_MS / 1000} s; the last: ${window.last}`);
    window.held = 0;
    window.startedAt = Date.now();
  }
}
