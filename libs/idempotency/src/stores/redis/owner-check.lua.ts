/**
 * The fencing check shared by complete, release and renew: returns from the script unless the
 * record at KEYS[1] is a processing claim (`P`, or `W` when a waiter marked it) owned by the token
 * whose prefix (`["<token>",`) is ARGV[1]. Leaves `rec` and `state` set for the rest of the script.
 * `completedByOwner` is what it returns for a record this owner completed: 1 for a completion
 * (its own save, sent again: ioredis re-sends a command whose reply a dropped connection lost, and
 * the guard retries a save that timed out), 0 for the others.
 */
export const ownerCheckLua = (completedByOwner: 0 | 1): string => `
local key = KEYS[1]
local prefix = ARGV[1]
local rec = redis.call('GET', key)
if not rec then
  return 0
end
local state = string.sub(rec, 1, 1)
if string.sub(rec, 2, #prefix + 1) ~= prefix then
  return 0
end
if state == 'C' then
  return ${completedByOwner}
end
if state ~= 'P' and state ~= 'W' then
  return 0
end
`;
