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
 *
 * Returns  1 saved, 0 refused (lease ran out, or another claim holds the key)
 */
export const COMPLETE_LUA = `
local key = KEYS[1]
local token = ARGV[1]
local rec = redis.call('HMGET', key, 's', 't')
if rec[1] ~= 'P' or rec[2] ~= token then
  return 0
end
redis.call('HSET', key, 's', 'C', 'c', ARGV[2], 'h', ARGV[3])
if ARGV[5] == '1' then
  redis.call('HSET', key, 'b', ARGV[4])
end
redis.call('PEXPIRE', key, ARGV[6])
return 1
`;
