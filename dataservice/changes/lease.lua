-- The change consumer's lease: take it, or keep it.
--
-- KEYS[1]  the lease: ds:changes:lease (the holder's fencing token)
-- KEYS[2]  the fencing-token counter: ds:changes:fence
-- ARGV[1]  the lease's length (ms)
-- ARGV[2]  the caller's token, or '' to take a free lease
--
-- Returns the token held: a new one when the lease was free, the caller's
-- when it still held it (renewed), or 0 when someone else holds it.

if ARGV[2] ~= '' then
  if redis.call('GET', KEYS[1]) == ARGV[2] then
    redis.call('PEXPIRE', KEYS[1], ARGV[1])
    return tonumber(ARGV[2])
  end
  return 0
end
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
local token = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], token, 'PX', ARGV[1])
return token
