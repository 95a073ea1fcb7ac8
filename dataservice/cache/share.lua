-- A leader's record shared while the cache is not read: shared by fill.lua and
-- release.lua, not a script of its own (dataservice/redis/scripts.py puts it
-- where a script says `--#include cache/share.lua`).
--
-- share(key, ended_ms, word, share_ms)
--   key       ds:shared:<scope>:<id>
--   ended_ms  when the leader's database read ended (Unix ms)
--   word      the record, framed '<revision>:<body>', or 'absent'
--   share_ms  how long it is kept (ms); 0 or '': nothing is shared
-- A request sent before ended_ms overlapped the read, and takes the word as
-- its answer (lookup.lua). A later read's word is never replaced by an
-- earlier one's.
local function share(key, ended_ms, word, share_ms)
  if tonumber(share_ms) == nil or tonumber(share_ms) <= 0 then
    return
  end
  local current = redis.call('GET', key)
  local sep = current and string.find(current, '|', 1, true)
  if sep and tonumber(string.sub(current, 1, sep - 1)) >= tonumber(ended_ms) then
    return
  end
  redis.call('SET', key, ended_ms .. '|' .. word, 'PX', share_ms)
end
