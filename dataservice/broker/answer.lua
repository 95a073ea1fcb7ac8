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
--#include broker/leave_answer.lua

leave_answer{
  list = KEYS[1], body = ARGV[1], ttl_ms = ARGV[2],
  admission = KEYS[2], held = KEYS[6], member = ARGV[6], size = ARGV[3], ops = ARGV[7],
  inflight = KEYS[3], slot = ARGV[4] ~= '' and ARGV[4] or nil,
  index = KEYS[4], unacked = KEYS[5], tag = ARGV[5],
}
return 1
