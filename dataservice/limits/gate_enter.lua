-- One request's pass through its caller's limits (gate.lua's KEYS[1..3] and
-- ARGV[1..8], documented there), in steps, so that a script may decide
-- between them whether the request needs a slot at all (hit.lua: a hit is
-- answered in the same step, holds no slot and is not refused at the cap).
-- Needs gcra.lua.
--
-- gate_check(tat) checks the replay memory and the rate and writes only the
-- replay marker (a request id is remembered whatever the outcome). `tat`: the
-- rate's state (KEYS[2]) if the including script read it already (false:
-- none), else nil. Returns '' and the state the other steps need when
-- admitted, else a dataservice.refusals.Reason value and a retry-after (ms).
--
-- gate_cap(state, sweep) checks the in-flight cap, if the caller has one:
-- '' and 0, or 'concurrency_limited' and a retry-after. With `sweep`, lapsed
-- slots are removed first; without, they are only left out of the count.
--
-- gate_commit(state, slot) records the pass: the rate's new theoretical
-- arrival time and, with `slot` and a cap, the request's slot.

local function gate_check(tat)
  local t = redis.call('TIME')
  local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local now_ms = math.floor(now_us / 1000)

  -- The marker counts the deliveries seen. A copy the broker delivers again
  -- (its worker died before acknowledging it) passes, up to MAX_DELIVERIES in
  -- all: a worker killed again and again must not cost its requests their
  -- answers. Any other copy is a replay. ('r' was a redelivery's marker.)
  local MAX_DELIVERIES = 4
  if redis.call('SET', KEYS[1], '1', 'NX', 'PX', ARGV[1]) == false then
    local seen = redis.call('GET', KEYS[1])
    local deliveries = tonumber(seen) or (seen == 'r' and 2) or MAX_DELIVERIES
    if ARGV[8] ~= '1' or deliveries >= MAX_DELIVERIES then
      return 'replayed', 0
    end
    redis.call('SET', KEYS[1], deliveries + 1, 'KEEPTTL')
  end

  local new_tat, retry_ms = gcra_check(KEYS[2], now_us, tonumber(ARGV[2]), tonumber(ARGV[3]), tat)
  if not new_tat then
    return 'rate_limited', retry_ms
  end

  return '', {now_us = now_us, now_ms = now_ms, new_tat = new_tat, cap = tonumber(ARGV[4])}
end

local function gate_cap(state, sweep)
  if state.cap <= 0 then return '', 0 end
  -- Slots of requests whose worker died lapse on their own.
  local taken
  if sweep then
    redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', state.now_ms)
    taken = redis.call('ZCARD', KEYS[3])
  else
    taken = redis.call('ZCOUNT', KEYS[3], '(' .. state.now_ms, '+inf')
  end
  if taken >= state.cap then
    return 'concurrency_limited', tonumber(ARGV[7])
  end
  return '', 0
end

local function gate_commit(state, slot)
  if slot and state.cap > 0 then
    local lapse = tonumber(ARGV[6])
    redis.call('ZADD', KEYS[3], lapse, ARGV[5])
    if redis.call('PTTL', KEYS[3]) < lapse - state.now_ms then
      redis.call('PEXPIRE', KEYS[3], lapse - state.now_ms + 1000)
    end
  end
  gcra_commit(KEYS[2], state.new_tat, state.now_us)
end
