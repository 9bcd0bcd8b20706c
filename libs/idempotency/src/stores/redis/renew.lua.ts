import { ownerCheckLua } from './owner-check.lua.js';

/**
 * Extend a processing claim, only while the caller's token still owns it (fencing): a completed
 * record, or a claim of another token, is left as it is. The record is rewritten with the new
 * lease end in its head (what a duplicate's 409 hint reads) and the waiter's mark (`W`) kept.
 *
 * KEYS[1]  the record (`redis-record.ts`)
 * ARGV[1]  the owner's token prefix (`["<token>",`)
 * ARGV[2]  lease in milliseconds from now: the record expires after it
 * ARGV[3]  the new lease end (epoch ms), written into the head in place of the old one
 *
 * Returns  1 renewed, 0 refused (lease ran out, completed, released, or another claim holds it)
 *
 * `allow-oom`: at maxmemory (noeviction) a running claim is still renewed, as it is still saved
 * (`complete.lua.ts`); only new claims are refused.
 */
export const RENEW_LUA = `#!lua flags=allow-oom
${ownerCheckLua(0)}
local head = string.match(rec, '^(.*,)')
redis.call('SET', key, head .. ARGV[3] .. ']', 'PX', ARGV[2])
return 1
`;
