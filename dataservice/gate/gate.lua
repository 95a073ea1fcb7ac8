-- One request's pass through its caller's limits, in one atomic step.
--
-- KEYS[1]  the replay marker: ds:replay:<caller>:<request id>
-- KEYS[2]  the caller's rate state: ds:rate:<caller> (GCRA theoretical arrival time, µs)
-- KEYS[3]  the caller's interactive requests in flight: ds:inflight:<caller>
--          (a sorted set: request id -> when its slot lapses, Unix ms)
-- ARGV[1]  how long to remember the request id (ms): until its deadline plus the skew
-- ARGV[2]  the caller's emission interval (µs per request: 1e6 / rate)
-- ARGV[3]  the caller's burst (requests)
-- ARGV[4]  the caller's in-flight cap; 0 when the lane has none (batch)
-- ARGV[5]  the request id
-- ARGV[6]  when this request's slot lapses if never released (Unix ms)
-- ARGV[7]  the retry-after to suggest when the in-flight cap is reached (ms)
--
-- Returns {0, 0} when admitted (and, with a cap, holding a slot), or
-- {reason, retry_after_ms}: 1 replayed, 2 over the rate, 3 at the in-flight cap.
-- A request id is remembered whatever the outcome: each attempt uses a new one.

local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now_ms = math.floor(now_us / 1000)

if redis.call('SET', KEYS[1], '1', 'NX', 'PX', ARGV[1]) == false then
  return {1, 0}
end

-- GCRA: each request moves the theoretical arrival time one interval on; a
-- request may run at most `burst` intervals ahead of it.
local interval = tonumber(ARGV[2])
local burst = tonumber(ARGV[3])
local tat = tonumber(redis.call('GET', KEYS[2]) or '0')
if tat < now_us then
  tat = now_us
end
local new_tat = tat + interval
local allow_at = new_tat - burst * interval
if allow_at > now_us then
  return {2, math.ceil((allow_at - now_us) / 1000)}
end

local cap = tonumber(ARGV[4])
if cap > 0 then
  -- Slots of requests whose worker died lapse on their own.
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now_ms)
  if redis.call('ZCARD', KEYS[3]) >= cap then
    return {3, tonumber(ARGV[7])}
  end
  local lapse = tonumber(ARGV[6])
  redis.call('ZADD', KEYS[3], lapse, ARGV[5])
  if redis.call('PTTL', KEYS[3]) < lapse - now_ms then
    redis.call('PEXPIRE', KEYS[3], lapse - now_ms + 1000)
  end
end

redis.call('SET', KEYS[2], new_tat, 'PX', math.ceil((new_tat - now_us) / 1000) + 1000)
return {0, 0}
