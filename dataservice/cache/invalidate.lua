-- Committed changes to records (one, or a batch's group): each record's cached
-- entries go, and a tombstone with the change's revision keeps any older fill
-- from landing afterwards.
--
-- KEYS     per record, ARGV[2] keys: dataservice.redis.keys.change_keys (cache/forget.lua)
-- ARGV[1]  how long a tombstone lives (ms)
-- ARGV[2]  keys per record
-- ARGV[3..] per record, in the order of KEYS, the lowest revision a fill may
--          still bring
--
-- Returns how many cached entries were deleted.
--#include cache/forget.lua

return forget(1, tonumber(ARGV[2]), 3, ARGV[1])
