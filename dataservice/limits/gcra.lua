-- The rate algorithm (GCRA), shared by gate.lua and admit.lua: not a script of
-- its own. dataservice/redis/scripts.py puts it where a script says
-- `--#include limits/gcra.lua`. The same arithmetic in Python: dataservice/limits/gcra.py.
--
-- gcra_check(key, now_us, interval_us, burst, value)
--   key          a string key holding the theoretical arrival time (TAT, µs), or nothing
--   value        what the including script already read of `key` (false: nothing
--                there), or nil to have it read here
--   returns      new_tat, 0 when a request may pass now; nil, retry_after_ms otherwise.
--                Nothing is written: gcra_commit records the new TAT once every
--                other check has passed.
-- gcra_commit(key, new_tat, now_us)
--   writes the TAT, expiring once it lies a second in the past (an idle caller's
--   key goes away; a missing key means "no debt").

local function gcra_check(key, now_us, interval, burst, value)
  if value == nil then value = redis.call('GET', key) end
  local tat = tonumber(value or '0')
  if tat < now_us then
    tat = now_us
  end
  local allow_at = tat + interval - burst * interval
  if allow_at > now_us then
    return nil, math.max(1, math.ceil((allow_at - now_us) / 1000))
  end
  return tat + interval, 0
end

local function gcra_commit(key, new_tat, now_us)
  redis.call('SET', key, new_tat, 'PX', math.ceil((new_tat - now_us) / 1000) + 1000)
end
