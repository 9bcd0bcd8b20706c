import { BATCH_LOCK_TIMEOUT } from '../postgres/batched-statement.js';
import { heldBy, LEASE_RUNNING, msFromClock, msFromNow, REMAINING_MS } from '../postgres/lease-sql.js';

/**
 * The statements of `PostgresIdempotencyStore`, one per operation, each a single round trip.
 * `table` is the quoted (optionally schema-qualified) table name; `$1` key is the column's value
 * (`recordKey`), not the store key itself. Every time is taken from the database clock
 * (`../postgres/lease-sql.ts`), never from the client's. Durations are milliseconds. The purge
 * is `purgeExpiredSql(table, 'key')`.
 */

/**
 * Claim a key, or report what holds it.
 *
 * $1 key, $2 owner token, $3 fingerprint, $4 lease (ms)
 *
 * Returns one row: `acquired = true` when this call inserted the key or took over an expired
 * record (processing or completed); otherwise `acquired = false` with the live record's state,
 * fingerprint, saved response and `remaining_ms`. Returns NO row when the live record that
 * refused the claim is not in this statement's snapshot: in READ COMMITTED, ON CONFLICT sees
 * (and waits for) the latest committed row, but the SELECT sees the snapshot taken when the
 * statement began, so a row inserted or taken over by a concurrent transaction that committed
 * meanwhile is invisible (or visible only in its old, expired version). The caller runs the
 * statement again, which takes a fresh snapshot.
 *
 * A live record is read first (`live`), and the INSERT only runs when there is none: a duplicate
 * then takes no row lock and writes no WAL (`ON CONFLICT DO UPDATE ... WHERE` locks the
 * conflicting row even when it updates nothing, so every replay used to wait for a WAL flush).
 */
export const claimSql = (table: string) => `
WITH live AS (
  SELECT r."state", r."fingerprint", r."status_code", r."headers", r."body", r."has_body", r."body_encoding", r."unreplayable",
         ${REMAINING_MS} AS remaining_ms
    FROM ${table} AS r
   WHERE r."key" = $1 AND r."expires_at" > now()
), claimed AS (
  INSERT INTO ${table} AS r ("key", "state", "token", "fingerprint", "status_code", "headers", "body", "has_body",
                            "body_encoding", "unreplayable", "expires_at")
  SELECT $1, 'processing', $2, $3, NULL, NULL, NULL, false, NULL, NULL, ${msFromNow('$4')}
   WHERE NOT EXISTS (SELECT 1 FROM live)
  ON CONFLICT ("key") DO UPDATE
    SET "state" = 'processing', "token" = excluded."token", "fingerprint" = excluded."fingerprint",
        "status_code" = NULL, "headers" = NULL, "body" = NULL, "has_body" = false,
        "body_encoding" = NULL, "unreplayable" = NULL, "expires_at" = excluded."expires_at"
    WHERE r."expires_at" <= now()
  RETURNING true AS acquired
)
SELECT acquired, NULL::varchar AS state, NULL::varchar AS fingerprint, NULL::int AS status_code,
       NULL::jsonb AS headers, NULL::text AS body, NULL::boolean AS has_body, NULL::varchar AS body_encoding,
       NULL::varchar AS unreplayable, NULL::float8 AS remaining_ms
  FROM claimed
UNION ALL
SELECT false, l."state", l."fingerprint", l."status_code", l."headers", l."body", l."has_body", l."body_encoding",
       l."unreplayable", l.remaining_ms
  FROM live AS l
 WHERE NOT EXISTS (SELECT 1 FROM claimed)`;

/**
 * Save the response while the token still owns a live processing claim (fencing: a stale owner
 * whose lease ran out is refused even when nobody claimed the key again).
 *
 * $1 key, $2 owner token, $3 status code, $4 headers (JSON), $5 body or NULL, $6 has body,
 * $7 retention (ms), $8 body encoding or NULL, $9 unreplayable reason or NULL. Affects 1 row when
 * saved, 0 when refused.
 */
export const completeSql = (table: string) => `${completeAnyLeaseSql(table)} AND ${LEASE_RUNNING}`;

/**
 * Save the response of the token's processing claim whose lease may have run out, while the row
 * is still that claim (nobody claimed the key since: a claim gives it another token; a forget, a
 * purge or a release deletes it). Parameters and result as `completeSql`.
 */
export const completeAfterLeaseSql = (table: string) => completeAnyLeaseSql(table);

const completeAnyLeaseSql = (table: string) => `
UPDATE ${table} AS r
   SET "state" = 'completed', "status_code" = $3, "headers" = $4::jsonb, "body" = $5, "has_body" = $6,
       "body_encoding" = $8, "unreplayable" = $9, "expires_at" = ${msFromNow('$7')}
 WHERE ${heldBy('key', 'processing')}`;

/**
 * Compare-and-delete a live processing claim.
 *
 * $1 key, $2 owner token. Affects 1 row when deleted, 0 when refused.
 */
