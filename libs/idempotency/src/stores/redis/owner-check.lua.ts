/**
 * The fencing check shared by complete and release: returns 0 from the script unless the record
 * at KEYS[1] is a processing claim (`P`, or `W` when a waiter marked it) owned by the token
 * whose prefix (`["<token>",`) is ARGV[1]. Leaves `state` set for the rest of the script.
 */
export const OWNER_CHECK_LUA = `
local key = KEYS[1]
local prefix = ARGV[1]
local rec = redis.call('GET', key)
if not rec then
  return 0
end
local state = string.sub(rec, 1, 1)
if (state ~= 'P' and state ~= 'W') or string.sub(rec, 2, #prefix + 1) ~= prefix then
  return 0
end
`;
