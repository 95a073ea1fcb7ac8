-- A cache miss's next step, decided in one atomic step: the entry after all,
-- the lead (this replica reads the database and fills), or a follower's place.
-- A read that does not use the cache (bypassed, the freshness guard engaged,
-- outside the rollout's percentage) is coalesced the same way, without the
-- look at the entry.
--
-- KEYS[1]  the cached record in the format and generation read: record:<fmt>:<scope>:<id>#<gen>
--          (unused without ARGV[2])
-- KEYS[2]  the key's coalescing lock: ds:lock:<scope>:<id> (holds the leader's fencing token)
-- KEYS[3]  how many replicas wait for the leader: ds:lockwait:<scope>:<id>
-- KEYS[4]  the leader's word to them: ds:filled:<scope>:<id>
-- KEYS[5]  the fencing-token counter: ds:cache:fence
-- KEYS[6]  a leader's shared record while the cache is not read:
--          ds:shared:<scope>:<id>, '<when its read ended, ms>|<word>' (fill.lua)
-- ARGV[1]  the lease a new leader gets (ms)
-- ARGV[2]  '1': look at the entry first; '': the cache is not read
-- ARGV[3]  when the request was sent (Unix ms): a shared record whose read
--          ended no earlier is its answer too (the read and the request
--          overlapped); '': none is taken
--
-- Returns {'hit', entry}, {'shared', word}, {'lead', token, redis_now_ms} or
-- {'follow', token, lease_left_ms}. A follower is counted in KEYS[3], so the
-- leader pushes one word for it.

if ARGV[2] == '1' then
  local entry = redis.call('GET', KEYS[1])
  if entry then
    return {'hit', entry}
  end
end

if ARGV[3] ~= '' then
  local shared = redis.call('GET', KEYS[6])
  local sep = shared and string.find(shared, '|', 1, true)
  if sep and tonumber(string.sub(shared, 1, sep - 1)) >= tonumber(ARGV[3]) then
    return {'shared', string.sub(shared, sep + 1)}
  end
end

local holder = redis.call('GET', KEYS[2])
if holder then
  local left = redis.call('PTTL', KEYS[2])
  redis.call('INCR', KEYS[3])
  if redis.call('PTTL', KEYS[3]) < left then
    redis.call('PEXPIRE', KEYS[3], left + 1000)
  end
  return {'follow', holder, left}
end

local token = redis.call('INCR', KEYS[5])
redis.call('SET', KEYS[2], token, 'PX', ARGV[1])
-- Words left for followers of an earlier leader, or waiters counted for it,
-- belong to that leader, not to this one.
redis.call('DEL', KEYS[3], KEYS[4])
local t = redis.call('TIME')
return {'lead', token, tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)}
