import type { Redis } from 'ioredis';
import { setTimeout as sleep } from 'node:timers/promises';
import { REDIS_ARMS, UNGUARDED_ARMS, type AdapterName, type ArmName } from '../arm-names.js';
import { runLoad, send, type LoadResult } from '../driver/load.js';
import { handlerRuns, type ArmProcess } from '../driver/processes.js';
import type { Progress } from '../driver/progress.js';
import { postgresCpuMicros } from '../driver/postgres-stats.js';
import { readCommandStats, redisCpuMicros, resetCommandStats, type CommandCounts } from '../driver/redis-stats.js';

/** `unique`: every request a new key (claim + complete). `replay`: one key, answered from the store. */
export type Mode = 'unique' | 'replay';

export const ORDER_BODY = JSON.stringify({ orderNo: 'ORD-1', amount: 12.5 });

export interface Sample extends LoadResult {
  round: number;
  adapter: AdapterName;
  arm: ArmName;
  mode: Mode;
  handlerRuns: number;
  /** CPU time of the arm's process per request sent, microseconds (robust to a busy machine). */
  appCpuMicrosPerRequest: number;
  /**
   * CPU time of the store's server per request sent, microseconds: redis-server for the Redis
   * arms, every PostgreSQL process for the PostgreSQL arm.
   */
  storeCpuMicrosPerRequest?: number;
  redis?: CommandCounts;
}

export interface ThroughputSettings {
  seconds: number;
  warmupSeconds: number;
  rounds: number;
  connections: number;
}

interface Slot {
  arm: ArmName;
  mode: Mode;
}

/** The unguarded arms once (bare is the baseline of both modes), every guard in both modes. */
export function slotsOf(arms: readonly ArmName[]): Slot[] {
  return arms.flatMap((arm): Slot[] =>
    UNGUARDED_ARMS.has(arm) ? [{ arm, mode: 'unique' }] : [{ arm, mode: 'unique' }, { arm, mode: 'replay' }],
  );
}

/**
 * Arms interleaved: every round runs each (arm, mode) once per adapter, the order rotated by one
 * each round, so drift on this shared machine (thermal, GC, Redis memory) spreads over all arms.
 */
export async function throughputPhase(
  armsByAdapter: Map<AdapterName, Map<ArmName, ArmProcess>>,
  redis: Redis,
  settings: ThroughputSettings,
  progress: Progress,
): Promise<Sample[]> {
  const samples: Sample[] = [];
  for (const [adapter, arms] of armsByAdapter) {
    for (const slot of slotsOf([...arms.keys()])) {
      progress.step(`warm-up ${adapter} ${slot.arm} ${slot.mode}`);
      await measure(arms.get(slot.arm)!, slot.mode, settings.warmupSeconds, settings.connections, redis);
    }
  }
  for (let round = 1; round <= settings.rounds; round++) {
    for (const [adapter, arms] of armsByAdapter) {
      const slots = slotsOf([...arms.keys()]);
      const rotated = [...slots.slice((round - 1) % slots.length), ...slots.slice(0, (round - 1) % slots.length)];
      for (const slot of rotated) {
        progress.show(`round ${round}/${settings.rounds} ${adapter} ${slot.arm} ${slot.mode}`);
        const sample = await measure(arms.get(slot.arm)!, slot.mode, settings.seconds, settings.connections, redis);
        samples.push({ ...sample, round, adapter, arm: slot.arm, mode: slot.mode });
        progress.step(`round ${round}/${settings.rounds} ${adapter} ${slot.arm} ${slot.mode}: ${Math.round(sample.rps)} req/s`);
      }
    }
  }
  return samples;
}

/** Handler runs once the requests in flight at the stop have finished (stable for 100 ms). */
async function settledRuns(arm: ArmProcess) {
  let last = await handlerRuns(arm);
  for (let i = 0; i < 20; i++) {
    await sleep(100);
    const now = await handlerRuns(arm);
    if (now.orders === last.orders) return now;
    last = now;
  }
  return last;
}

async function measure(arm: ArmProcess, mode: Mode, seconds: number, connections: number, redis: Redis) {
  const url = `${arm.url}/orders`;
  const replayKey = `replay-${arm.arm}-${arm.adapter}`;
  // Both modes carry a fresh id per request, so autocannon rebuilds every request in both.
  const headers: Record<string, string> =
    mode === 'unique' ? { 'idempotency-key': '[<id>]' } : { 'idempotency-key': replayKey, 'x-request-id': '[<id>]' };
  if (mode === 'replay') {
    const status = await send(url, { 'idempotency-key': replayKey }, ORDER_BODY);
    if (status !== 201) throw new Error(`${arm.arm}/${arm.adapter}: seeding the replay key answered ${status}`);
  }
  const countRedis = REDIS_ARMS.has(arm.arm);
  if (countRedis) await resetCommandStats(redis);
  const storeCpu = countRedis ? () => redisCpuMicros(redis) : arm.arm === 'guard-postgres' ? postgresCpuMicros : undefined;
  const storeCpuBefore = await storeCpu?.();
  const before = await handlerRuns(arm);
  const load = await runLoad({ url, headers, body: ORDER_BODY, connections, seconds });
  const after = await settledRuns(arm);
  const storeCpuAfter = await storeCpu?.();
  const sentByClient =
    after.redisCommands === undefined ? undefined : after.redisCommands - (before.redisCommands ?? 0);
  const commands = countRedis ? await readCommandStats(redis, sentByClient) : undefined;
  return {
    ...load,
    handlerRuns: after.orders - before.orders,
    appCpuMicrosPerRequest: (after.cpuMicros - before.cpuMicros) / load.sent,
    storeCpuMicrosPerRequest: storeCpuBefore === undefined || storeCpuAfter === undefined ? undefined : (storeCpuAfter - storeCpuBefore) / load.sent,
    redis: commands,
  };
}
