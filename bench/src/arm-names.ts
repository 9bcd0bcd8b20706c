/** Every arm the bench can run; `BENCH_ARMS` picks a subset (bare always runs: it is the baseline). */
export const ARM_NAMES = [
  'bare',
  'empty-interceptor',
  'answering-interceptor',
  'guard-redis',
  'guard-redis-local-cache',
  'guard-memory',
  'guard-postgres',
  'peer-redis',
  'handwritten',
  'guard-redis-autopipe',
  'guard-redis-uncorked',
  'guard-redis-raw-body',
] as const;
export type ArmName = (typeof ARM_NAMES)[number];

/** Run unless `BENCH_ARMS` says otherwise; the lever arms (`guard-redis-uncorked`, `guard-redis-autopipe`) run when named. */
export const DEFAULT_ARMS: readonly ArmName[] = ['bare', 'empty-interceptor', 'answering-interceptor', 'guard-redis', 'guard-redis-local-cache', 'guard-memory', 'guard-postgres', 'peer-redis', 'handwritten'];

export const ARM_LABELS: Record<ArmName, string> = {
  bare: 'bare Nest endpoint',
  'empty-interceptor': 'an empty Nest interceptor (the floor)',
  'answering-interceptor': 'a Nest interceptor answering without the handler (the replay floor)',
  'guard-redis': 'this guard, Redis',
  'guard-redis-local-cache': 'this guard, Redis, localCache: true',
  'guard-memory': 'this guard, memory',
  'guard-postgres': 'this guard, PostgreSQL',
  'peer-redis': '@node-idempotency/nestjs 1.0.4, Redis',
  handwritten: 'hand-written SET NX + SET',
  'guard-redis-autopipe': 'this guard, Redis, ioredis auto-pipelining',
  'guard-redis-uncorked': 'this guard, Redis, a client without write coalescing',
  'guard-redis-raw-body': 'this guard, Redis, an app with rawBody (no longer needed)',
};

/** Arms without a guard: one throughput slot each, no storm or crash phase for the floor. */
export const UNGUARDED_ARMS: ReadonlySet<ArmName> = new Set(['bare', 'empty-interceptor', 'answering-interceptor']);

/** Arms whose store is Redis (commands per request are counted for them). */
export const REDIS_ARMS: ReadonlySet<ArmName> = new Set(['guard-redis', 'guard-redis-local-cache', 'guard-redis-autopipe', 'guard-redis-uncorked', 'guard-redis-raw-body', 'peer-redis', 'handwritten']);

export type AdapterName = 'express' | 'fastify';
export const ADAPTERS: readonly AdapterName[] = ['express', 'fastify'];

export function isArmName(value: string): value is ArmName {
  return (ARM_NAMES as readonly string[]).includes(value);
}
