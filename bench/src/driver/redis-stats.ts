import { Redis } from 'ioredis';

/** Commands the bench itself sends, or clients send when they connect: never counted. */
const ADMIN = /^(config|info|client|hello|command|script|flushall|flushdb|ping|select|subscribe|psubscribe|quit|dbsize|keys)(\||$)/;

export interface CommandCounts {
  /** Commands Redis ran, by name: those clients sent and those scripts ran. */
  calls: Record<string, number>;
  /** Their sum. */
  total: number;
  /** Round trips: the commands clients sent (the rest ran inside scripts). */
  sentTotal: number;
  inScript: number;
}

/** Starts counting afresh (`CONFIG RESETSTAT`). */
export async function resetCommandStats(redis: Redis): Promise<void> {
  await redis.config('RESETSTAT');
}

/**
 * `INFO commandstats` since the last reset. Redis counts the commands a Lua script runs too, by
 * the same names as commands sent, so it cannot tell round trips from in-script calls:
 * `sentByClient` (counted by the arm's client) does. Without it every command counts as sent,
 * which is right for arms that run no scripts.
 */
export async function readCommandStats(redis: Redis, sentByClient?: number): Promise<CommandCounts> {
  const text = await redis.info('commandstats');
  const calls: Record<string, number> = {};
  let total = 0;
  for (const match of text.matchAll(/^cmdstat_([^:]+):calls=(\d+)/gm)) {
    const name = match[1].toLowerCase();
    if (ADMIN.test(name)) continue;
    calls[name] = Number(match[2]);
    total += calls[name];
  }
  const sentTotal = sentByClient ?? total;
  return { calls, total, sentTotal, inScript: total - sentTotal };
}

/** CPU time the Redis server used so far (user + system, all threads), microseconds. */
export async function redisCpuMicros(redis: Redis): Promise<number> {
  const text = await redis.info('cpu');
  const field = (name: string) => Number(new RegExp(`^${name}:([\\d.]+)`, 'm').exec(text)?.[1] ?? Number.NaN);
  return (field('used_cpu_user') + field('used_cpu_sys')) * 1e6;
}
