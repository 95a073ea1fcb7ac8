-- A message's delivery, recorded as kombu records it when it hands a message
-- to a worker (its Redis transport's QoS.append): shared by gate.lua and
-- hit.lua, not a script of its own (dataservice/redis/scripts.py puts it
-- where a script says `--#include limits/delivered.lua`). The layout is
-- kombu's, which dataservice/compat/kombu.py owns: the keys' names
-- (unacked_keys) and the record (unacked_record) come from there.
--
-- record_delivery(index, unacked, tag, record, score)
--   index    kombu's index of unacknowledged messages: a sorted set, tag -> score
--   unacked  kombu's unacknowledged messages: a hash, tag -> record
--   tag      the message's delivery tag
--   record   the message as kombu keeps it: JSON [message, exchange, routing key]
--   score    when it was delivered (Unix s): kombu's restore sweep gives a message
--            back to the queue once this is older than the visibility timeout
-- A worker that dies before it answers thus leaves the message to be
-- delivered again, exactly as if kombu had written this itself; the answer's
-- script (answer.lua) removes both entries with the acknowledgement.
local function record_delivery(index, unacked, tag, record, score)
  redis.call('ZADD', index, score, tag)
  redis.call('HSET', unacked, tag, record)
end
