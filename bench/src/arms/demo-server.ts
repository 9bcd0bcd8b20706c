import 'reflect-metadata';
import type { INestApplication } from '@nestjs/common';
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { createDemoApp, type HttpAdapterName } from '../../../apps/demo/src/demo-app.factory.js';

/** Sampling interval of the event-loop delay histogram, ms: a stall is known to within this. */
export const LOOP_RESOLUTION_MS = 5;

/** What the demo process answers to `{ type: 'read' }` over IPC. */
export interface LoopDelay {
  type: 'loop';
  /** Longest the event loop went without turning since the last reset, ms (the sampling interval taken off). */
  worstStallMs: number;
  /** 99th percentile of the sampled delays, ms (the sampling interval taken off). */
  p99StallMs: number;
}

/**
 * The demo app (`apps/demo`, as `npm start` builds it, with its guards, pipe and filter) as its
 * own process, for the bad-input phase: `ADAPTER`, `PORT`, `DATABASE_URL`, `REDIS_URL`,
 * `KEY_PREFIX`. Prints `READY <port>` when it listens. Over IPC, `{ type: 'reset' }` clears its
 * event-loop delay histogram and `{ type: 'read' }` answers a {@link LoopDelay}.
 */
async function main(): Promise<void> {
  const adapter = (process.env.ADAPTER ?? 'express') as HttpAdapterName;
  const port = Number(process.env.PORT);
  const app: INestApplication = await createDemoApp({
    adapter,
    databaseUrl: process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test',
    redisUrl: process.env.REDIS_URL,
    keyPrefix: process.env.KEY_PREFIX ?? 'bench-bad-input',
    logger: ['error'],
  });
  const delay = monitorEventLoopDelay({ resolution: LOOP_RESOLUTION_MS });
  delay.enable();
  const stallMs = (nanoseconds: number) => Math.max(0, nanoseconds / 1e6 - LOOP_RESOLUTION_MS);
  process.on('message', (message: { type?: string }) => {
    if (message.type === 'reset') {
      delay.reset();
      process.send?.({ type: 'reset' });
    } else if (message.type === 'read') {
      const answer: LoopDelay = { type: 'loop', worstStallMs: stallMs(delay.max), p99StallMs: stallMs(delay.percentile(99)) };
      process.send?.(answer);
    }
  });
  process.once('SIGTERM', () => void app.close().finally(() => process.exit(0)));
  await app.listen(port, '127.0.0.1');
  process.stdout.write(`READY ${port}\n`);
}

main().catch((error: unknown) => {
  process.stderr.write(`${error instanceof Error ? (error.stack ?? error.message) : String(error)}\n`);
  process.exit(1);
});
