import { heldBy, LEASE_RUNNING, msFromClock, REMAINING_MS } from '../postgres/lease-sql.js';

/**
 * The statements of `IdempotentTransactions`, all run inside the caller's READ COMMITTED
 * transaction, on `PostgresIdempotencyStore`'s table and row format (`../store/`). `table` is the
 * quoted (optionally schema-qualified) table name; `$1` key is the column's value (`recordKey`).
 * Every time comes from the database clock (`../postgres/lease-sql.ts`); `now()` is the
 * transaction's start. Durations are milliseconds. The purge is the store's
 * (`purgeExpiredSql(table, 'key')`): one table, one purge.
 */

/**
 * Bound the claim's wait for a row lock: sets `lock_timeout` to $1 (e.g. `'3000ms'`) for the rest
 * of the transaction and returns the value it replaced as `previous`, for `restoreWaitSql`. The
 * MATERIALIZED CTE reads the old value before the outer select list sets the new one.
 */
export const boundWaitSql = `
WITH old AS MATERIALIZED (SELECT current_setting('lock_timeout') AS previous)
SELECT o.previous, set_config('lock_timeout', $1, true) AS bound
  FROM old AS o`;

/** Put `lock_timeout` back to $1 (`previous` of `boundWaitSql`), so that the work's own waits are the app's. */
export const restoreWaitSql = `SELECT set_config('lock_timeout', $1, true) AS restored`;

/**
 * Claim a key in the transaction, or report the live record that holds it.
 *
 * $1 key, $2 owner token, $3 fingerprint
 *
 * 1. `live`: the committed live record (a completed answer in its retention, or the guard
 *    store's `processing` claim in its lease). When there is one, nothing is written or locked:
 *    a replay takes no row lock.
 * 2. `inserted`: the claim row, `INSERT ... ON CONFLICT DO NOTHING`. A row another transaction
 *    inserted (or is taking over) and has not committed makes it WAIT for that transaction, up
 *    to `lock_timeout`: if it commits, the insert does nothing; if it rolls back, the insert goes
 *    ahead and this transaction holds the key.
 * 3. `taken`: an expired committed record (an answer past its retention, a dead store claim) is
 *    taken over by `UPDATE ... WHERE expires_at <= now()`, which locks it: a concurrent take-over
 *    waits, then re-checks the condition on the row the first one committed.
 *
 * The claim row's `expires_at` is `now()`: the row commits only as the completed record (the
 * same transaction overwrites it), and were it ever to commit as it is, it would hold nobody off.
 *
 * Returns one row: `acquired = true` when this transaction now holds the key; otherwise
 * `acquired = false` with the live record's state, fingerprint, answer and `remaining_ms`.
 * Returns NO row when the row that refused the claim is not in this statement's snapshot (a
 * transaction committed it while this one waited, after the statement began): run the statement
 * again; in READ COMMITTED it takes a fresh snapshot.
 */
export const claimSql = (table: string) => `
WITH live AS (
  SELECT r."state", r."fingerprint", r."status_code", r."body", r."has_body", r."body_encoding", r."unreplayable",
         ${REMAINING_MS} AS remaining_ms
    FROM ${table} AS r
   WHERE r."key" = $1 AND ${LEASE_RUNNING}
), inserted AS (
  INSERT INTO ${table} AS r ("key", "state", "token", "fingerprint", "has_body", "expires_at")
  SELECT $1, 'processing', $2, $3, false, now()
   WHERE NOT EXISTS (SELECT 1 FROM live)
  ON CONFLICT ("key") DO NOTHING
  RETURNING true AS acquired
), taken AS (
  UPDATE ${table} AS r
     SET "state" = 'processing', "token" = $2, "fingerprint" = $3, "status_code" = NULL, "headers" = NULL,
         "body" = NULL, "has_body" = false, "body_encoding" = NULL, "unreplayable" = NULL, "expires_at" = now()
   WHERE r."key" = $1 AND r."expires_at" <= now()
     AND NOT EXISTS (SELECT 1 FROM live) AND NOT EXISTS (SELECT 1 FROM inserted)
  RETURNING true AS acquired
)
SELECT acquired, NULL::varchar AS state, NULL::varchar AS fingerprint, NULL::int AS status_code, NULL::text AS body,
       NULL::boolean AS has_body, NULL::varchar AS body_encoding, NULL::varchar AS unreplayable, NULL::float8 AS remaining_ms
  FROM inserted
UNION ALL
SELECT acquired, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
  FROM taken
UNION ALL
SELECT false, l."state", l."fingerprint", l."status_code", l."body", l."has_body", l."body_encoding", l."unreplayable",
       l.remaining_ms
  FROM live AS l`;

/**
 * Turn the transaction's claim row into the completed record, with the answer and its retention,
 * counted from this statement (`clock_timestamp()`), not from the transaction's start: a run
 * longer than the retention committed an answer that had already expired, and a retry right
 * after it ran the work again (an adversarial helper).
 * The fence (key, token, `processing`) always matches: the transaction holds the row's lock since
 * its claim. The record becomes visible only when the work's writes do, at COMMIT.
 *
 * $1 key, $2 owner token, $3 status code, $4 headers (JSON), $5 body (JSON text) or NULL,
 * $6 has body, $7 retention (ms). Affects 1 row.
 */
export const completeSql = (table: string) => `
UPDATE ${table} AS r
   SET "state" = 'completed', "status_code" = $3, "headers" = $4::jsonb, "body" = $5, "has_body" = $6,
       "body_encoding" = NULL, "unreplayable" = NULL, "expires_at" = ${msFromClock('$7')}
 WHERE ${heldBy('key', 'processing')}`;
