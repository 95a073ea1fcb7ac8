-- One binlog transaction's invalidations, applied only by the active consumer.
--
-- KEYS[1]  the consumer's lease: ds:changes:lease (holds the active consumer's fencing token)
-- KEYS[2..] per changed record, ARGV[3] keys: dataservice.redis.keys.change_keys (cache/forget.lua)
-- ARGV[1]  the consumer's fencing token
-- ARGV[2]  how long a tombstone lives (ms): cache.ttl_s
-- ARGV[3]  keys per record
-- ARGV[4..] per record, the lowest revision a fill may still bring
--
-- Returns -1 when the token is not the lease's (a stale consumer: nothing is
-- touched), else how many cached entries were deleted.
--#include cache/forget.lua

if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return -1
end
return forget(2, tonumber(ARGV[3]), 4, ARGV[2])
