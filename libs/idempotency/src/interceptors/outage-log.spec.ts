import { afterEach, beforeEach, describe, expect, it, jest } from '@jest/globals';
import { Logger } from '@nestjs/common';
import { OutageLog } from './outage-log.js';

/** A Nest logger that keeps its warnings (the lines an app's log would get). */
class KeptLines extends Logger {
  readonly lines: string[] = [];
  override warn(message: string): void {
    this.lines.push(message);
  }
}

describe('OutageLog', () => {
  beforeEach(() => {
    jest.useFakeTimers({ now: 1_000_000 });
  });
  afterEach(() => {
    jest.useRealTimers();
  });

  it('logs the first warning of an outage at once, then one line per 10 s with how many more came', () => {
    const logger = new KeptLines();
    const log = new OutageLog(logger);
    for (let i = 0; i < 500; i++) log.warn('Orders.create:unguarded', `store unavailable #${i}; running unguarded`, 'requests ran unguarded');
    expect(logger.lines).toEqual(['store unavailable #0; running unguarded']);
    jest.advanceTimersByTime(10_000);
    expect(logger.lines[1]).toBe('499 more requests ran unguarded in 10 s; the last: store unavailable #499; running unguarded');
    // A sustained outage: one line a window, whatever the traffic.
    for (let second = 0; second < 30; second++) {
      for (let i = 0; i < 100; i++) log.warn('Orders.create:unguarded', 'store unavailable; running unguarded', 'requests ran unguarded');
      jest.advanceTimersByTime(1000);
    }
    expect(logger.lines.length).toBe(5);
  });

  it('says how long its window ran when flushed early (at shutdown)', () => {
    const logger = new KeptLines();
    const log = new OutageLog(logger);
    for (let i = 0; i < 3; i++) log.warn('Orders.create:refused', `refused #${i}`, 'requests refused');
    jest.advanceTimersByTime(2400);
    log.flushAll();
    expect(logger.lines).toEqual(['refused #0', '2 more requests refused in 2.4 s; the last: refused #2']);
  });

  it('keeps kinds apart, and logs the next outage at once', () => {
    const logger = new KeptLines();
    const log = new OutageLog(logger);
    log.warn('Orders.create:unguarded', 'a', 'requests ran unguarded');
    log.warn('Payments.create:refused', 'b', 'requests refused');
    log.warn('Orders.create:refused', 'c', 'requests refused');
    expect(logger.lines).toEqual(['a', 'b', 'c']);
    jest.advanceTimersByTime(60_000);
    log.warn('Orders.create:unguarded', 'd', 'requests ran unguarded');
    expect(logger.lines).toEqual(['a', 'b', 'c', 'd']);
  });
});
