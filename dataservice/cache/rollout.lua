-- One change to the cache's rollout controls, and its audit entry, in one atomic step.
--
-- KEYS[1]  the controls: ds:cache:rollout, a hash:
--            fill           formats filled, comma-separated ('v1,v2'; '' for none)
--            read           the format read ('v1', 'v2'; '' for none)
--            percent        of ALLOW_CACHED reads that look in the cache
--            bypass         '1': no cache reads, no fills; '0': the values above apply
--            shadow         of ALLOW_CACHED hits also compared with the database
--            generation     the namespace generation (from 1)
--            rotated_at_ms  when it last changed (server time, Unix ms; '0': never)
--          a field it lacks takes its default (ARGV[4..7], else bypass '0',
--          generation '1', rotated_at_ms '0')
-- KEYS[2]  the audit stream: ds:cache:audit
-- KEYS[3]  the shadow comparisons' counts: ds:cache:shadow, deleted when
--          shadow changes (the counts are those of the current setting)
-- ARGV[1]  who made the change (the operator's OS user)
-- ARGV[2]  the action: 'change' (sets the fields ARGV[7..] name) or 'rotate'
--          (the next generation: every entry of the current one becomes unreachable)
-- ARGV[3]  the audit entries to keep (approximately: XADD MAXLEN ~)
-- ARGV[4]  fill's default (queues.yml, cache.rollout)
-- ARGV[5]  read's default
-- ARGV[6]  percent's default
-- ARGV[7]  shadow's default
-- ARGV[8..] with 'change': field, value, field, value ... among fill, read, percent,
--          bypass and shadow, each already checked (dataservice/cache/controls.py)
--
-- Writes every field, so Redis then holds the whole state, and appends to the
-- stream: who, action, at_ms (server time), before.<field> and after.<field>
-- for each field, and before.source.
-- Returns {before, after}: each a flat list field, value, ... of the fields
-- above and 'source': 'redis' when the hash existed, 'defaults' when it did not.

local FIELDS = {'fill', 'read', 'percent', 'bypass', 'shadow', 'generation', 'rotated_at_ms'}
local SETTABLE = {fill = true, read = true, percent = true, bypass = true, shadow = true}

local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local before = {
  fill = ARGV[4], read = ARGV[5], percent = ARGV[6], shadow = ARGV[7],
  bypass = '0', generation = '1', rotated_at_ms = '0',
}
local stored = redis.call('HMGET', KEYS[1], unpack(FIELDS))
local source = 'defaults'
for i, field in ipairs(FIELDS) do
  if stored[i] then
    before[field] = stored[i]
    source = 'redis'
  end
end

local after = {}
for _, field in ipairs(FIELDS) do
  after[field] = before[field]
end
if ARGV[2] == 'rotate' then
  after.generation = string.format('%d', tonumber(before.generation) + 1)
  after.rotated_at_ms = string.format('%d', now_ms)
elseif ARGV[2] == 'change' then
  for i = 8, #ARGV, 2 do
    if not SETTABLE[ARGV[i]] then
      return redis.error_reply('not a rollout control: ' .. ARGV[i])
    end
    after[ARGV[i]] = ARGV[i + 1]
  end
else
  return redis.error_reply('not a rollout action: ' .. ARGV[2])
end

local written, entry = {}, {'who', ARGV[1], 'action', ARGV[2], 'at_ms', string.format('%d', now_ms)}
local before_out, after_out = {}, {}
for _, field in ipairs(FIELDS) do
  table.insert(written, field)
  table.insert(written, after[field])
  table.insert(entry, 'before.' .. field)
  table.insert(entry, before[field])
  table.insert(entry, 'after.' .. field)
  table.insert(entry, after[field])
  table.insert(before_out, field)
  table.insert(before_out, before[field])
  table.insert(after_out, field)
  table.insert(after_out, after[field])
end
table.insert(entry, 'before.source')
table.insert(entry, source)
table.insert(before_out, 'source')
table.insert(before_out, source)
table.insert(after_out, 'source')
table.insert(after_out, 'redis')

redis.call('HSET', KEYS[1], unpack(written))
if after.shadow ~= before.shadow then
  redis.call('DEL', KEYS[3])
end
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[3], '*', unpack(entry))
return {before_out, after_out}
