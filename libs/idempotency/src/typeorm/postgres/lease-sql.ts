/**
 * The time and lease fragments of the PostgreSQL statements. Every time comes from the database
 * clock (`now()`), never from the client's; durations arrive as milliseconds. The row a statement
 * reads or writes is aliased `r`.
 */

/** `now()` plus the milliseconds in parameter `param` (e.g. `'$4'`): where a lease or a retention ends. */
export const msFromNow = (param: string) => `now() + ${param}::float8 * interval '1 millisecond'`;

/**
 * The statement's own clock (`clock_timestamp()`) plus the milliseconds in parameter `param`: a
 * retention set inside a longer transaction, whose `now()` is the transaction's start.
 */
export const msFromClock = (param: string) => `clock_timestamp() + ${param}::float8 * interval '1 millisecond'`;

/** Milliseconds until row `r` expires, rounded up (zero or less once it has). */
export const REMAINING_MS = `ceil(extract(epoch FROM r."expires_at" - now()) * 1000)::float8`;

/** Row `r` has not expired: its lease (or its retention) still runs. */
export const LEASE_RUNNING = `r."expires_at" > now()`;

/**
 * The fence of a write by a claim's owner: row `$1` (by its `idColumn`) is in its `processing`
 * state and held by owner token `$2`. A take-over gives the row another token, so a stale
 * owner's write matches nothing. Add `AND ${LEASE_RUNNING}` to refuse an owner whose lease ran
 * out even when nobody claimed the row again.
 */
export const heldBy = (idColumn: 'key' | 'id', processing: string) =>
  `r."${idColumn}" = $1 AND r."token" = $2 AND r."state" = '${processing}'`;
