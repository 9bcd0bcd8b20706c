// A process for `test/postgres-terminated.e2e-spec.ts`, run from the sources:
//   node --import ./test/support/ts-register.mjs test/support/pg-terminate-child.ts
// It makes calls of one kind (MODE: `store` claims keys on the PostgreSQL store, `transactions`
// runs IdempotentTransactions, `consume` runs consumeOnce, `app-after-store` runs plain TypeORM
// transactions after one store claim) in rounds of 20 at once, each round
// behind 30 ms of synchronous work (a loaded app: a connection's "ready" and the server's
// "terminating" then arrive in one socket read), while the parent terminates its connections. It
// prints `survived <errors>` when its rounds are done; a crash ends it with no such line.
//
// Env: DATABASE_URL, PG_SCHEMA (with the tables of IDEMPOTENCY_MIGRATIONS), PG_APP
// (application_name), ROUNDS, MODE.
import { randomUUID } from 'node:crypto';
import { DataSource } from 'typeorm';
import {
  IDEMPOTENCY_ENTITIES,
  IdempotentTransactions,
  PostgresIdempotencyStore,
  consumeOnce,
} from '../../libs/idempotency/src/typeorm/index.js';

const env = (name: string) => process.env[name] ?? '';
// A round that hangs ends the process, saying so (a round takes well under a second; a loaded
// CI machine made the whole run take over a minute, so the bound is per round, not per run).
let round = 0;
let roundStarted = Date.now();
setInterval(() => {
  if (Date.now() - roundStarted < 30_000) return;
  process.stderr.write(`hung: round ${round} of ${env('ROUNDS')} did not end within 30 s\n`);
  process.exit(1);
}, 1000).unref();

const dataSource = new DataSource({
  type: 'postgres',
  url: env('DATABASE_URL'),
  schema: env('PG_SCHEMA'),
  entities: [...IDEMPOTENCY_ENTITIES],
  extra: { max: 20, application_name: env('PG_APP') },
});
await dataSource.initialize();
const store = new PostgresIdempotencyStore(dataSource);
const transactions = new IdempotentTransactions(dataSource);
const calls: Record<string, () => Promise<unknown>> = {
  store: () => store.claim({ key: `terminated:${randomUUID()}`, fingerprint: 'f', token: randomUUID(), leaseMs: 1000 }),
  transactions: () => transactions.run({ key: `terminated:${randomUUID()}` }, async (manager) => ({ body: await manager.query('SELECT 1') })),
  consume: () => consumeOnce(dataSource, { consumer: 'terminated', messageId: randomUUID() }, (manager) => manager.query('SELECT 1')),
  // The app's own TypeORM transactions, once the store ran a statement (below): the store's
  // first statement covers the pool's new connections for the whole app.
  'app-after-store': () => dataSource.transaction((manager) => manager.query('SELECT 1')),
};
if (env('MODE') === 'app-after-store') await calls.store();
const call = calls[env('MODE')];
process.stdout.write('ready\n');

let errors = 0;
for (; round < Number(env('ROUNDS')); round++) {
  roundStarted = Date.now();
  const claims = Array.from({ length: 20 }, () => call().catch(() => errors++));
  const busyUntil = Date.now() + 30;
  while (Date.now() < busyUntil);
  await Promise.all(claims);
}
process.stdout.write(`survived ${errors}\n`);
await dataSource.destroy().catch(() => undefined);
process.exit(0);
