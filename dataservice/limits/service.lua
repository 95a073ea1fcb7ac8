-- Say how long a lane's answered requests take once dequeued, per operation,
-- for admission to add to the queue's wait (``admit.lua``).
--
-- KEYS[1]  the lane's admission hash: ds:admission:<lane queue>
-- KEYS[2]  the lane's held requests: ds:admission:<lane queue>:held (admit.lua)
-- ARGV[1]  the expiry admit.lua gives both (its ARGV[7], ms)
-- ARGV[2..] pairs of field and milliseconds: 'service:<operation>' and the p90,
--          'mean:<operation>' and the mean
--
-- Stamps 'service_at' with Redis's own clock, the one admit.lua compares it
-- with, so a worker's clock cannot make an estimate look fresher than it is.
-- A held set a publish created since admit.lua last renewed the expiries has
-- none yet (admit.lua renews them a quarter-period at a time): it gets one
-- here, every second the lane answers, so that a request lost on the way in a
-- lane that then goes quiet is not held for ever.
-- Returns 1.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], 'service_at', now, unpack(ARGV, 2))
redis.call('PEXPIRE', KEYS[2], ARGV[1], 'NX')
return 1
