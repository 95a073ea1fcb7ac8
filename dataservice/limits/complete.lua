-- A request leaving its lane, as admission counts it: part of an answer's
-- leaving (broker/leave_answer.lua, in answer.lua and hit.lua), not a script of
-- its own (dataservice/redis/scripts.py puts it where a script says
-- `--#include limits/complete.lua`).
--
-- complete(admission, held, member, size, ops)
--   admission  the lane's admission hash: ds:admission:<lane queue> (admit.lua)
--   held       the lane's held requests: ds:admission:<lane queue>:held
--   member     the message's member there: '<request id>:<bytes>', or
--              '<request id>:<operations>:<bytes>' for a batch
--   size       the envelope bytes admission counted for it
--   ops        the operations it carried (1 but for a batch)
local function complete(admission, held, member, size, ops)
  ops = tonumber(ops) or 1
  -- Its bytes go back only if it is still held: not if admission already let
  -- it lapse, nor if it was admitted by a Redis that has since restarted empty.
  local held_here = redis.call('ZREM', held, member) == 1
  if held_here then
    local bytes = (tonumber(redis.call('HGET', admission, 'bytes')) or 0) - tonumber(size)
    redis.call('HSET', admission, 'bytes', math.max(bytes, 0))
    if ops > 1 then
      local extra = (tonumber(redis.call('HGET', admission, 'extra_ops')) or 0) - (ops - 1)
      redis.call('HSET', admission, 'extra_ops', math.max(extra, 0))
    end
  end
  -- Completions count operations: the drain rate is in operations per second.
  local done = redis.call('HINCRBY', admission, 'done', ops)
  -- The first completion of a request admitted since the counts began opens
  -- admission's first measuring window (admit.lua): a worker took it from this
  -- Redis's queue, so the workers are there by now. Not just any completion:
  -- after a restart, the pool threads that held requests through it answer
  -- them as soon as Redis is back, while the consumers may still be waiting
  -- out their reconnect ladder, and a window opened then measured their
  -- absence as a slow lane and refused for it.
  if held_here and redis.call('HEXISTS', admission, 'rate_at') == 0 then
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    redis.call('HSET', admission, 'rate_at', now, 'done_at', done)
  end
end
