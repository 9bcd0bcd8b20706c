import { Redis } from 'ioredis';
import { CLAIM_LUA } from '../../../libs/idempotency/src/stores/redis/claim.lua.js';
import { COMPLETE_LUA } from '../../../libs/idempotency/src/stores/redis/complete.lua.js';
import { RELEASE_LUA } from '../../../libs/idempotency/src/stores/redis/release.lua.js';

/** Commands the bench itself sends, or clients send when they connect: never counted. */
const ADMIN = /^(config|info|client|hello|command|script|flushall|flushdb|ping|select|subscribe|psubscribe|quit|dbsize|keys)(\||$)/;

/** Commands that the guard's Lua scripts run (`redis.call('X'`): in-script, not round trips. */
const IN_SCRIPT = new Set(
  [CLAIM_LUA, COMPLETE_LUA, RELEASE_LUA].flatMap((lua) =>
    [...lua.matchAll(/redis\.call\(\s*'(\w+)'/g)].map((match) => match[1].toLowerCase()),
  ),
);
const SCRIPT_CALLS = /^(eval|evalsha|eval_ro|evalsha_ro|fcall|fcall_ro)$/;

export interface CommandCounts {
  /** Commands clients sent (round trips), by name. */
  sent: Record<string, number>;
  sentTotal: number;
  /** Commands run inside scripts. */
  inScript: number;
  /** Microseconds Redis spent executing the commands sent (a script's time includes its calls). */
  usec: number;
}

/**
 * `INFO commandstats` of the bench's Redis, between two `CONFIG RESETSTAT`s. Redis counts the
 * commands a Lua script runs as well: when scripts ran, the commands named in the guard's
 * scripts are counted as in-script, not as round trips.
 */
export async function resetCommandStats(redis: Redis): Promise<void> {
  await redis.config('RESETSTAT');
}

export async function readCommandStats(redis: Redis): Promise<CommandCounts> {
  const text = await redis.info('commandstats');
  const calls: Record<string, number> = {};
  const usec: Record<string, number> = {};
  for (const match of text.matchAll(/^cmdstat_([^:]+):calls=(\d+),usec=(\d+)/gm)) {
    calls[match[1].toLowerCase()] = Number(match[2]);
    usec[match[1].toLowerCase()] = Number(match[3]);
  }
  const scripted = Object.keys(calls).some((name) => SCRIPT_CALLS.test(name));
  const counts: CommandCounts = { sent: {}, sentTotal: 0, inScript: 0, usec: 0 };
  for (const [name, n] of Object.entries(calls)) {
    if (ADMIN.test(name)) continue;
    if (scripted && IN_SCRIPT.has(name.split('|')[0])) {
      counts.inScript += n;
    } else {
      counts.sent[name] = n;
      counts.sentTotal += n;
      counts.usec += usec[name];
    }
  }
  return counts;
}

/** CPU time the Redis server used so far (user + system, all threads), microseconds. */
export async function redisCpuMicros(redis: Redis): Promise<number> {
  const text = await redis.info('cpu');
  const field = (name: string) => Number(new RegExp(`^${name}:([\\d.]+)`, 'm').exec(text)?.[1] ?? Number.NaN);
  return (field('used_cpu_user') + field('used_cpu_sys')) * 1e6;
}
