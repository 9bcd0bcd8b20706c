import type { Redis } from 'ioredis';
import pg from 'pg';
import { setTimeout as sleep } from 'node:timers/promises';
import type { ArmName } from '../arm-names.js';
import { send } from '../driver/load.js';
import { handlerRuns, startArm, type ArmEnvironment, type ArmProcess } from '../driver/processes.js';
import type { Progress } from '../driver/progress.js';
import { ORDER_BODY } from './throughput.js';

export interface CrashResult {
  arm: ArmName;
  /** Status of the retry sent right after the kill. */
  retryAtZero: number;
  /** Seconds after the kill when a retry first got through (2xx), or undefined within the wait. */
  throughAfterSeconds?: number;
  /** How long the wait went on, seconds. */
  waitedSeconds: number;
  /** Milliseconds the store would still hold the in-flight key, read from Redis at the kill. */
  inFlightTtlMs?: number;
  statusesSeen: Record<string, number>;
  note?: string;
}

const POLL_MS = 250;

/**
 * For each arm: a victim process takes `POST /crash` (its handler never answers) and is SIGKILLed
 * mid-request; the same request is then retried at a live process of the same arm (another
 * replica, or the restarted one): at +0 s, then every 250 ms until it gets through or the wait
 * (lease + 3 s) ends. Arms run side by side; Express only (the store decides, not the adapter).
 */
export async function crashPhase(
  survivors: Map<ArmName, ArmProcess>,
  env: ArmEnvironment,
  redis: Redis,
  progress: Progress,
): Promise<CrashResult[]> {
  const ttlOf = (arm: ArmName, clientKey: string) =>
    arm === 'guard-postgres' && env.postgresSchema
      ? postgresTtlOf(env.databaseUrl, env.postgresSchema, clientKey)
      : redisTtlOf(redis, clientKey);
  const waitMs = (env.crashLeaseSeconds + 3) * 1000;
  const runId = Date.now().toString(36);
  progress.show('crash: starting the victims');
  const results = await Promise.all(
    [...survivors].map(async ([arm, survivor]) => {
      const victim = await startArm(arm, 'express', env, { CRASH_VICTIM: '1' });
      const key = `crash-${runId}-${arm}`;
      const headers = { 'idempotency-key': key };
      const url = (target: ArmProcess) => `${target.url}/crash`;
      const pending = send(url(victim), headers, ORDER_BODY).catch(() => 0);
      while ((await handlerRuns(victim)).crashes === 0) await sleep(10);
      await victim.kill();
      const killedAt = Date.now();
      await pending;
      const inFlightTtlMs = await ttlOf(arm, key);

      const statusesSeen: Record<string, number> = {};
      const retry = async () => {
        const status = await send(url(survivor), headers, ORDER_BODY);
        statusesSeen[status] = (statusesSeen[status] ?? 0) + 1;
        return status;
      };
      const retryAtZero = await retry();
      let throughAfterSeconds = retryAtZero < 300 ? (Date.now() - killedAt) / 1000 : undefined;
      while (throughAfterSeconds === undefined && Date.now() - killedAt < waitMs) {
        await sleep(POLL_MS);
        if ((await retry()) < 300) throughAfterSeconds = (Date.now() - killedAt) / 1000;
      }
      const result: CrashResult = {
        arm,
        retryAtZero,
        throughAfterSeconds,
        waitedSeconds: (Date.now() - killedAt) / 1000,
        inFlightTtlMs,
        statusesSeen,
      };
      if (arm === 'guard-memory') result.note = 'the store died with the process: the retry runs at once (one process only)';
      if (arm === 'bare') result.note = 'no guard';
      return result;
    }),
  );
  progress.step('crash');
  return results;
}

/** The remaining life of the PostgreSQL store's record for `clientKey`. */
async function postgresTtlOf(url: string, schema: string, clientKey: string): Promise<number | undefined> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    const { rows } = await client.query<{ ms: number }>(
      `SELECT extract(epoch FROM expires_at - now()) * 1000 AS ms FROM "${schema}".idempotency_records WHERE key LIKE $1`,
      [`%${clientKey}%`],
    );
    return rows.length > 0 ? Number(rows[0].ms) : undefined;
  } finally {
    await client.end();
  }
}

/** The remaining TTL of the (one) Redis key that holds `clientKey`, if the arm keeps it in Redis. */
async function redisTtlOf(redis: Redis, clientKey: string): Promise<number | undefined> {
  let cursor = '0';
  do {
    const [next, keys] = await redis.scan(cursor, 'MATCH', `*${clientKey}*`, 'COUNT', 10_000);
    if (keys.length > 0) {
      const ttl = await redis.pttl(keys[0]);
      return ttl >= 0 ? ttl : undefined;
    }
    cursor = next;
  } while (cursor !== '0');
  return undefined;
}
