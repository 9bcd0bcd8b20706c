import { heldBy, LEASE_RUNNING, msFromClock, msFromNow, REMAINING_MS } from '../postgres/lease-sql.js';

/**
 * The statements of `PostgresOutcomeRecorder`, one per operation. `table` is the quoted
 * (optionally schema-qualified) table name. Every time comes from the database clock
 * (`../postgres/lease-sql.ts`); durations are milliseconds. The purge is `purgeExpiredSql(table, 'id')`.
 */

/**
 * Claim an operation by (request id, content hash), or report the records that hold it.
 *
 * $1 scope, $2 request id (NULL: none), $3 content hash, $4 owner token, $5 lease (ms)
 *
 * 1. `inserted`: a new PROCESSING row, unless a unique key (request id or content hash) is
 *    taken; ON CONFLICT DO NOTHING covers both keys.
 * 2. `found`: the rows holding either key, locked in id order (two claims never lock them in
 *    opposite orders). FOR UPDATE returns the latest committed version of each row.
 * 3. `pick`: the one row to take over, if any. A row is retryable when FAILED or expired
 *    (a PROCESSING lease or a retention that ran out). The request id decides first:
 *    - its row has this content → take it over when retryable;
 *    - its row has other content and is retryable → the row of this content decides if there
 *      is one (taken over when retryable, keeping its own request id, which is unique), else
 *      the request id's row is taken over with the new content (a corrected retry);
 *    - no request id row → the content's row is taken over when retryable, now carrying this
 *      request id (when one was sent).
 * 4. `taken`: the take-over, with a new token and attempt + 1 (the old token is fenced out).
 *
 * Returns `kind = 'acquired'` (one row: `id`, `attempt`, `previous_state` of a take-over), or
 * the `found` rows (`kind = 'found'`) for the caller to answer from, or NO row when the row
 * that refused the insert is not in this statement's snapshot (committed by a concurrent claim
 * after the statement began): run it again. A take-over that would give a row a key another
 * row took meanwhile fails with a unique violation: run it again too.
 */
export const claimSql = (table: string) => `
WITH inserted AS (
  INSERT INTO ${table} AS r ("scope", "request_id", "content_hash", "state", "token", "attempt", "expires_at")
  VALUES ($1, $2, $3, 'PROCESSING', $4, 1, ${msFromNow('$5')})
  ON CONFLICT DO NOTHING
  RETURNING r."id", r."attempt"
),
found AS (
  SELECT r."id", r."request_id", r."content_hash", r."state", r."status_code", r."body",
         (r."state" = 'FAILED' OR r."expires_at" <= now()) AS retryable,
         ${REMAINING_MS} AS remaining_ms
    FROM ${table} AS r
   WHERE r."scope" = $1 AND (r."request_id" = $2 OR r."content_hash" = $3)
     AND NOT EXISTS (SELECT 1 FROM inserted)
   ORDER BY r."id"
     FOR UPDATE
),
by_request AS (SELECT * FROM found WHERE "request_id" = $2),
by_content AS (SELECT * FROM found WHERE "content_hash" = $3),
pick AS (
  SELECT q."id", q."state", q."request_id" AS new_request_id, $3::varchar AS new_content_hash
    FROM by_request AS q
   WHERE q.retryable AND (q."content_hash" = $3 OR NOT EXISTS (SELECT 1 FROM by_content))
  UNION ALL
  SELECT c."id", c."state",
         CASE WHEN EXISTS (SELECT 1 FROM by_request) THEN c."request_id" ELSE coalesce($2, c."request_id") END,
         c."content_hash"
    FROM by_content AS c
   WHERE c.retryable
     AND NOT EXISTS (SELECT 1 FROM by_request AS q WHERE q."id" = c."id" OR NOT q.retryable)
),
taken AS (
  UPDATE ${table} AS r
     SET "state" = 'PROCESSING', "token" = $4, "attempt" = r."attempt" + 1,
         "request_id" = p.new_request_id, "content_hash" = p.new_content_hash,
         "status_code" = NULL, "body" = NULL, "updated_at" = now(), "expires_at" = ${msFromNow('$5')}
    FROM pick AS p
   WHERE r."id" = p."id"
  RETURNING r."id", r."attempt", p."state" AS previous_state
)
SELECT 'acquired' AS kind, i."id", i."attempt", NULL::varchar AS previous_state,
       NULL::varchar AS request_id, NULL::varchar AS content_hash, NULL::varchar AS state,
       NULL::int AS status_code, NULL::text AS body, NULL::boolean AS retryable, NULL::float8 AS remaining_ms
  FROM inserted AS i
UNION ALL
SELECT 'acquired', t."id", t."attempt", t.previous_state, NULL, NULL, NULL, NULL, NULL, NULL, NULL
  FROM taken AS t
UNION ALL
SELECT 'found', f."id", NULL, NULL, f."request_id", f."content_hash", f."state", f."status_code", f."body",
       f.retryable, f.remaining_ms
  FROM found AS f
 WHERE NOT EXISTS (SELECT 1 FROM taken)`;

/**
 * Record the outcome while the token still holds the row (fencing: after a take-over the token
 * differs and nothing is written). Unlike the store's `completeSql`, a lease that ran out does
 * not refuse the owner while nobody has taken the row over: the work is done, and `succeedWith`
 * holds the row lock (so no claim can take it over) while the lease runs out.
 *
 * $1 id, $2 owner token, $3 'SUCCESS' | 'FAILED', $4 status code, $5 body (JSON text) or NULL,
 * $6 retention (ms). Affects 1 row when recorded, 0 when refused.
 */
export const finishSql = (table: string) => `
UPDATE ${table} AS r
   SET "state" = $3, "status_code" = $4, "body" = $5, "updated_at" = now(), "expires_at" = ${msFromClock('$6')}
 WHERE ${heldBy('id', 'PROCESSING')}`;

/**
 * Extend the token's live PROCESSING claim so that it ends $3 milliseconds from now. Refused
 * once the lease ran out, even when nobody took the row over: the owner has lost the lease.
 *
 * $1 id, $2 owner token, $3 lease (ms). Affects 1 row when renewed, 0 when refused.
 */
export const renewSql = (table: string) => `
UPDATE ${table} AS r
   SET "updated_at" = now(), "expires_at" = ${msFromNow('$3')}
 WHERE ${heldBy('id', 'PROCESSING')} AND ${LEASE_RUNNING}`;

/**
 * Lock the row for a fenced transaction, if the token still holds it. $1 id, $2 owner token.
 * Returns the row's id, or no row. Concurrent claims of the row wait for the transaction.
 */
export const lockSql = (table: string) => `
SELECT r."id" FROM ${table} AS r
 WHERE ${heldBy('id', 'PROCESSING')}
   FOR UPDATE`;

/**
 * Read the live record of a request id ($2) or, when $2 is NULL, of a content hash ($3) in
 * scope $1. Returns its row with `ttl_ms`, or no row.
 */
export const getSql = (table: string) => `
SELECT r."id", r."request_id", r."content_hash", r."state", r."attempt", r."status_code", r."body",
       ${REMAINING_MS} AS ttl_ms
  FROM ${table} AS r
 WHERE r."scope" = $1 AND (r."request_id" = $2 OR ($2 IS NULL AND r."content_hash" = $3))
   AND r."expires_at" > now()`;
