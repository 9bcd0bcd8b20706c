import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { spawn } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import type { DataSource } from 'typeorm';
import { IDEMPOTENCY_MIGRATIONS, type IdempotentRunResult } from '../libs/idempotency/src/typeorm/index.js';
import { recordKey } from '../libs/idempotency/src/typeorm/store/record-key.js';
import { DATABASE_URL } from './support/services.js';
import { dropSchemaDataSource, openSchemaDataSource, testSchemaName } from './support/test-schema.js';
import { killPaymentsDdl, payWork, runnerOf, type PaymentBody, type Point, type Variant } from './support/transactional-kill.js';

/**
 * The promise of `IdempotentTransactions` under SIGKILL: a crash at any point leaves either
 * nothing of a run (the retry runs it once) or everything (the retry replays its answer); never an
 * effect without its record, a record without its effect, two effects or a lost answer. Child
 * processes (`support/transactional-child.ts`) run payments, ten each, and are killed at a named
 * point or at a random one; once PostgreSQL has ended their backends, each run is judged on the
 * database, then retried with its key from here, then judged again. The same judge finds what
 * two broken designs leave (`support/transactional-kill.ts`), so the check can fail.
 */
const ROOT = fileURLToPath(new URL('..', import.meta.url));
/** The design under test; `KILL_VARIANT=claim-first` (or `effect-first`) runs the whole spec against a broken one. */
const VARIANT = (process.env.KILL_VARIANT ?? 'transactional') as Variant;
/** Runs per child process: each is a trial, killed with its process. */
const RUNS_PER_PROCESS = 10;
/** Child processes alive at once (their start-up, ~2 CPU-seconds, is most of a trial's cost). */
const PARALLEL = 3;

/**
 * One child process: its runs stop at `pauseAt` and it is killed there; or it is killed
 * `afterMs` after its run number `run` printed `point` (a random moment: the other runs, started
 * up to 60 ms apart, are anywhere in theirs).
 */
interface Plan {
  variant: Variant;
  pauseAt?: Point;
  killOn?: { run: number; point: Point; afterMs: number };
}

/** What one run of a killed process printed: the points it passed, and its answer if it got that far. */
interface RunTrace {
  key: string;
  last: Point | 'none';
  reported?: IdempotentRunResult<PaymentBody>;
}

/** What the test concluded about one run. */
interface Verdict {
  plan: string;
  last: RunTrace['last'];
  /** The database once the killed process's backends had ended: nothing of the run, everything, or a mix. */
  left: 'nothing' | 'everything' | 'a mix';
  retry: IdempotentRunResult<PaymentBody>['status'];
  violations: string[];
}

/** Points after which nothing of the run may have committed, and after which everything must have. */
const NOTHING_YET: RunTrace['last'][] = ['none', 'start', 'written'];
const ALL_DONE: RunTrace['last'][] = ['committed', 'reported'];
/** The points a random kill is timed from. */
const POINTS: Point[] = ['start', 'written', 'returned', 'committed'];
const pick = (n: number) => Math.floor(Math.random() * n);

