/**
 * Save the response, only while the caller's token still owns a processing claim (fencing).
 *
 * KEYS[1]  the record
 * ARGV[1]  owner token
 * ARGV[2]  status code
 * ARGV[3]  headers JSON
 * ARGV[4]  body JSON text ('' with ARGV[5] = '0' when the handler returned nothing)
 * ARGV[5]  '1' when there is a body
 * ARGV[6]  retention in milliseconds
 * ARGV[7]  channel on which the key is published when a waiter marked the record
 *
 * Returns  1 saved, 0 refused (lease ran out, or another claim holds the key)
 */
export const COMPLETE_LUA = `
local key = KEYS[1]
local token = ARGV[1]
local statusCode = ARGV[2]
local headers = ARGV[3]
local body = ARGV[4]
local hasBody = ARGV[5] == '1'
local ttlMs = ARGV[6]
local channel = ARGV[7]
local rec = redis.call('HMGET', key, 's', 't', 'w')
if rec[1] ~= 'P' or rec[2] ~= token then
  return 0
end
redis.call('HSET', key, 's', 'C', 'c', statusCode, 'h', headers)
if hasBody then
  redis.call('HSET', key, 'b', body)
end
redis.call('PEXPIRE', key, ttlMs)
if rec[3] then
  redis.call('HDEL', key, 'w')
  redis.call('PUBLISH', channel, key)
end
return 1
`;
