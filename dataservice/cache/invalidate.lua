-- A committed change to a record: its cached entries go, and a tombstone with
-- the change's revision keeps any older fill from landing afterwards.
--
-- KEYS[1]  the record's tombstone: record:tomb:<scope>:<id>
-- KEYS[2]  the leader's word to followers: ds:filled:<scope>:<id> (it may carry the old record)
-- KEYS[3..] the cached record in every format and live generation
-- ARGV[1]  the lowest revision a fill may still bring: a write's new revision,
--          a delete's deleted revision plus one
-- ARGV[2]  how long the tombstone lives (ms): cache.ttl_s, the longest a fill
--          can arrive after its read began and still land
--
-- Returns how many cached entries were deleted. A tombstone never goes back:
-- an older change replayed after a newer one leaves the newer revision.

local revision = tonumber(ARGV[1])
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
if revision > current then
  redis.call('SET', KEYS[1], revision, 'PX', ARGV[2])
else
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
redis.call('DEL', KEYS[2])
local deleted = 0
for i = 3, #KEYS do
  deleted = deleted + redis.call('DEL', KEYS[i])
end
return deleted