describe('IdempotentTransactions under kill -9: nothing or everything, never a mix', () => {
  const schema = testSchemaName();
  let dataSource: DataSource;
  const sql = (text: string, params: unknown[] = []) => dataSource.query(text, params);

  beforeAll(async () => {
    dataSource = await openSchemaDataSource(schema, { migrations: IDEMPOTENCY_MIGRATIONS, migrationsRun: true, extra: { max: 10 } });
    await sql(killPaymentsDdl(schema));
  });
  afterAll(async () => {
    await dropSchemaDataSource(dataSource);
  });

  /** Starts a child with RUNS_PER_PROCESS runs, kills it as `plan` says, and waits until its backends are gone. */
  async function killChild(plan: Plan): Promise<RunTrace[]> {
    const app = `kill-${randomUUID().slice(0, 12)}`;
    const keys = Array.from({ length: RUNS_PER_PROCESS }, (_, i) => `kill:${app}:${i}`);
    const child = spawn(process.execPath, ['--import', './test/support/ts-register.mjs', 'test/support/transactional-child.ts'], {
      cwd: ROOT,
      env: {
        ...process.env,
        DATABASE_URL,
        KILL_SCHEMA: schema,
        KILL_VARIANT: plan.variant,
        KILL_KEYS: JSON.stringify(keys),
        KILL_PAUSE_AT: plan.pauseAt ?? '',
        KILL_STAGGER_MS: plan.pauseAt ? '0' : '60',
        KILL_WORK_DELAY_MS: plan.pauseAt ? '0' : '10',
        KILL_APP: app,
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stderr = '';
    child.stderr!.on('data', (chunk: Buffer) => (stderr = (stderr + chunk.toString()).slice(-4000)));
    const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
    const traces: RunTrace[] = keys.map((key) => ({ key, last: 'none' }));
    const paused = new Set<number>();
    const killed = new Promise<void>((resolve, reject) => {
      const kill = () => resolve(void child.kill('SIGKILL'));
      createInterface({ input: child.stdout! }).on('line', (line) => {
        const [point, index, ...json] = line.split(' ');
        if (point === 'ready' || point === 'done') return;
        const { killOn } = plan;
        if (killOn && point === killOn.point && Number(index) === killOn.run) setTimeout(kill, killOn.afterMs);
        const trace = traces[Number(index)];
        trace.last = point as Point;
        if (point === 'reported') trace.reported = JSON.parse(json.join(' '));
        if (point === plan.pauseAt && paused.add(Number(index)).size === keys.length) kill();
      });
      void exited.then(() => reject(new Error(`the child exited before it was killed (${JSON.stringify(plan)}):\n${stderr}`)));
    });
    try {
      await killed;
    } finally {
      child.kill('SIGKILL');
      await exited;
    }
    // PostgreSQL ends a killed client's backend (rolling back what it had not committed) when it
    // reads the closed socket; only then does the database say what the crash left.
    const deadline = Date.now() + 10_000;
    while ((await sql(`SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name = $1`, [app]))[0].n > 0) {
      if (Date.now() > deadline) throw new Error(`the backends of ${app} outlived the kill by 10 s`);
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
    return traces;
  }

  /** The business rows and the record of a key, judged: nothing, everything, or what is wrong. */
  async function leftOf(key: string): Promise<{ left: Verdict['left']; problems: string[]; body?: PaymentBody }> {
    const rows = (await sql(`SELECT id, attempt FROM "${schema}".kill_payments WHERE op_key = $1 ORDER BY id`, [key])) as { id: number }[];
    const [record] = (await sql(`SELECT state, body FROM "${schema}".idempotency_records WHERE key = $1`, [recordKey(key)])) as {
      state: string;
      body: string | null;
    }[];
    const body = record?.state === 'completed' ? (JSON.parse(record.body ?? 'null') as PaymentBody) : undefined;
    if (rows.length === 0 && !record) return { left: 'nothing', problems: [] };
    if (rows.length === 1 && body?.paymentId === rows[0].id) return { left: 'everything', problems: [], body };
    const problems: string[] = [];
    if (rows.length > 1) problems.push(`two effects (${rows.length} business rows)`);
    if (rows.length > 0 && !body) problems.push(`an effect without its record (record: ${record?.state ?? 'none'})`);
    if (rows.length === 0 && body) problems.push('a record without its effect');
    if (rows.length === 0 && record?.state === 'processing') problems.push('a claim without its effect, holding the key');
    if (rows.length === 1 && body && body.paymentId !== rows[0].id) problems.push('an answer naming another effect');
    return { left: 'a mix', problems, body };
  }

  /** Judges one killed run: what the crash left, then the retry with the same key, then the end state. */
  async function judge(plan: Plan, trace: RunTrace): Promise<Verdict> {
    const { pauseAt, killOn } = plan;
    const name = pauseAt ? `killed at ${pauseAt}` : `killed ${killOn?.afterMs} ms after run ${killOn?.run} passed ${killOn?.point}`;
    const crash = await leftOf(trace.key);
    const violations = crash.problems.map((problem) => `after the kill: ${problem}`);
    if (NOTHING_YET.includes(trace.last) && crash.left !== 'nothing') violations.push(`the run had passed only '${trace.last}', yet left ${crash.left}`);
    if (ALL_DONE.includes(trace.last) && crash.left !== 'everything') violations.push(`the run had passed '${trace.last}', yet left ${crash.left}`);

    const run = runnerOf(plan.variant, dataSource, schema);
    const pass = async () => undefined;
    let retry = await run(trace.key, payWork(schema, trace.key, 'retry', pass), pass);
    if (retry.status === 'in_progress') violations.push('the retry was refused (in_progress) though the killed transaction had ended');
    for (const deadline = Date.now() + 3000; retry.status === 'in_progress' && Date.now() < deadline; ) {
      await new Promise((resolve) => setTimeout(resolve, 100));
      retry = await run(trace.key, payWork(schema, trace.key, 'retry', pass), pass);
    }
    if (crash.left === 'nothing' && retry.status !== 'ran') violations.push(`nothing was left, yet the retry answered ${retry.status}`);
    if (crash.left === 'everything' && !(retry.status === 'replayed' && retry.body.paymentId === crash.body?.paymentId)) {
      violations.push(`the committed answer was lost: the retry answered ${JSON.stringify(retry)}`);
    }
    const reported = trace.reported;
    if (reported && 'body' in reported && !(retry.status === 'replayed' && retry.body.paymentId === reported.body.paymentId)) {
      violations.push(`the answer the process reported (${JSON.stringify(reported.body)}) was not replayed: ${JSON.stringify(retry)}`);
    }
    const end = await leftOf(trace.key);
    violations.push(...end.problems.map((problem) => `after the retry: ${problem}`));
    if (end.left === 'nothing') violations.push('after the retry: no effect at all');
    return { plan: name, last: trace.last, left: crash.left, retry: retry.status, violations: violations.map((v) => `${trace.key} (${name}, last '${trace.last}'): ${v}`) };
  }

  /** Runs the plans, PARALLEL child processes at a time; every run of every process is judged. */
  async function trials(plans: Plan[]): Promise<Verdict[]> {
    const verdicts: Verdict[] = [];
    let next = 0;
    const worker = async () => {
      while (next < plans.length) {
        const plan = plans[next++];
        // One run judged at a time: the database's connections are shared with the children.
        for (const trace of await killChild(plan)) verdicts.push(await judge(plan, trace));
      }
    };
    await Promise.all(Array.from({ length: PARALLEL }, worker));
    return verdicts;
  }

  /** Verdicts counted by `<plan> | last point | what was left | retry`, for the log and the report. */
  const tally = (verdicts: Verdict[]) =>
    verdicts.reduce<Record<string, number>>((counts, v) => {
      const row = `${v.plan.startsWith('killed at') ? v.plan : 'killed at random'} | last '${v.last}' | left ${v.left} | retry ${v.retry}`;
      counts[row] = (counts[row] ?? 0) + 1;
      return counts;
    }, {});

  it(`leaves nothing (the retry runs once) or everything (the retry replays) at every kill point: 110 trials (${VARIANT})`, async () => {
    const times = (n: number, plan: () => Plan) => Array.from({ length: n }, plan);
    const plans = [
      ...times(3, () => ({ variant: VARIANT, pauseAt: 'written' })), // (a) after the business write, before COMMIT
      ...times(3, () => ({ variant: VARIANT, pauseAt: 'committed' })), // (b) after COMMIT, before the answer is reported
      // Random: a few milliseconds after a random run passed a random point, the others anywhere.
      ...times(5, () => ({ variant: VARIANT, killOn: { run: pick(10), point: POINTS[pick(POINTS.length)], afterMs: pick(10) } })),
    ];
    const verdicts = await trials(plans);
    const violations = verdicts.flatMap((v) => v.violations);
    // The counts by kill point and outcome: on a failure, or on request (a passing run stays quiet).
    if (violations.length > 0 || process.env.KILL_VERBOSE) console.log(`kill trials (${VARIANT}):\n${JSON.stringify(tally(verdicts), null, 1)}`);
    expect(violations).toEqual([]);
    expect(verdicts).toHaveLength(110);
    const at = (point: Point) => verdicts.filter((v) => v.plan === `killed at ${point}`);
    expect(at('written').every((v) => v.left === 'nothing' && v.retry === 'ran')).toBe(true);
    expect(at('committed').every((v) => v.left === 'everything' && v.retry === 'replayed')).toBe(true);
  }, 120_000);

  it.each<[Variant, Point, string]>([
    ['claim-first', 'written', 'a claim without its effect'],
    ['effect-first', 'effect-committed', 'two effects'],
  ])('finds what a broken design leaves (%s, killed at %s): the check can fail', async (variant, pauseAt, problem) => {
    const verdicts = await trials([{ variant, pauseAt }]);
    const violations = verdicts.flatMap((v) => v.violations);
    expect(violations.filter((v) => v.includes(problem))).toHaveLength(RUNS_PER_PROCESS);
  }, 60_000);
});
