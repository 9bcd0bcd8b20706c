/**
 * Delete a completed record, and only a completed one: a processing claim (`P`, or `W` when a
 * waiter marked it) is left as it is, since deleting it would let a duplicate run beside the live
 * handler. The check and the delete are one script, so a claim that takes the key between them
 * cannot exist. A completed record has no waiters (they wait on processing records), so nothing
 * is published.
 *
 * The keyspace is the app's too: a record is recognised by its whole encoding
 * (`redis-record.ts`), never by a first letter, as strictly as `decodeRecord` reads it (a value
 * inspect called no record was deleted here: a reviewing helper). Processing: `P["` or `W["`, a
 * head on one line ending in the lease end's number and `]`. Completed: `C["`, a head on one line
 * ending in `]`, then a newline and the meta: `[`, the status, `,{`. Anything else (a string such as `Canada`, a hash, a list) is not a record: left as
 * it is, and TYPE comes first so that no other type raises WRONGTYPE.
 *
 * KEYS[1]  the record (`redis-record.ts`)
 *
 * Returns  1 deleted, 0 no record, 2 refused (in progress), -1 the key holds something else
 */
export const FORGET_LUA = `
local key = KEYS[1]
local kind = redis.call('TYPE', key)['ok']
if kind == 'none' then
  return 0
end
if kind ~= 'string' then
  return -1
end
local rec = redis.call('GET', key)
local start = string.sub(rec, 1, 3)
if (start == 'P["' or start == 'W["') and string.find(rec, '^[PW]%["[^\\n]*",%-?%d[^\\n]*%]$') then
  return 2
end
if start ~= 'C["' or not string.find(rec, '^C%["[^\\n]*%]\\n%[%d+,{') then
  return -1
end
redis.call('DEL', key)
return 1
`;
