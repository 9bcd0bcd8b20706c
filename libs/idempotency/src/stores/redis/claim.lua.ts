/**
 * Claim a key, or say what holds it: one round trip for first requests and duplicates alike.
 *
 * KEYS[1]  the record (a hash: s = state P|C, t = owner token, f = fingerprint,
 *          c = status code, h = headers JSON, b = body JSON text)
 * ARGV[1]  owner token of this attempt
 * ARGV[2]  request fingerprint ('' = do not compare)
 * ARGV[3]  lease in milliseconds: a processing record expires after it, so a crash frees the key
 * ARGV[4]  '1' when the caller waits for a processing record to settle: mark it (w = 1) so that
 *          complete and release publish its key
 *
 * Returns  {1}                         acquired
 *          {2, pttl}                   in progress (pttl: ms until the lease runs out)
 *          {3, status, headers, body}  completed (body false when the handler returned nothing)
 *          {4}                         key reused with another fingerprint
 */
export const CLAIM_LUA = `
local key = KEYS[1]
local token = ARGV[1]
local fingerprint = ARGV[2]
local leaseMs = ARGV[3]
local waiting = ARGV[4] == '1'
local rec = redis.call('HMGET', key, 's', 'f', 'c', 'h', 'b')
if not rec[1] then
  redis.call('HSET', key, 's', 'P', 't', token, 'f', fingerprint)
  redis.call('PEXPIRE', key, leaseMs)
  return {1}
end
if fingerprint ~= '' and rec[2] ~= '' and rec[2] ~= fingerprint then
  return {4}
end
if rec[1] == 'C' then
  return {3, rec[3], rec[4], rec[5]}
end
if waiting then
  redis.call('HSET', key, 'w', '1')
end
return {2, redis.call('PTTL', key)}
`;
