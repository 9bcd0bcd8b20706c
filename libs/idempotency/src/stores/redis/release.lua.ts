import { ownerCheckLua } from './owner-check.lua.js';

/**
 * Compare-and-delete: free a processing claim only while the caller's token owns it.
 *
 * KEYS[1]  the record (`redis-record.ts`)
 * ARGV[1]  the owner's token prefix (`["<token>",`)
 * ARGV[2]  channel on which the key is published when a waiter marked the record (`W`); a user whose ACL
 *          refuses PUBLISH still saves (`pcall`): waiters then sleep to their bound
 *
 * Returns  1 deleted, 0 refused (not the owner, already completed, or gone)
 */
export const RELEASE_LUA = `${ownerCheckLua(0)}
redis.call('DEL', key)
if state == 'W' then
  redis.pcall('PUBLISH', ARGV[2], key)
end
return 1
`;
