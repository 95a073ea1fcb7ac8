-- A leader's fill: every enabled format at once, or none, then its followers told.
--
-- KEYS[1]  the record's tombstone: record:tomb:<scope>:<id> (the lowest revision a
--          fill may bring since the last change)
-- KEYS[2]  the key's coalescing lock: ds:lock:<scope>:<id>
-- KEYS[3]  how many replicas wait for the leader: ds:lockwait:<scope>:<id>
-- KEYS[4]  the leader's word to them: ds:filled:<scope>:<id>
-- KEYS[5]  the shared record of a read that does not use the cache: ds:shared:<scope>:<id>
-- KEYS[6..] the cached record in each format filled (same generation)
-- ARGV[1]  the leader's fencing token ('' when the fill comes from no lock)
-- ARGV[2]  the record's revision
-- ARGV[3]  when the database read began, by this server's clock (Unix ms)
-- ARGV[4]  how long an entry lives from then (ms)
-- ARGV[5]  the word for the followers when the fill is fresh (the record)
-- ARGV[6]  how long KEYS[5] keeps the word (ms); 0: not shared (the cache is read)
-- ARGV[7]  when the database read ended, by the leader's clock (Unix ms)
-- ARGV[8..] the entries, one per KEYS[6..], each '<revision>:<body>'
--
-- Returns {outcome, formats written}: 'filled' (every format written, or kept
-- where a newer revision already was), 'late' (the read began too long ago:
-- nothing written), 'stale' (a change left a newer revision: nothing written).
-- A stale or late leader's followers are told 'retry', not given the record,
-- and nothing is shared.
--#include cache/share.lua

local revision = tonumber(ARGV[2])
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local left = tonumber(ARGV[3]) + tonumber(ARGV[4]) - now_ms

local outcome = 'filled'
local written = 0
local tomb = tonumber(redis.call('GET', KEYS[1]) or '0')
if left <= 0 then
  outcome = 'late'
elseif tomb > revision then
  outcome = 'stale'
else
  for i = 6, #KEYS do
    local current = redis.call('GET', KEYS[i])
    local current_revision = current and tonumber(string.match(current, '^(%d+):'))
    if not current_revision or current_revision <= revision then
      redis.call('SET', KEYS[i], ARGV[i + 2], 'PX', left)
      written = written + 1
    end
  end
  share(KEYS[5], ARGV[7], ARGV[5], ARGV[6])
end

if ARGV[1] ~= '' and redis.call('GET', KEYS[2]) == ARGV[1] then
  redis.call('DEL', KEYS[2])
  local waiting = tonumber(redis.call('GET', KEYS[3]) or '0')
  redis.call('DEL', KEYS[3])
  if waiting > 0 then
    local word = ARGV[1] .. '|retry'
    if outcome == 'filled' then
      word = ARGV[1] .. '|' .. ARGV[5]
    end
    for _ = 1, waiting do
      redis.call('RPUSH', KEYS[4], word)
    end
    -- Words nobody takes (a follower whose own deadline came first) go soon.
    redis.call('PEXPIRE', KEYS[4], 2000)
  end
end
return {outcome, written}
