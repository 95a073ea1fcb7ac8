-- An answer left for its caller and its request gone from the lane: shared by
-- answer.lua and hit.lua, not a script of its own (dataservice/redis/scripts.py
-- puts it where a script says `--#include broker/leave_answer.lua`), so that a
-- hit answered by the gate leaves exactly what a worker's answer leaves.
-- Needs limits/complete.lua, included before it.
--
-- leave_answer(a) reads no KEYS or ARGV itself: the including script binds
-- them to the fields of the table `a` (answer.lua's, then hit.lua's):
--   list       the answer's list: ds:result:<caller>:<request id>, or the reply
--              channel the request named, ds:reply:<caller>:<channel>
--              (KEYS[1]; KEYS[5])
--   body       the encoded ResponseEnvelope; '' when there is no answer to leave
--              (ARGV[1]; ARGV[9] with the cached entry spliced in)
--   ttl_ms     how long the answer is kept (ms, relative: the server's clock may
--              differ) (ARGV[2]; ARGV[10])
--   admission  the lane's admission hash: ds:admission:<lane queue>
--              (KEYS[2]; KEYS[6])
--   held       the lane's held requests: ds:admission:<lane queue>:held
--              (admit.lua) (KEYS[6]; KEYS[9])
--   member     the request's member in `held`: '<request id>:<bytes>', or
--              '<request id>:<operations>:<bytes>' for a batch (ARGV[6]; ARGV[13])
--   size       the envelope bytes admission counted for it (ARGV[3]; ARGV[11])
--   ops        the operations its message carried (ARGV[7]; 1)
--   inflight   the caller's in-flight set: ds:inflight:<caller> (KEYS[3]; KEYS[3])
--   slot       the request's member in `inflight`; nil when its slot is not in
--              Redis (ARGV[4], nil when ''; ARGV[5], nil when ARGV[4] is 0)
--   index      kombu's index of unacknowledged messages, a sorted set
--              (KEYS[4]; KEYS[7])
--   unacked    kombu's unacknowledged messages, a hash (KEYS[5]; KEYS[8]); both
--              are kombu's layout, which dataservice/compat/kombu.py owns
--   tag        the message's delivery tag there; '' when kombu acknowledges it
--              itself, or when its delivery was never recorded (ARGV[5]; ARGV[12])
--   now        the server's time (ms) if the including script read it (nil; hit.lua's)
--
-- Returns nothing.
local function leave_answer(a)
  if a.body ~= '' then
    -- A list this push created has no expiry; one that was there already
    -- (a reply channel's) keeps a longer one: its earlier answers may have
    -- later deadlines.
    if redis.call('RPUSH', a.list, a.body) == 1 then
      redis.call('PEXPIRE', a.list, a.ttl_ms)
    else
      redis.call('PEXPIRE', a.list, a.ttl_ms, 'GT')
    end
  end
  complete(a.admission, a.held, a.member, a.size, a.ops, a.now)
  if a.slot ~= nil then
    redis.call('ZREM', a.inflight, a.slot)
  end
  if a.tag ~= '' then
    redis.call('ZREM', a.index, a.tag)
    redis.call('HDEL', a.unacked, a.tag)
  end
end
