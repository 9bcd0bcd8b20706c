/**
 * Compare-and-delete: free a processing claim only while the caller's token owns it.
 *
 * KEYS[1]  the record
 * ARGV[1]  owner token
 * ARGV[2]  channel on which the key is published when a waiter marked the record
 *
 * Returns  1 deleted, 0 refused (not the owner, already completed, or gone)
 */
export const RELEASE_LUA = `
local key = KEYS[1]
local token = ARGV[1]
local channel = ARGV[2]
local rec = redis.call('HMGET', key, 's', 't', 'w')
if rec[1] ~= 'P' or rec[2] ~= token then
  return 0
end
redis.call('DEL', key)
if rec[3] then
  redis.call('PUBLISH', channel, key)
end
return 1
`;
