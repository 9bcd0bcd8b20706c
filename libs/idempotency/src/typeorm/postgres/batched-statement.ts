import { isStatementError, NoAnswerInTime, type RunStatement, type StatementResult } from './statements.js';

/** How a batched runner makes its statement and reads it (`batchedStatement`). */
export interface Batching<I, O> {
  run: RunStatement;
  /** The statement of many calls; it must give up a lock wait soon (see `BATCH_LOCK_TIMEOUT`). */
  sql: string;
  /**
   * The row a call writes, where two calls of one row must not share a statement: one carries
   * one call per row, none a statement out already writes. Without it, any calls go together.
   */
  key?(item: I): string;
  /** What a call weighs in a statement (its body's characters, say): one carries up to `MOST_WEIGHT`, or one call. Default 0. */
  weight?(item: I): number;
  /** The statement's parameters for the calls it carries. */
  params(items: I[]): unknown[];
  /** One answer per call carried, in the order given. */
  answers(result: StatementResult, items: I[]): O[];
  /** One call in a statement of its own: after PostgreSQL refused a statement of many. */
  alone(item: I): Promise<O>;
}

/** A call waiting to go out in the next statement of a batched runner. */
interface Due<I, O> {
  item: I;
  weight: number;
  /** Its row (`Batching.key`), or none. */
  key: string | undefined;
  resolve(answer: O | Promise<O>): void;
  reject(error: unknown): void;
}

/** How many statements of one batched runner run at once: the calls due meanwhile wait, and go together. */
const STATEMENTS_AT_ONCE = 2;
/** The most calls one statement carries. */
const MOST_CALLS = 100;
/** The most weight one statement carries (`Batching.weight`), unless it carries one call. */
const MOST_WEIGHT = 1_000_000;

/**
 * How long a statement of many waits for a row lock, at most, set within it (`set_config(...,
 * true)`: its own transaction). Such a statement meets a lock held for long only where a lone
 * call would (a transactional run of a key, an app's transaction on the table): past this it is
 * refused (`lock_not_available`), and its calls run alone, each waiting as it would have, so
 * that one held row never holds the others' calls. It also ends the wait of two statements for
 * each other's rows sooner than PostgreSQL's deadlock check (1 s).
 */
export const BATCH_LOCK_TIMEOUT = `set_config('lock_timeout', '200ms', true) IS NOT NULL`;

/**
 * Runs calls of one kind as few statements: one round trip and one commit for many, which on a
 * busy store is most of what a call costs, on the app's side as on PostgreSQL's. A call goes out
 * at once while fewer than `STATEMENTS_AT_ONCE` statements of the runner are out (so a lone call
 * waits for nothing); past that, the calls made meanwhile wait for one to end and go together in
 * the next, up to `MOST_CALLS` and `MOST_WEIGHT` (with `key`, one per row, none a statement out
 * writes: two statements of the process's own never wait for each other's rows). A statement
 * PostgreSQL refused (a call's values, a lock wait past `BATCH_LOCK_TIMEOUT`) runs each call it
 * carried again alone, as before batching, so that one call's values or row fail or hold that
 * call only (and a lone call waits for its row as long as it would have). A lost connection (a
 * backend ended, a socket cut) fails the calls the statement carried, as it would have failed
 * each, and no other: failing those due too, one backend ended on a healthy database failed a
 * whole storm of duplicates, which a fail-open route then ran, one key up to 200 times (an
 * adversarial helper). A statement with no connection or no answer within its bound
 * (`NoAnswerInTime`) also fails the calls due then: the store does not answer, and they waited
 * for it as they would have waited for a connection.
 */
export function batchedStatement<I, O>({ run, sql, key, weight, params, answers, alone }: Batching<I, O>): (item: I) => Promise<O> {
  let due: Due<I, O>[] = [];
  /** A statement waits for a connection: the calls due when it gets one go in it. */
  let waiting = false;
  let out = 0;
  /** The rows the statements out write. */
  const writing = new Set<string>();
  const free = () => !waiting && out < STATEMENTS_AT_ONCE;
  /** Whether a call may go in the next statement. */
  const goes = (call: Due<I, O>) => call.key === undefined || !writing.has(call.key);
  const send = () => {
    waiting = true;
    out++;
    /** The calls it carries, once it went out. */
    let sent: Due<I, O>[] | undefined;
    const take = () => {
      waiting = false;
      const taken: Due<I, O>[] = [];
      const left: Due<I, O>[] = [];
      const rows = new Set<string>();
      let carried = 0;
      for (const call of due) {
        const fits = taken.length === 0 || (taken.length < MOST_CALLS && carried + call.weight <= MOST_WEIGHT);
        if (fits && (call.key === undefined || (!writing.has(call.key) && !rows.has(call.key)))) {
          if (call.key !== undefined) rows.add(call.key);
          carried += call.weight;
          taken.push(call);
        } else left.push(call);
      }
      due = left;
      for (const row of rows) writing.add(row);
      return taken;
    };
    const end = () => {
      out--;
      if (waiting && sent === undefined) waiting = false;
      for (const call of sent ?? []) if (call.key !== undefined) writing.delete(call.key);
      if (free() && due.some(goes)) send();
    };
    run(sql, () => params((sent = take()).map((call) => call.item))).then(
      (result) => {
        const read = answers(result, sent!.map((call) => call.item));
        end();
        sent!.forEach((call, i) => call.resolve(read[i]!));
      },
      (error: unknown) => {
        const cause = (error as Error).cause;
        if (sent !== undefined && isStatementError(cause)) {
          end();
          for (const call of sent) call.resolve(alone(call.item));
          return;
        }
        // Past its bound the store does not answer: the calls due waited for it, as they would have for a connection.
        const failed = cause instanceof NoAnswerInTime ? [...(sent ?? []), ...due.splice(0)] : (sent ?? []);
        end();
        for (const call of failed) call.reject(error);
      },
    );
  };
  return (item) =>
    new Promise<O>((resolve, reject) => {
      const call = { item, key: key?.(item), weight: weight?.(item) ?? 0, resolve, reject };
      due.push(call);
      if (free() && goes(call)) send();
    });
}
