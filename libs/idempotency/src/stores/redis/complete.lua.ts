import { ownerCheckLua } from './owner-check.lua.js';

/**
 * Save the response, only while the caller's token still owns a processing claim (fencing).
 *
 * KEYS[1]  the record (`redis-record.ts`)
 * ARGV[1]  the owner's token prefix (`["<token>",`)
 * ARGV[2]  the response part of the completed record (`encodeResponse`); the head is kept
 * ARGV[3]  retention in milliseconds
 * ARGV[4]  channel on which the key is published when a waiter marked the record (`W`); a user whose ACL
 *          refuses PUBLISH still saves (`pcall`): waiters then sleep to their bound
 *
 * Returns  1 saved (or saved by this owner already: the same save sent again), 0 refused (lease
 *          ran out, or another claim holds the key)
 *
 * `allow-oom`: a Redis at its maxmemory under noeviction refuses new claims, but lets a claim it
 * took finish. Refused, a handler that succeeded would lose its answer, and a retry would run it
 * again once the lease ended. The record outgrows maxmemory by the answers of running claims.
 */
export const COMPLETE_LUA = `#!lua flags=allow-oom
${ownerCheckLua(1)}
redis.call('SET', key, 'C' .. string.sub(rec, 2) .. '\\n' .. ARGV[2], 'PX', ARGV[3])
if state == 'W' then
  redis.pcall('PUBLISH', ARGV[4], key)
end
return 1
`;
