#!lua name=dataservice_v2
-- The publish interface of the access.v2 protocol on Redis (docs/protocol.md,
-- "Publishing on Redis"): a caller in any language publishes one request with
--
--   FCALL ds_publish_v2 0 <lane> <request id> <caller> <deadline> <operation> <ops> <request in base64> [<pacing>]
--
-- and never builds the broker's message itself: the message kombu's Redis
-- transport stores is built here, and admission (limits/admit.lua) checks and
-- pushes it in the same atomic step. Loaded by the workers at start
-- (dataservice/broker/library.py), with the lanes' bounds and the callers'
-- rates they read from queues.yml, which they keep in this Redis database:
--
--   ds:conf          a hash: 'lane:<lane>' for each lane, its queue and
--                    bounds as tab-separated fields (LANE_FIELDS below), and
--                    'version'
--   ds:conf:pacing   a hash: each caller's '<interval µs>\t<burst>\t<lease>',
--                    read once per configuration (RATES below)
--
-- Keys: none declared; the function reaches the lane's queue, its admission
-- hash and held set, the broker's epoch and the caller's pacing key, as
-- admit.lua documents them, and reads the two hashes above.
--
-- ARGV[1] lane: 'interactive' or 'batch'
-- ARGV[2] request id: the envelope's request_id (the task id), [A-Za-z0-9_-]{1,64}
-- ARGV[3] caller: the envelope's caller, [a-z0-9][a-z0-9_.-]{0,63}, whose rate
--         paces the publish ('': none; advisory, the workers go by the
--         signed envelope)
-- ARGV[4] deadline: the envelope's deadline_unix_ms (Unix ms, this Redis's clock
--         tells what is left)
-- ARGV[5] operation: read, write, delete, list, batch or read_many, whose
--         measured service time admission adds to the queue's wait ('': unknown)
-- ARGV[6] ops: the operations the envelope carries (1, or a batch's or
--         read_many's count), at most the lane's max_ops_per_message
-- ARGV[7] request: the SignedRequest bytes in base64 (RFC 4648, padded), as the
--         message keeps the task's body. The caller encodes them: Redis's Lua
--         has no base64, and encoding them here cost Redis 45 µs per 300-byte
--         request, a third of the whole publish (bench/results/publish-call.md)
-- ARGV[8] pacing (optional, default 0): 0 holds the request to its caller's rate;
--         n > 0 also takes up to n more requests' worth of the rate's burst for
--         the publisher's next publishes (a lease: dataservice/limits/pacing.py);
--         -1 skips the caller's rate (the publisher spends a lease it took)
--
-- Returns admit.lua's answer: {'', epoch, leased} when the request was queued
-- (the broker's epoch it joined, which the caller keeps to tell a lost request
-- from a slow one; the requests' worth leased), or {reason, retry_after_ms}
-- when refused (queue_full, queue_bytes, queue_too_long, rate_limited).
-- Bad arguments are an error reply 'ERR dataservice: ...', and a database no
-- worker has configured 'ERR dataservice: not configured ...': nothing changes.

local function admit(KEYS, ARGV)
--#include limits/admit.lua
end

-- Keys and figures of dataservice/redis/keys.py and dataservice/limits/admission.py
-- (a test keeps them equal).
local EPOCH_KEY = 'ds:epoch'
local PACE_PREFIX = 'ds:pace:'
local SERVICE_STALE_MS = 5000
local STANDING_AFTER_MS = 100
-- The fields of a lane's entry in ds:conf, in order. 'pacing' is a digest of
-- ds:conf:pacing: the workers write the two together.
local LANE_FIELDS = {'queue', 'max_messages', 'max_bytes', 'default_deadline_ms',
  'books_expiry_ms', 'target_wait_ms', 'stats_key', 'held_key', 'max_ops', 'pacing'}
-- How many digests' rates are kept: a server's databases each have their own
-- configuration, and a configuration written again has a digest of its own.
local MAX_DIGESTS = 16
local OPERATIONS = {read = true, write = true, delete = true, list = true}
local MESSAGE_OPERATIONS = {read = true, write = true, delete = true, list = true,
  batch = true, read_many = true}

-- Each lane's entry of ds:conf as last read, into its fields: the library's
-- state lasts from one call to the next (until it is loaded again), and
-- admit.lua checks it against the one the lane's books were kept under (the
-- admission hash's `conf` field), so ds:conf is read only when they differ:
-- after the workers wrote it again, in another database of this server, or
-- for a lane's first request.
local LANES = {}
-- Each caller's rate found in ds:conf:pacing, by the digest of the lane entry
-- it was read under, kept once admission confirmed that entry (so, that
-- digest) is the database's: RATES[digest][caller] = {interval, burst}. Only
-- configured callers are kept; a caller without a rate is looked up each time.
local RATES, DIGESTS = {}, 0

local function read_lane(lane_name)
  local entry = redis.call('HGET', 'ds:conf', 'lane:' .. lane_name)
  if not entry then
    if redis.call('EXISTS', 'ds:conf') == 0 then
      return nil, 'not configured: no worker has started on this Redis database'
    end
    return nil, 'unknown lane'
  end
  local lane = {entry = entry}
  for field in string.gmatch(entry, '[^\t]+') do lane[#lane + 1] = field end
  -- An entry without the digest (workers of the version before it, during a
  -- rolling upgrade) serves as well: its callers' rates are read every time.
  if #lane ~= #LANE_FIELDS and #lane ~= #LANE_FIELDS - 1 then
    return nil, 'ds:conf holds a lane of another version'
  end
  LANES[lane_name] = lane
  return lane
end

local function fail(what)
  return redis.error_reply('ERR dataservice: ' .. what)
end

local function whole(text)
  if type(text) ~= 'string' or not string.match(text, '^%-?%d+$') or #text > 16 then
    return nil
  end
  return tonumber(text)
end

-- The message as kombu's Redis transport stores it, Celery's task protocol 2
-- (dataservice/broker/message.py builds the same in Python; a test keeps the
-- two equal). Every string placed here was checked against a pattern that
-- needs no JSON escaping.
local function message(lane, request_id, caller, deadline, operation, ops, body, size, tag)
  local argsrepr = '<RequestEnvelope ' .. size .. ' bytes>'
  local ds = '"ds_deadline_ms":' .. deadline
  if caller ~= '' then ds = ds .. ',"ds_caller":"' .. caller .. '"' end
  if operation ~= '' then ds = ds .. ',"ds_op":"' .. operation .. '"' end
  if ops > 1 then ds = ds .. ',"ds_ops":' .. ops end
  local origin = 'dataservice'
  if caller ~= '' then origin = caller .. '@dataservice' end
  return '{"body":"' .. body .. '","content-encoding":"binary",'
      .. '"content-type":"application/x-protobuf","headers":{"lang":"py",'
      .. '"task":"dataservice.handle","id":"' .. request_id .. '","shadow":null,'
      .. '"eta":null,"expires":null,"group":null,"group_index":null,"retries":0,'
      .. '"timelimit":[null,null],"root_id":"' .. request_id .. '","parent_id":null,'
      .. '"argsrepr":"' .. argsrepr .. '","kwargsrepr":"{}","origin":"' .. origin
      .. '","ignore_result":true,"replaced_task_nesting":0,'
      .. '"stamped_headers":null,"stamps":{},' .. ds .. ',"ds_size":' .. size .. '},'
      .. '"properties":{"correlation_id":"' .. request_id .. '","reply_to":"",'
      .. '"argsrepr":"' .. argsrepr .. '","kwargsrepr":"{}","delivery_mode":2,'
      .. '"delivery_info":{"exchange":"","routing_key":"' .. lane[1] .. '"},'
      .. '"priority":0,"body_encoding":"base64","delivery_tag":"' .. tag .. '"}}'
end

-- A caller's rate for a message of `ops` operations, as a sender paces it
-- (dataservice/config/rate.py, Rate.paced).
local function paced(interval, burst, ops)
  if ops <= 1 then return interval, burst end
  return interval * ops, 1 + (burst - math.min(ops, burst)) / ops
end

local function publish(keys, args)
  if #args < 7 or #args > 8 then
    return fail('ds_publish_v2 takes 7 or 8 arguments, not ' .. #args)
  end
  local lane_name, request_id, caller, operation, body =
    args[1], args[2], args[3], args[5], args[7]
  local deadline, ops, pacing = whole(args[4]), whole(args[6]), whole(args[8] or '0')
  if #request_id > 64 or not string.match(request_id, '^[A-Za-z0-9_-]+$') then
    return fail('the request id must match [A-Za-z0-9_-]{1,64}')
  end
  if caller ~= '' and (#caller > 64 or not string.match(caller, '^[a-z0-9][a-z0-9_.-]*$')) then
    return fail('the caller must match [a-z0-9][a-z0-9_.-]{0,63}')
  end
  if not deadline or deadline <= 0 then
    return fail('the deadline must be a positive number of Unix ms')
  end
  if operation ~= '' and not MESSAGE_OPERATIONS[operation] then
    return fail('unknown operation')
  end
  if not ops or ops < 1 then
    return fail('ops must be a whole number, at least 1')
  end
  if not pacing or pacing < -1 then
    return fail('pacing must be -1, 0 or a number of requests')
  end
  -- Base64 of at least one byte: groups of four, padded at the end only. A
  -- scan of every character costs more than the rest of the publish (25 ns
  -- each), so the whole is searched only for what would break the message's
  -- JSON, and the first group in full: raw bytes given by mistake fail there.
  local padding = string.find(body, '=', 1, true)
  if #body == 0 or #body % 4 ~= 0 or string.find(string.sub(body, 1, 4), '[^A-Za-z0-9+/=]')
      or string.find(body, '"', 1, true) or string.find(body, '\\', 1, true)
      or (padding and padding < #body - 1) then
    return fail('the request must be base64 (RFC 4648, padded) of at least one byte')
  end
  local size = #body / 4 * 3
  if string.sub(body, -2) == '==' then size = size - 2
  elseif string.sub(body, -1) == '=' then size = size - 1 end
  local lane, verified = LANES[lane_name], '0'
  if not lane then
    local failed
    lane, failed = read_lane(lane_name)
    if not lane then return fail(failed) end
    verified = '1'
  end
  if ops > tonumber(lane[9]) then
    return fail('ops is more than the lane takes in one message')
  end

  local t = redis.call('TIME')
  local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local stamp = t[1] .. string.format('%06d', tonumber(t[2]))
  local paced_by = pacing >= 0 and caller ~= ''
  local service = ''
  local mean = ''
  if OPERATIONS[operation] then
    service = 'service:' .. operation
    mean = 'mean:' .. operation
  end
  local function admitted_to(lane, verified)
    local rate, read = nil, false
    if paced_by then
      local rates = lane[10] and RATES[lane[10]]
      rate = rates and rates[caller]
      if not rate then
        local text = redis.call('HGET', 'ds:conf:pacing', caller)
        if text then
          local i, b = string.match(text, '^(%d+)\t([%d.]+)')
          rate, read = {tonumber(i), tonumber(b)}, true
        end
      end
    end
    local interval, burst, pace_key = 0, 0, nil
    if rate then
      interval, burst = paced(rate[1], rate[2], ops)
      pace_key = PACE_PREFIX .. caller
    end
    local answer = admit({lane[1], lane[7], lane[8], EPOCH_KEY, pace_key}, {
      message(lane, request_id, caller, deadline, operation, ops, body, size,
        request_id .. '.' .. stamp),
      size, lane[2], lane[3], deadline - now_ms, lane[4], lane[5], service,
      SERVICE_STALE_MS, lane[6], STANDING_AFTER_MS, 'e' .. stamp .. request_id, request_id,
      interval, burst, ops, '', mean, pace_key and math.max(pacing, 0) or 0,
      t[1], t[2], lane.entry, verified,
    })
    if read and lane[10] and answer[1] ~= 'conf' then
      -- Admission went by this entry, so its digest is this database's.
      if not RATES[lane[10]] then
        if DIGESTS >= MAX_DIGESTS then RATES, DIGESTS = {}, 0 end
        RATES[lane[10]], DIGESTS = {}, DIGESTS + 1
      end
      RATES[lane[10]][caller] = rate
    end
    return answer
  end
  local answer = admitted_to(lane, verified)
  if answer[1] == 'conf' then
    -- The lane's books were kept under another entry: read ds:conf again.
    local failed
    lane, failed = read_lane(lane_name)
    if not lane then return fail(failed) end
    answer = admitted_to(lane, '1')
  end
  return answer
end

redis.register_function('ds_publish_v2', publish)
