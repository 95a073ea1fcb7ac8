-- Say how long a lane's answered requests take once dequeued, per operation,
-- for admission to add to the queue's wait (``admit.lua``).
--
-- KEYS[1]  the lane's admission hash: ds:admission:<lane queue>
-- ARGV     pairs of field and milliseconds: 'service:<operation>' and the p90,
--          'mean:<operation>' and the mean
--
-- Stamps 'service_at' with Redis's own clock, the one admit.lua compares it
-- with, so a worker's clock cannot make an estimate look fresher than it is.
-- Returns 1.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], 'service_at', now, unpack(ARGV))
return 1
