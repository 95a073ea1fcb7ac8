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
-- ARGV[8]  '1' when the broker marked the message as delivered again, else '0'
--
-- Returns {'', 0} when admitted (and, with a cap, holding a slot), or
-- {reason, retry_after_ms} with a dataservice.refusals.Reason value:
-- 'replayed', 'rate_limited' or 'concurrency_limited'.
-- A request id is remembered whatever the outcome: each attempt uses a new one.
-- A message the broker delivers again (its worker died before acknowledging
-- it) passes once more: the marker goes from '1' to 'r', and a third delivery,
-- or a replay of a redelivery, is refused.
--#include gcra.lua

local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now_ms = math.floor(now_us / 1000)

if redis.call('SET', KEYS[1], '1', 'NX', 'PX', ARGV[1]) == false then
  if ARGV[8] ~= '1' or redis.call('GET', KEYS[1]) ~= '1' then
    return {'replayed', 0}
  end
  redis.call('SET', KEYS[1], 'r', 'KEEPTTL')
end

local new_tat, retry_ms = gcra_check(KEYS[2], now_us, tonumber(ARGV[2]), tonumber(ARGV[3]))
if not new_tat then
  return {'rate_limited', retry_ms}
end

local cap = tonumber(ARGV[4])
if cap > 0 then
  -- Slots of requests whose worker died lapse on their own.
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now_ms)
  if redis.call('ZCARD', KEYS[3]) >= cap then
    return {'concurrency_limited', tonumber(ARGV[7])}
  end
  local lapse = tonumber(ARGV[6])
  redis.call('ZADD', KEYS[3], lapse, ARGV[5])
  if redis.call('PTTL', KEYS[3]) < lapse - now_ms then
    redis.call('PEXPIRE', KEYS[3], lapse - now_ms + 1000)
  end
end

gcra_commit(KEYS[2], new_tat, now_us)
return {'', 0}
