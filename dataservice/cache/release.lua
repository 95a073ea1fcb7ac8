-- A leader gives up its lock without a fill, and tells its followers why.
--
-- KEYS[1]  the key's coalescing lock: ds:lock:<scope>:<id>
-- KEYS[2]  how many replicas wait for the leader: ds:lockwait:<scope>:<id>
-- KEYS[3]  the leader's word to them: ds:filled:<scope>:<id>
-- KEYS[4]  the shared record of a read that does not use the cache: ds:shared:<scope>:<id>
-- ARGV[1]  the leader's fencing token
-- ARGV[2]  the word: 'absent' (no such record) or 'retry' (the read failed)
-- ARGV[3]  how long KEYS[4] keeps an 'absent' word (ms); 0: not shared
-- ARGV[4]  when the database read ended, by the leader's clock (Unix ms)
--
-- Returns 1 if the lock was still this leader's, else 0 (its lease lapsed and
-- another leader may hold it: nothing is touched).
--#include cache/share.lua

if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
local waiting = tonumber(redis.call('GET', KEYS[2]) or '0')
redis.call('DEL', KEYS[2])
for _ = 1, waiting do
  redis.call('RPUSH', KEYS[3], ARGV[1] .. '|' .. ARGV[2])
end
if waiting > 0 then
  redis.call('PEXPIRE', KEYS[3], 2000)
end
if ARGV[2] == 'absent' then
  share(KEYS[4], ARGV[4], 'absent', ARGV[3])
end
return 1
