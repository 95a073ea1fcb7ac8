-- A cached read answered in one step: the caller's limits, then the cache
-- entry, then (on a hit) the answer, the request gone from its lane and its
-- message acknowledged. Used when the limits, the cache, the answers and the
-- broker share one Redis and the read format is v2 (protobuf), whose entry
-- is the Record's own encoding.
--
-- KEYS[1..3], ARGV[1..8]  as gate.lua
-- KEYS[4]  the cached record: record:v2:<scope>:<id>#<gen>, '<revision>:<Record>'
-- KEYS[5]  the answer's list: ds:result:<caller>:<request id>, or the reply channel
--          the request named, ds:reply:<caller>:<channel>
-- KEYS[6]  the lane's admission hash: ds:admission:<lane queue>
-- KEYS[7]  kombu's index of unacknowledged messages (unused without ARGV[12])
-- KEYS[8]  kombu's unacknowledged messages (unused without ARGV[12]); both are
--          kombu's layout, which dataservice/compat/kombu.py owns: their names
--          and ARGV[14]'s record come from there
-- ARGV[9]  the encoded ResponseEnvelope without its result: request_id and an OK status
-- ARGV[10] how long the answer is kept (ms); a list that already lives longer keeps
--          its expiry
-- ARGV[11] the request's envelope bytes, given back to the lane's admission
-- ARGV[12] the message's delivery tag; '' when kombu acknowledges it itself
-- KEYS[9]  the lane's held requests: ds:admission:<lane queue>:held (admit.lua)
-- ARGV[13] the request's member there: '<request id>:<bytes>'
-- ARGV[14] (optional) on a miss, the message as kombu keeps it, and ARGV[15]
--          when it was delivered (Unix s): its delivery is recorded in KEYS[7]
--          and KEYS[8] under ARGV[12] (limits/delivered.lua), so that it may
--          be delivered again should the worker that goes on with it die
-- ARGV[16] (optional, with ARGV[14]) '1' when nothing recorded the delivery
--          yet (kombu's record waits for this decision): a hit then has no
--          acknowledgement to remove
--
-- A hit holds no slot of the caller's cap and is not refused at it: it is
-- answered in this step, and takes none of the workers' time that the cap
-- shares out. A miss is checked against the cap and takes its slot.
-- Returns {reason, retry_after_ms} as gate.lua when refused, {'', 0, 'hit'}
-- when answered, {'', 0, 'miss'} when admitted without an entry (the
-- request goes on to the database, holding its slot).
--#include limits/gcra.lua
--#include limits/gate_enter.lua
--#include limits/complete.lua
--#include broker/leave_answer.lua
--#include limits/delivered.lua

-- The rate's state and the entry in one read: the entry is looked at only
-- once the request is admitted.
local looked = redis.call('MGET', KEYS[2], KEYS[4])
local reason, state = gate_check(looked[1])
if reason ~= '' then
  return {reason, state}
end
local entry = looked[2]
local colon = entry and string.find(entry, ':', 1, true)
if not colon then
  local capped, retry_ms = gate_cap(state, false)
  if capped ~= '' then
    return {capped, retry_ms}
  end
  gate_commit(state, true)
  if #ARGV >= 15 and ARGV[12] ~= '' then
    record_delivery(KEYS[7], KEYS[8], ARGV[12], ARGV[14], ARGV[15])
  end
  return {'', 0, 'miss'}
end
gate_commit(state, false)

-- A protobuf length prefix.
local function varint(n)
  local out = {}
  while n >= 128 do
    out[#out + 1] = string.char(n % 128 + 128)
    n = math.floor(n / 128)
  end
  out[#out + 1] = string.char(n)
  return table.concat(out)
end

local record = string.sub(entry, colon + 1)
-- ReadRecordResponse.record is field 1 and ResponseEnvelope.read field 10,
-- both length-delimited: tags 0x0A and 0x52.
local read = '\10' .. varint(#record) .. record
leave_answer{
  list = KEYS[5], body = ARGV[9] .. '\82' .. varint(#read) .. read, ttl_ms = ARGV[10],
  admission = KEYS[6], held = KEYS[9], member = ARGV[13], size = ARGV[11], ops = 1,
  inflight = KEYS[3], slot = nil, now = state.now_ms,
  index = KEYS[7], unacked = KEYS[8], tag = ARGV[16] == '1' and '' or ARGV[12],
}
return {'', 0, 'hit'}
