/**
 * A claim by a duplicate that will wait for the first result: `SET ... NX PX GET`, plus, when the
 * key is in progress, the mark that makes complete and release publish it. One round trip.
 * (A claim that does not wait is the `SET ... NX PX GET` command alone.)
 *
 * KEYS[1]  the record (`redis-record.ts`)
 * ARGV[1]  the processing record to write when the key is free
 * ARGV[2]  lease in milliseconds: a processing record expires after it, so a crash frees the key
 *
 * Returns  nil when the key was free (now claimed), else {the record as it now is, its PTTL}: a
 *          waiter sleeps by the lease Redis keeps, not by the holder's clock
 */
export const CLAIM_WAIT_LUA = `
local key = KEYS[1]
local rec = redis.call('GET', key)
if not rec then
  redis.call('SET', key, ARGV[1], 'PX', ARGV[2])
  return false
end
if string.sub(rec, 1, 1) == 'P' then
  redis.call('SETRANGE', key, 0, 'W')
  rec = 'W' .. string.sub(rec, 2)
end
return {rec, redis.call('PTTL', key)}
`;
