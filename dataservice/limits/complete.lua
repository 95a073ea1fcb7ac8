-- A request leaving its lane, as admission counts it: part of an answer's
-- leaving (broker/leave_answer.lua, in answer.lua and hit.lua), not a script of
-- its own (dataservice/redis/scripts.py puts it where a script says
-- `--#include limits/complete.lua`).
--
-- complete(admission, held, member, size, ops, now)
--   admission  the lane's admission hash: ds:admission:<lane queue> (admit.lua)
--   held       the lane's held requests: ds:admission:<lane queue>:held
--   member     the message's member there: '<request id>:<bytes>', or
--              '<request id>:<operations>:<bytes>' for a batch
--   size       the envelope bytes admission counted for it
--   ops        the operations it carried (1 but for a batch)
--   now        the server's time (ms) if the including script read it, else nil
local function complete(admission, held, member, size, ops, now)
  ops = tonumber(ops) or 1
  -- Its bytes go back only if it is still held: not if admission already let
  -- it lapse, nor if it was admitted by a Redis that has since restarted empty.
  -- Completions count operations either way: the drain rate is in operations
  -- per second.
  if redis.call('ZREM', held, member) == 0 then
    redis.call('HINCRBY', admission, 'done', ops)
    return
  end
  local h = redis.call('HMGET', admission, 'bytes', 'done', 'rate_at', 'extra_ops', 'held')
  local done = (tonumber(h[2]) or 0) + ops
  local fields = {'bytes', math.max((tonumber(h[1]) or 0) - tonumber(size), 0), 'done', done,
    'held', math.max((tonumber(h[5]) or 0) - 1, 0)}
  if ops > 1 then
    fields[#fields + 1] = 'extra_ops'
    fields[#fields + 1] = math.max((tonumber(h[4]) or 0) - (ops - 1), 0)
  end
  -- The first completion of a request admitted since the counts began opens
  -- admission's first measuring window (admit.lua): a worker took it from this
  -- Redis's queue, so the workers are there by now. Not just any completion:
  -- after a restart, the pool threads that held requests through it answer
  -- them as soon as Redis is back, while the consumers may still be waiting
  -- out their reconnect ladder, and a window opened then measured their
  -- absence as a slow lane and refused for it.
  if not h[3] then
    if now == nil then
      local t = redis.call('TIME')
      now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    end
    fields[#fields + 1] = 'rate_at'
    fields[#fields + 1] = now
    fields[#fields + 1] = 'done_at'
    fields[#fields + 1] = done
  end
  redis.call('HSET', admission, unpack(fields))
end
