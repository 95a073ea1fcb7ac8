-- Committed changes forgotten by the cache: shared by cache/invalidate.lua (a
-- worker's own group of writes) and changes/apply.lua (a binlog transaction),
-- not a script of its own (dataservice/redis/scripts.py puts it where a
-- script says `--#include cache/forget.lua`).
--
-- forget(first, per, floors, ttl)
--   first   the index in KEYS of the first record's keys; each record has
--           `per` keys, in the order dataservice.redis.keys.change_keys builds them:
--             its tombstone: record:tomb:<scope>:<id>
--             the leader's word to followers: ds:filled:<scope>:<id> (it may
--             carry the old record)
--             its cached entries in every format and live generation
--   floors  the index in ARGV of the first record's floor: the lowest revision
--           a fill may still bring (a write's new revision, a delete's deleted
--           revision plus one); one per record, in the order of KEYS
--   ttl     how long a tombstone lives (ms): cache.ttl_s, the longest a fill can
--           arrive after its read began and still land
--   returns how many cached entries were deleted
--
-- A tombstone never goes back: an older change replayed after a newer one
-- leaves the newer floor.
local function forget(first, per, floors, ttl)
  local deleted = 0
  local record = 0
  for base = first, #KEYS, per do
    local floor = tonumber(ARGV[floors + record])
    record = record + 1
    local current = tonumber(redis.call('GET', KEYS[base]) or '0')
    if floor > current then
      redis.call('SET', KEYS[base], floor, 'PX', ttl)
    else
      redis.call('PEXPIRE', KEYS[base], ttl)
    end
    redis.call('DEL', KEYS[base + 1])
    deleted = deleted + redis.call('DEL', unpack(KEYS, base + 2, base + per - 1))
  end
  return deleted
end
