import { isStatementError, NoAnswerInTime, type RunStatement, type StatementResult } from './statements.js';

/** How a batched runner makes its statement and reads it (`batchedStatement`). */
export interface Batching<I, O> {
  run: RunStatement;
  /** The statement of many calls; it must give up a lock wait soon (see `BATCH_LOCK_TIMEOUT`). */
  sql: string;
  /** The row a call reads or writes (its key as PostgreSQL reads it). */
  row(item: I): string;
  /** Whether two calls of one row must not share a statement: one carries one call a row, none a statement out carries. */
  distinctRows?: boolean;
  /** What a call weighs in a statement (its body's characters, say): one carries up to `MOST_WEIGHT`, or one call. Default 0. */
  weight?(item: I): number;
  /** The statement's parameters for the calls it carries. */
  params(items: I[]): unknown[];
  /** One answer per call carried, in the order given. */
  answers(result: StatementResult, items: I[]): O[];
  /** One call in a statement of its own: after PostgreSQL refused a statement of many. */
  alone(item: I): Promise<O>;
  /** The runner's bound, ms: a call that waited twice as long fails with the next statement that fails to carry it. */
  boundMs: number;
}

/** A call waiting to go out in the next statement of a batched runner. */
interface Due<I, O> {
  item: I;
  weight: number;
  /** When it was made (`Date.now()`). */
  since: number;
  /** Its row (`Batching.row`). */
  row: string;
  resolve(answer: O | Promise<O>): void;
  reject(error: unknown): void;
}

/**
 * Whether a call failed because a bound ran out (no connection, or no answer, in time: ours, or
 * pg-pool's `connectionTimeoutMillis`), not because one connection failed.
 */
