-- One binlog transaction's invalidations, applied only by the active consumer.
--
-- KEYS[1]  the consumer's lease: ds:changes:lease (holds the active consumer's fencing token)
-- KEYS[2..] per changed record, ARGV[3] keys: its tombstone (record:tomb:<scope>:<id>),
--          its leader's word (ds:filled:<scope>:<id>), then its cached entries in
--          every format and live generation (record:<fmt>:<scope>:<id>#<gen>)
-- ARGV[1]  the consumer's fencing token
-- ARGV[2]  how long a tombstone lives (ms): cache.ttl_s
-- ARGV[3]  keys per record
-- ARGV[4..] per record, the lowest revision a fill may still bring
--
-- Returns -1 when the token is not the lease's (a stale consumer: nothing is
-- touched), else how many cached entries were deleted. A tombstone never goes
-- back: replaying an older change after a newer one keeps the newer floor.

if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return -1
end
local per = tonumber(ARGV[3])
local ttl = ARGV[2]
local deleted = 0
local record = 0
for base = 2, #KEYS, per do
  record = record + 1
  local floor = tonumber(ARGV[3 + record])
  local current = tonumber(redis.call('GET', KEYS[base]) or '0')
  if floor > current then
    redis.call('SET', KEYS[base], floor, 'PX', ttl)
  else
    redis.call('PEXPIRE', KEYS[base], ttl)
  end
  redis.call('DEL', KEYS[base + 1])
  for i = base + 2, base + per - 1 do
    deleted = deleted + redis.call('DEL', KEYS[i])
  end
end
return deleted
