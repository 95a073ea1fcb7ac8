-- The broker's epoch ends when its Redis is another server.
--
-- A Sentinel's failover promotes a replica that carries ds:epoch, but not
-- what the old primary had not yet sent it: requests admitted there and lost
-- with it would leave their callers waiting for their deadlines. A process
-- that finds the Sentinels name a primary other than the one the epoch
-- belongs to ends the epoch here, once for every process that finds the same,
-- so that a caller waiting on a request admitted before is told it may be lost.
--
-- KEYS[1]     ds:epoch (admit.lua sets it where it is missing)
-- KEYS[2]     ds:epoch:server: the address of the primary the epoch belongs to
-- KEYS[3..]   the lanes' admission hashes, ds:admission:<lane queue>, whose
--             'epoch' field is admit.lua's copy of ds:epoch
-- ARGV[1]     the primary's address (host:port) as the Sentinels name it now
-- ARGV[2]     a new epoch token, used only if the epoch ends here
--
-- Returns 1 when it ended the epoch; 0 when the epoch is this primary's
-- already, or when no process had claimed it for a primary before (the
-- epoch is then this primary's own).
local owner = redis.call('GET', KEYS[2])
if owner == ARGV[1] then
  return 0
end
redis.call('SET', KEYS[2], ARGV[1])
if not owner then
  return 0
end
redis.call('SET', KEYS[1], ARGV[2])
for i = 3, #KEYS do
  redis.call('HDEL', KEYS[i], 'epoch')
end
return 1
