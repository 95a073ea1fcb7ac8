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
-- KEYS[4]  (optional) a cached record to read once the request is admitted:
--          record:<fmt>:<scope>:<id>#<gen> (dataservice/cache), so that a cache
--          hit costs one round trip, and the cache is read only after the limits
-- (optional, all together) a delivery to record once the request is admitted
-- (limits/delivered.lua), when the broker is this Redis: the message then
-- needs no round trip of its own to be delivered again should its worker die
-- (kombu's layout, which dataservice/compat/kombu.py owns: the keys and the
-- record come from there):
-- KEYS[#KEYS - 1]  kombu's index of unacknowledged messages
-- KEYS[#KEYS]      kombu's unacknowledged messages
-- ARGV[9]  the message's delivery tag
-- ARGV[10] the message as kombu keeps it
-- ARGV[11] when it was delivered (Unix s)
--
-- Returns {'', 0} when admitted (and, with a cap, holding a slot; with KEYS[4],
-- {'', 0, entry or false}; a delivery is then recorded), or
-- {reason, retry_after_ms} with a dataservice.refusals.Reason value:
-- 'replayed', 'rate_limited' or 'concurrency_limited'.
-- A request id is remembered whatever the outcome: each attempt uses a new one.
-- A message the broker delivers again (its worker died before acknowledging
-- it) passes again, up to four deliveries in all: the marker counts them
-- ('1', '2', ...); a fifth delivery, or any copy not marked redelivered, is refused.
--#include limits/gcra.lua
--#include limits/gate_enter.lua
--#include limits/delivered.lua

local reason, state = gate_check(nil)
if reason ~= '' then
  return {reason, state}
end
local capped, retry_ms = gate_cap(state, true)
if capped ~= '' then
  return {capped, retry_ms}
end
gate_commit(state, true)
local recorded = #ARGV >= 11
if recorded then
  record_delivery(KEYS[#KEYS - 1], KEYS[#KEYS], ARGV[9], ARGV[10], ARGV[11])
end
if KEYS[4] and (#KEYS == 4 or #KEYS == 6) then
  return {'', 0, redis.call('GET', KEYS[4])}
end
return {'', 0}