function timedOut(error: unknown): boolean {
  const cause = (error as Error | undefined)?.cause;
  return cause instanceof NoAnswerInTime || (cause instanceof Error && cause.message.includes('timeout exceeded when trying to connect'));
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
 * the next, up to `MOST_CALLS` and `MOST_WEIGHT` (with `distinctRows`, one a row, none a statement
 * out carries: two statements of the process's own never wait for each other's rows). A statement
 * PostgreSQL refused (a call's values, a lock wait past `BATCH_LOCK_TIMEOUT`) runs each call it
 * carried again alone, as before batching, so that one call's values or row fail or hold that
 * call only (and a lone call waits for its row as long as it would have). A statement that got
 * no connection within its bound fails the calls due, which would each have waited as long;
 * one refused a connection fails the oldest call due, as one call's own attempt would have
 * failed, and those due that waited twice their bound (`boundMs`: refusals one at a time, each
 * 20 ms, kept the last of 300 calls 7 s), and the next statement tries again (failing none, a refused connection sent the
 * next statement at once, for ever, a core spinning; failing every call due, one connection in
 * two refused failed 260 of 300 calls and ran one key's fail-open duplicates 194 times:
 * adversarial helpers). A statement whose connection was lost, or that had no answer within its
 * bound, fails the first call of each row it carried, which may have written it, as it would
 * have failed that call alone, and sends the others again, which wrote nothing (the later claims
 * of a key, answered by the first), but for those that waited twice their bound: failing the
 * calls due behind it too, or every call it carried, one backend ended or one connection hung on
 * a healthy database failed a storm of duplicates, and a fail-open route ran one key up to 200
 * times; sending them all again, behind statements that hung 40 duplicates failed one a
 * statement, the last after 21 s on a 500 ms bound (adversarial helpers).
 */
export function batchedStatement<I, O>({ run, sql, row, distinctRows = false, weight, params, answers, alone, boundMs }: Batching<I, O>): (item: I) => Promise<O> {
  let due: Due<I, O>[] = [];
  /** A statement waits for a connection: the calls due when it gets one go in it. */
  let waiting = false;
  let out = 0;
  /** With `distinctRows`, the rows of the statements out. */
  const carrying = new Set<string>();
  /** The calls running alone, by row: settled when the call is, with its error if it failed. */
  const aloneRuns = new Map<string, Promise<unknown>>();
  const free = () => !waiting && out < STATEMENTS_AT_ONCE;
  /** Whether a call has waited its bound. */
  const waitedOut = (call: Due<I, O>) => Date.now() - call.since >= boundMs;
  /**
   * Whether a call the store failed to carry has waited as long as it may: twice its bound. Not
   * merely its bound, which every call of a statement with no answer has waited: failing those,
   * one connection hung on a healthy database failed 100 duplicates and ran a fail-open key 99
   * times; sending them again whatever they had waited, behind statements that all hung 40
   * duplicates failed one a statement, the last after 21 s on a 500 ms bound (adversarial helpers).
   */
  const waitedTwiceOut = (call: Due<I, O>) => Date.now() - call.since >= 2 * boundMs;
  /** Whether a call may go in the next statement. */
  const goes = (call: Due<I, O>) => !distinctRows || !carrying.has(call.row);
  /** A call goes in the next statement, after the call of its row running alone, if any. */
  const enqueue = (call: Due<I, O>): void => {
    const running = aloneRuns.get(call.row);
    // Failed after this call waited its bound: so would this call have. Sooner, it goes again.
    if (running) return void running.then((error) => (error !== undefined && waitedOut(call) ? call.reject(error) : enqueue(call)));
    due.push(call);
    if (free() && goes(call)) send();
  };
  /**
   * A call of a refused statement runs alone, as before batching; another call of its row waits
   * for it (a row held by another transaction then holds one connection, not one a call: the
   * duplicates of a key a transaction held each waited for its lock on a connection of their
   * own, and starved the pool of the other keys' claims, an adversarial helper). When that call
   * fails, the calls that waited for it their bound fail with it, as each would have (sent again,
   * 25 duplicates of a held key failed one by one over 18 s, one a bound, and over 3 s, one a
   * killed lone claim); the others go again, and wait for the row within their own bound (failed
   * with it because its wait ran past its bound, claims that had waited 38 ms failed where alone
   * they would have been answered once the row was freed: adversarial helpers).
   */
  const runAlone = (call: Due<I, O>): void => {
    if (aloneRuns.has(call.row)) return enqueue(call);
    const settled = alone(call.item).then(
      (answer) => call.resolve(answer),
      (error: unknown) => {
        call.reject(error);
        return error;
      },
    );
    aloneRuns.set(call.row, settled);
    void settled.then(() => aloneRuns.delete(call.row));
  };
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
        if (fits && (!distinctRows || (!carrying.has(call.row) && !rows.has(call.row)))) {
          if (distinctRows) rows.add(call.row);
          carried += call.weight;
          taken.push(call);
        } else left.push(call);
      }
      due = left;
      for (const taken of rows) carrying.add(taken);
      return taken;
    };
    const end = () => {
      out--;
      if (waiting && sent === undefined) waiting = false;
      if (distinctRows) for (const call of sent ?? []) carrying.delete(call.row);
      if (free() && due.some(goes)) send();
    };
    run(sql, () => params((sent = take()).map((call) => call.item))).then(
      (result) => {
        const read = answers(result, sent!.map((call) => call.item));
        end();
        sent!.forEach((call, i) => call.resolve(read[i]!));
      },
      (error: unknown) => {
        if (sent === undefined) {
          // No connection within the bound: nothing moves, and each call due would have waited as
          // long. Refused: one connection's failure, as one call's own attempt would have met; the
          // oldest call due fails, with those that waited twice their bound, and the next statement
          // tries another connection. (Not those that waited their bound: the later claims of a key
          // sent again after a statement with no answer all have, and one refusal failed them all.)
          const failed: Due<I, O>[] = [];
          const left: Due<I, O>[] = [];
          const all = timedOut(error);
          due.forEach((call, i) => (all || i === 0 || waitedTwiceOut(call) ? failed : left).push(call));
          due = left;
          end();
          for (const call of failed) call.reject(error);
          return;
        }
        end();
        if (isStatementError((error as Error).cause)) {
          for (const call of sent) runAlone(call);
          return;
        }
        // Lost, or no answer in time: only a row's first call may have written it; the others go
        // again, but for those that waited twice their bound (`waitedTwiceOut`).
        const firsts = new Set<string>();
        for (const call of sent) {
          if (firsts.has(call.row) && !waitedTwiceOut(call)) enqueue(call);
          else {
            firsts.add(call.row);
            call.reject(error);
          }
        }
      },
    );
  };
  return (item) => new Promise<O>((resolve, reject) => enqueue({ item, row: row(item), weight: weight?.(item) ?? 0, since: Date.now(), resolve, reject }));
}
