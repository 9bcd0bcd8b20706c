import { randomUUID } from 'node:crypto';
import type { DataSource, EntityManager } from 'typeorm';
import {
  IdempotentTransactions,
  PostgresIdempotencyStore,
  type IdempotentAnswer,
  type IdempotentRunResult,
} from '../../libs/idempotency/src/typeorm/index.js';
import { recordKey } from '../../libs/idempotency/src/typeorm/store/record-key.js';

/**
 * What the kill test (`test/transactional.e2e-spec.ts`) and its child process
 * (`transactional-child.ts`) share: the business table, the work, and the ways to run it once
 * per key, the real one and two deliberately broken ones that the test must catch.
 */

/** The business effect: one row per run of the work, deliberately without a unique key. */
export const killPaymentsDdl = (schema: string) =>
  `CREATE TABLE "${schema}".kill_payments (id serial PRIMARY KEY, op_key varchar(200) NOT NULL, attempt varchar(100) NOT NULL)`;

/** The answer the work saves: it names its business row, so an answer can be matched with its effect. */
export interface PaymentBody {
  paymentId: number;
  attempt: string;
}

/**
 * Where a run stands, in order. `written`: the work wrote its row (inside the transaction);
 * `returned`: the work returned its answer (the run then completes and commits); `committed`:
 * the run returned (committed); `reported`: the process printed the answer. The broken
 * variants add `effect-committed` (their work committed, the record not yet saved).
 */
export type Point = 'start' | 'written' | 'returned' | 'effect-committed' | 'committed' | 'reported';

/** Passes a point: reports it, and the child may stop there for good (to be killed). */
export type PassPoint = (point: Point) => Promise<void>;

/** How a run is done: the library's transactional mode, or a broken design the test must catch. */
export type Variant = 'transactional' | 'claim-first' | 'effect-first';

export type RunOnce = (key: string, work: (manager: EntityManager) => Promise<IdempotentAnswer<PaymentBody>>, pass: PassPoint) => Promise<IdempotentRunResult<PaymentBody>>;

/** The work: one business row, its answer naming it. */
export function payWork(schema: string, key: string, attempt: string, pass: PassPoint, delayMs = 0) {
  return async (manager: EntityManager): Promise<IdempotentAnswer<PaymentBody>> => {
    const [{ id }] = await manager.query(`INSERT INTO "${schema}".kill_payments (op_key, attempt) VALUES ($1, $2) RETURNING id`, [key, attempt]);
    await pass('written');
    if (delayMs > 0) await new Promise((resolve) => setTimeout(resolve, delayMs));
    await pass('returned');
    return { statusCode: 201, body: { paymentId: id, attempt } };
  };
}

/** Lease of the broken variants' committed claims: short, so a retry can take a dead one over. */
const BROKEN_LEASE_MS = 300;

export function runnerOf(variant: Variant, dataSource: DataSource, schema: string): RunOnce {
  if (variant === 'transactional') {
    const transactions = new IdempotentTransactions(dataSource, { lockTimeoutMs: 2000 });
    return (key, work) => transactions.run({ key, fingerprint: 'kill' }, work);
  }
  const store = new PostgresIdempotencyStore(dataSource);
  const table = `"${schema}".idempotency_records`;
  return async (key, work, pass) => {
    // BROKEN on purpose: the claim commits on its own, before the work and the answer.
    const token = randomUUID();
    const claim = await store.claim({ key, token, fingerprint: 'kill', leaseMs: BROKEN_LEASE_MS });
    if (claim.status === 'in_progress' || claim.status === 'mismatch') return claim;
    if (claim.status === 'completed') {
      return { status: 'replayed', statusCode: claim.response.statusCode, body: JSON.parse(claim.response.body ?? 'null') };
    }
    const complete = (manager: EntityManager, answer: IdempotentAnswer<PaymentBody>) =>
      manager.query(
        `UPDATE ${table} SET state = 'completed', status_code = $3, headers = '{}', body = $4, has_body = true,
           expires_at = now() + interval '1 hour' WHERE key = $1 AND token = $2`,
        [recordKey(key), token, answer.statusCode, JSON.stringify(answer.body)],
      );
    let answer: IdempotentAnswer<PaymentBody>;
    if (variant === 'claim-first') {
      // The work and the answer commit together, in a second transaction.
      answer = await dataSource.transaction(async (manager) => {
        const made = await work(manager);
        await complete(manager, made);
        return made;
      });
    } else {
      // The work commits, then the answer is saved: the guard's flow with a store beside the database.
      answer = await dataSource.transaction((manager) => work(manager));
      await pass('effect-committed');
      await complete(dataSource.manager, answer);
    }
    return { status: 'ran', statusCode: answer.statusCode ?? 200, body: answer.body };
  };
}
