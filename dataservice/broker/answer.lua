-- An answer left for its caller, and its request gone from the lane, in one step.
--
-- KEYS[1]  the answer's list: ds:result:<caller>:<request id>, or the reply channel
--          the request named, ds:reply:<caller>:<channel> (unused without an answer)
-- KEYS[2]  the lane's admission hash: ds:admission:<lane queue>
-- KEYS[3]  the caller's in-flight set: ds:inflight:<caller> (unused without ARGV[4])
-- KEYS[4]  kombu's index of unacknowledged messages, a sorted set (unused without ARGV[5])
-- KEYS[5]  kombu's unacknowledged messages, a hash (unused without ARGV[5]); both
--          are kombu's layout, which dataservice/compat/kombu.py owns (their names
--          come from there)
-- ARGV[1]  the encoded ResponseEnvelope; '' when there is no answer to leave
-- ARGV[2]  how long the answer is kept (ms, relative: the server's clock may differ);
--          a list that already lives longer (a channel's) keeps its expiry
-- ARGV[3]  the request's envelope bytes, given back to the lane's admission
-- ARGV[4]  the request's member in KEYS[3]; '' when its slot is not in Redis
-- ARGV[5]  the message's delivery tag; '' when kombu acknowledges it itself
-- KEYS[6]  the lane's held requests: ds:admission:<lane queue>:held (admit.lua)
-- ARGV[6]  the request's member there: '<request id>:<bytes>' (a batch's:
--          '<request id>:<operations>:<bytes>')
-- ARGV[7]  the operations the message carried (1 but for a batch)
--
-- Returns 1.
--#include limits/complete.lua

if ARGV[1] ~= '' then
  redis.call('RPUSH', KEYS[1], ARGV[1])
  if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
  end
end
complete(KEYS[2], KEYS[6], ARGV[6], ARGV[3], ARGV[7])
if ARGV[4] ~= '' then
  redis.call('ZREM', KEYS[3], ARGV[4])
end
if ARGV[5] ~= '' then
  redis.call('ZREM', KEYS[4], ARGV[5])
  redis.call('HDEL', KEYS[5], ARGV[5])
end
return 1
