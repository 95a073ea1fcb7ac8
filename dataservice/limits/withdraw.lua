-- A message admit.lua admitted (its ARGV[17]: the queue on another broker)
-- that the broker then refused or never took: it leaves admission's books as
-- if it had not been admitted, and counts as refused.
--
-- KEYS[1]  the lane's admission hash (admit.lua's KEYS[2])
-- KEYS[2]  the lane's held requests (admit.lua's KEYS[3])
-- ARGV[1]  the message's member there (dataservice.limits.admission.held_member)
-- ARGV[2]  the envelope bytes admission counted for it
-- ARGV[3]  the operations it carries (1 but for a batch)
-- ARGV[4]  why: a dataservice.refusals.Reason value to count under
--          'refused:<reason>', or '' when the broker was not reached (no refusal)
--
-- Returns 1 if the message was still held (its bytes given back), else 0.
if redis.call('ZREM', KEYS[2], ARGV[1]) == 0 then
  return 0
end
local ops = tonumber(ARGV[3]) or 1
local h = redis.call('HMGET', KEYS[1], 'bytes', 'extra_ops', 'held')
redis.call('HSET', KEYS[1], 'bytes', math.max((tonumber(h[1]) or 0) - tonumber(ARGV[2]), 0),
  'held', math.max((tonumber(h[3]) or 0) - 1, 0))
if ops > 1 then
  redis.call('HSET', KEYS[1], 'extra_ops', math.max((tonumber(h[2]) or 0) - (ops - 1), 0))
end
redis.call('HINCRBY', KEYS[1], 'admitted', -ops)
if ARGV[4] ~= '' then
  redis.call('HINCRBY', KEYS[1], 'refused:' .. ARGV[4], 1)
end
return 1