export const releaseSql = (table: string) => `
DELETE FROM ${table} AS r
 WHERE ${heldBy('key', 'processing')} AND ${LEASE_RUNNING}`;

/**
 * Extend the token's live processing claim whose row another transaction holds locked
 * (`renewSql` skipped it): this one waits for the lock, in the row's queue, so that a lock taken
 * again and again for short spells cannot keep it out (skipping and trying again later, every
 * renewal of claims whose rows a loop locked 300 ms in every 350 was skipped until their leases
 * ran out, and keys ran up to 3 times: an adversarial helper). The wait is bounded by
 * `lock_timeout`, set for this statement's transaction only before the row is locked: the time
 * left on the lease (at least 1 ms: 0 would mean no bound), or $4 ms when that is shorter. The
 * lease is read on the database's clock as it is when the lock is granted (`clock_timestamp()`,
 * not the statement's start: a renewal that waited past the lease's end would be granted).
 *
 * $1 key, $2 owner token, $3 lease (ms), $4 longest wait (ms). Affects 1 row when renewed, 0 when
 * refused; fails with `lock_not_available` (55P03) when the wait ran out.
 */
export const renewLockedSql = (table: string) => `
UPDATE ${table} AS r
   SET "expires_at" = ${msFromClock('$3')}
 WHERE ${heldBy('key', 'processing')} AND r."expires_at" > clock_timestamp()
   AND set_config('lock_timeout',
         GREATEST(LEAST(ceil(extract(epoch FROM r."expires_at" - clock_timestamp()) * 1000), $4::float8), 1)::bigint || 'ms',
         true) IS NOT NULL`;

/**
 * Extend the token's live processing claims, many in one statement, so that the renewals a
 * process has due take one turn in a busy pool, not one each (`PostgresIdempotencyStore.renew`).
 * Each claim must end $3 milliseconds from now, under the fence of `completeSql` (an owner whose
 * lease ran out is refused even when nobody claimed the key again: it has lost the lease).
 *
 * A row another transaction holds locked is skipped, not waited for, and reported as such: the
 * store renews it by `renewLockedSql`, or in a later statement of this one. Waiting here, one
 * locked row held every other claim's renewal past its lease (a report's `SELECT ... FOR
 * UPDATE` of one key, 1 to 7 other keys ran twice).
 *
 * $1 keys, $2 owner tokens, $3 leases (ms): arrays, one element per claim. Returns one row per
 * claim the token still holds: its `n` (from 1, by array position) and `renewed` (false: its row
 * was locked). A claim with no row is refused.
 */
export const renewSql = (table: string) => `
WITH c AS (
  SELECT * FROM unnest($1::text[], $2::text[], $3::float8[]) WITH ORDINALITY AS c("key", "token", lease_ms, n)
), live AS (
  SELECT c.n
    FROM ${table} AS r
    JOIN c ON r."key" = c."key" AND r."token" = c."token"
   WHERE r."state" = 'processing' AND ${LEASE_RUNNING}
), held AS (
  SELECT r."key", c.lease_ms, c.n
    FROM ${table} AS r
    JOIN c ON r."key" = c."key" AND r."token" = c."token"
   WHERE r."state" = 'processing' AND ${LEASE_RUNNING}
     FOR UPDATE OF r SKIP LOCKED
), renewed AS (
  UPDATE ${table} AS r
     SET "expires_at" = ${msFromNow('h.lease_ms')}
    FROM held AS h
   WHERE r."key" = h."key"
  RETURNING h.n
)
SELECT l.n, EXISTS (SELECT 1 FROM renewed AS u WHERE u.n = l.n) AS renewed
  FROM live AS l`;

/**
 * Delete a live COMPLETED record, never a processing claim: the state is part of the DELETE's
 * condition, so a claim that took the key meanwhile is not deleted (in READ COMMITTED the DELETE
 * re-checks the condition on the latest version of a row another transaction changed).
 *
 * $1 key. Returns one row: `deleted` (1 or 0) and `state`, the live record's state in the
 * statement's snapshot (NULL: none). `deleted = 0` with `state = 'completed'` means the record
 * changed after the snapshot (another forget, or its retention ended and a claim took it): run
 * the statement again.
 */
export const forgetSql = (table: string) => `
WITH live AS (
  SELECT r."state" FROM ${table} AS r WHERE r."key" = $1 AND ${LEASE_RUNNING}
), forgotten AS (
  DELETE FROM ${table} AS r
   WHERE r."key" = $1 AND r."state" = 'completed' AND ${LEASE_RUNNING}
  RETURNING 1
)
SELECT (SELECT count(*) FROM forgotten)::int AS deleted, (SELECT l."state" FROM live AS l) AS state`;

