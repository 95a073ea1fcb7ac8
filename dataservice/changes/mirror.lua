-- The active consumer's fencing token, mirrored into a cell other than the
-- one that holds the lease, so that apply.lua there refuses a stale consumer
-- as it does where the lease lives. Tokens only rise: a consumer that lost
-- the lease cannot put its older token back over a newer one.
--
-- KEYS[1]  ds:changes:lease in that cell (only this script writes it there)
-- ARGV[1]  the token, as the lease's own cell gave it
-- ARGV[2]  how long the mirror lives (ms): changes.lease_ms, renewed with the lease
--
-- Returns 1 when mirrored, 0 when a newer token is there (this consumer is stale).
local held = tonumber(redis.call('GET', KEYS[1]) or '0')
if tonumber(ARGV[1]) < held then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
