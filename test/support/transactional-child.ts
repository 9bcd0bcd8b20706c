// A process for the kill test (`test/transactional.e2e-spec.ts`), run from the sources:
//   node --import ./test/support/ts-register.mjs test/support/transactional-child.ts
// It runs one payment per key in KILL_KEYS, concurrently, each on its own pooled connection, and
// prints a line per point passed (`<point> <run index>`; `reported <index> <json>` last). With
// KILL_PAUSE_AT it stops every run at that point for good, so that the parent kills it exactly
// there; without, the parent kills it at a random moment.
//
// Env: DATABASE_URL, KILL_SCHEMA, KILL_VARIANT (see `Variant`), KILL_KEYS (JSON array),
// KILL_PAUSE_AT (a `Point` or empty), KILL_STAGGER_MS (random delay before each run, at most),
// KILL_WORK_DELAY_MS (random delay inside each work, at most), KILL_APP (application_name).
import { DataSource } from 'typeorm';
import { payWork, runnerOf, type Point, type Variant } from './transactional-kill.js';

const env = (name: string) => process.env[name] ?? '';
const keys = JSON.parse(env('KILL_KEYS')) as string[];
const pauseAt = env('KILL_PAUSE_AT') as Point | '';
const schema = env('KILL_SCHEMA');
const randomMs = (most: number) => Math.floor(Math.random() * (most + 1));

// Pipes to the parent are synchronous on Linux: a line written before the kill reaches it.
const say = (line: string) => process.stdout.write(`${line}\n`);
// The parent always kills this process, also after its last run; should the parent die first,
// it ends itself within a minute.
setTimeout(() => process.exit(1), 60_000);

const dataSource = new DataSource({
  type: 'postgres',
  url: env('DATABASE_URL'),
  schema,
  extra: { max: keys.length + 1, application_name: env('KILL_APP') },
});
await dataSource.initialize();
// Open every connection now, so that the runs start at once.
await Promise.all(keys.map(() => dataSource.query('SELECT pg_sleep(0.01)')));
const run = runnerOf(env('KILL_VARIANT') as Variant, dataSource, schema);
say('ready');

await Promise.all(
  keys.map(async (key, index) => {
    const pass = async (point: Point) => {
      say(`${point} ${index}`);
      if (point === pauseAt) await new Promise(() => undefined);
    };
    await new Promise((resolve) => setTimeout(resolve, randomMs(Number(env('KILL_STAGGER_MS')))));
    await pass('start');
    const work = payWork(schema, key, `child-${process.pid}-${index}`, pass, randomMs(Number(env('KILL_WORK_DELAY_MS'))));
    const result = await run(key, work, pass);
    await pass('committed');
    say(`reported ${index} ${JSON.stringify(result)}`);
  }),
);
say('done');