/** Read a live record. $1 key. Returns its row with `ttl_ms`, or no row. */
export const getSql = (table: string) => `
SELECT r."state", r."token", r."fingerprint", r."status_code", r."headers", r."body", r."has_body",
       r."body_encoding", r."unreplayable", ${REMAINING_MS} AS ttl_ms
  FROM ${table} AS r
 WHERE r."key" = $1 AND r."expires_at" > now()`;

/**
 * `claimSql` for many claims in one statement (`PostgresIdempotencyStore.claim` on a busy store:
 * `batchedStatement`).
 *
 * $1 keys, $2 owner tokens, $3 fingerprints, $4 leases (ms): arrays, one element per claim. Returns
 * one row per claim: its `n` (from 1, by array position), `first` (the `n` of its key's first
 * claim in the statement), `acquired`, and the live record that refused it as `claimSql` returns
 * it, its body on the key's first claim's row only (a storm of duplicates replays one body, not
 * a copy per claim). Of the claims of one key that finds no live record, the first inserts it (or
 * takes over an expired one), and the others are refused by that claim, as if it had come first.
 * A claim refused by a record that is not in the statement's snapshot has `acquired = false`
 * and `state` NULL: run it again. New rows go in key order, so that two such statements take
 * their rows in one order.
 */
export const claimManySql = (table: string) => `
WITH c AS (
  SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::float8[]) WITH ORDINALITY AS c("key", "token", "fingerprint", lease_ms, n)
   WHERE ${BATCH_LOCK_TIMEOUT}
), firsts AS (
  SELECT c."key", min(c.n) AS n FROM c GROUP BY c."key"
), live AS (
  SELECT r."key", r."state", r."fingerprint", r."status_code", r."headers", r."body", r."has_body", r."body_encoding", r."unreplayable",
         ${REMAINING_MS} AS remaining_ms
    FROM firsts AS f JOIN ${table} AS r ON r."key" = f."key" AND r."expires_at" > now()
), claimed AS (
  INSERT INTO ${table} AS r ("key", "state", "token", "fingerprint", "status_code", "headers", "body", "has_body",
                            "body_encoding", "unreplayable", "expires_at")
  SELECT c."key", 'processing', c."token", c."fingerprint", NULL, NULL, NULL, false, NULL, NULL, ${msFromNow('c.lease_ms')}
    FROM c JOIN firsts AS f ON f.n = c.n
   WHERE NOT EXISTS (SELECT 1 FROM live AS l WHERE l."key" = c."key")
   ORDER BY c."key"
  ON CONFLICT ("key") DO UPDATE
    SET "state" = 'processing', "token" = excluded."token", "fingerprint" = excluded."fingerprint",
        "status_code" = NULL, "headers" = NULL, "body" = NULL, "has_body" = false,
        "body_encoding" = NULL, "unreplayable" = NULL, "expires_at" = excluded."expires_at"
    WHERE r."expires_at" <= now()
  RETURNING r."key", r."fingerprint", ${REMAINING_MS} AS remaining_ms
)
SELECT c.n, f.n AS first, k."key" IS NOT NULL AND f.n = c.n AS acquired,
       CASE WHEN k."key" IS NOT NULL AND f.n <> c.n THEN 'processing' ELSE l."state" END AS state,
       COALESCE(l."fingerprint", k."fingerprint") AS fingerprint, l."status_code", l."headers",
       CASE WHEN f.n = c.n THEN l."body" END AS body, l."has_body", l."body_encoding", l."unreplayable",
       COALESCE(l.remaining_ms, k.remaining_ms) AS remaining_ms
  FROM c
  JOIN firsts AS f ON f."key" = c."key"
  LEFT JOIN live AS l ON l."key" = c."key"
  LEFT JOIN claimed AS k ON k."key" = c."key"`;

/**
 * `completeSql` for many saves in one statement (`batchedStatement`). $1 keys (distinct), $2
 * owner tokens, $3 status codes, $4 headers (JSON), $5 bodies (NULL: none), $6 has body, $7
 * retentions (ms), $8 body encodings, $9 unreplayable reasons: arrays, one element per save.
 * Returns the `n` (from 1, by array position) of each save made.
 */
export const completeManySql = (table: string) => `
UPDATE ${table} AS r
   SET "state" = 'completed', "status_code" = c.status_code, "headers" = c.headers::jsonb, "body" = c.body, "has_body" = c.has_body,
       "body_encoding" = c.body_encoding, "unreplayable" = c.unreplayable, "expires_at" = ${msFromNow('c.retention_ms')}
  FROM (SELECT * FROM unnest($1::text[], $2::text[], $3::int[], $4::text[], $5::text[], $6::boolean[], $7::float8[], $8::text[], $9::text[])
                 WITH ORDINALITY AS c("key", "token", status_code, headers, body, has_body, retention_ms, body_encoding, unreplayable, n)
         WHERE ${BATCH_LOCK_TIMEOUT}) AS c
 WHERE r."key" = c."key" AND r."token" = c."token" AND r."state" = 'processing' AND ${LEASE_RUNNING}
RETURNING c.n`;
