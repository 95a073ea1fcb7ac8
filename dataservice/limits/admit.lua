-- Admit one message to a lane's queue, or refuse it, in one atomic step.
-- The queue's list and its entries are kombu's layout, which
-- dataservice/compat/kombu.py owns: KEYS[1] and ARGV[1] come from there.
--
-- KEYS[1]  the lane's queue: the Redis list Celery's messages wait in
-- KEYS[2]  the lane's admission hash:
--            bytes    envelope bytes of the held requests (KEYS[3])
--            done     completed requests (workers add on completion)
--            admitted requests pushed (this script)
--            rate     completions per second while the queue was busy, raised to
--                     what a quieter window drained (a floor)
--            rate_at  when the current measuring window began (server time, ms); the
--                     first opens at the first completion of a request admitted
--                     since the counts began (complete.lua), once the workers
--                     take from this Redis's queue: a window opened
--                     by a publish while they were still connecting (a start, a
--                     Redis that restarted empty) measured them as slow
--            busy_at  when a window last measured the lane busy (a queue in the list);
--                     until one has, `rate` is only a floor and refuses nothing
--            done_at  `done` when the current window began
--            offered  every publish this script has seen, admitted or refused
--            arrivals publishes counted with exponential decay (time constant
--                     ARRIVAL_TAU_MS), as of arrivals_at (server time, ms): divided
--                     by the time constant, the rate publishes arrive at lately
--            refused:<reason>  publishes refused for that reason (the workers' metrics read them)
--            service:<operation>  how long an answered request of that operation took
--                     once dequeued (ms, p90, the workers' service.lua)
--            mean:<operation>  the same, its mean: how many the workers hold at once
--            service_at  when the workers last said so (server time, ms)
--            empty_at  when a publish last found nothing waiting (server time, ms)
--            shedding  1 from a refusal for the target wait until the queue is
--                     back within three quarters of it (or empty)
--            extra_ops the operations of held batch messages beyond one per
--                     message: queue lengths and counts are in operations
--            epoch    the broker's epoch (KEYS[4]) as this script last read it: the
--                     two go together (a Redis that restarted empty has neither),
--                     so the key is read only when the hash does not say
--            kept_at  when this script last renewed the expiry of the hash and
--                     of KEYS[3] (server time, ms): renewed once a quarter of
--                     ARGV[7] has passed, so an idle lane starts afresh after
--                     between three quarters of ARGV[7] and all of it (a held
--                     set created since gets one from service.lua)
--            lapse_at no held request lapses before then (server time, ms): the
--                     lowest score this script gave or found in KEYS[3]. Until
--                     then no lapsed one is looked for; a request done since only
--                     makes the next look find nothing
--            held     how many requests KEYS[3] holds: this script adds its push
--                     and takes off what lapsed, a completion (complete.lua) or a
--                     withdrawal (withdraw.lua) takes off what it removes. Counted
--                     again from KEYS[3] at every look for lapsed ones and when
--                     the hash is new, so a count that drifted (the set lost
--                     apart from the hash) holds until the next look at most
-- ARGV[1]  the message, as kombu stores it in the list (compat/kombu.py's queue_entry)
-- ARGV[2]  the request envelope's size in bytes
-- ARGV[3]  the most messages that may wait in the queue
-- ARGV[4]  the most envelope bytes that may be queued or in flight
-- ARGV[5]  the request's remaining time (ms, measured by the caller)
-- ARGV[6]  the longest retry-after worth suggesting (ms)
-- ARGV[7]  expiry of the admission hash (ms): a lane idle that long starts afresh
-- ARGV[8]  the hash field of the request's operation's service time
--          ('service:read', ...); '' when the operation is not known
-- ARGV[9]  how old a service time may be (ms) before it is not relied on
-- ARGV[10] the queue's target wait (ms; 0: none): once something has waited
--          for longer than ARGV[11] (a standing queue, not one burst) while more
--          arrives than the lane drains (an overload), a request is admitted only
--          if its expected wait in the queue is within it; once one is refused
--          for it, none is admitted until the expected wait is back within three
--          quarters of it or the overload is over
-- ARGV[11] how long a queue must have stood before the target applies (ms)
-- KEYS[3]  the lane's held requests: '<request id>:<bytes>' for each request
--          admitted and not yet done (queued, prefetched by a worker or
--          running), scored by its deadline plus HELD_GRACE_MS (server time,
--          ms; on another broker HELD_GRACE_ELSEWHERE_MS). A worker removes
--          its request when done (and gives its bytes back only then); this script drops those past their score, so a
--          request lost on the way (taken off the list by a connection that
--          never delivered it) stops counting by itself, and a completion a
--          restarted Redis never admitted removes nothing and gives nothing back
-- KEYS[4]  the broker's epoch, ds:epoch: a token this Redis holds from the first
--          request it admitted; one that restarted empty holds another
-- ARGV[12] the token to set when KEYS[4] holds none (a new random one)
-- ARGV[13] the request's id
-- KEYS[5]  optional: the caller's publish pacing (GCRA theoretical arrival time, µs),
--          ds:pace:<caller>, a key of the caller's own
-- ARGV[14] with KEYS[5]: the caller's emission interval (µs per request: 1e6 / rate),
--          times the message's operations (Rate.paced, dataservice/config/rate.py); else 0
-- ARGV[15] with KEYS[5]: the burst Rate.paced gives the message; else 0
-- ARGV[16] the operations the message carries: 1, or a batch's count. Every
--          count here (the bound of ARGV[3], the drain rate, arrivals) is in
--          operations, so the lane's bounds mean the same however they are packed
-- ARGV[17] '1' when the queue is not a list here but on another broker
--          (RabbitMQ): KEYS[1] and KEYS[4] are not touched, nothing is pushed
--          (the caller publishes once admitted); the bounds count every held
--          request, and what waits is those held less those in the workers' hands;
--          '' otherwise
-- ARGV[18] the hash field of the operation's mean service time ('mean:read', ...);
--          '' when the operation is not known (the p90 stands in for it)
-- ARGV[19] with KEYS[5]: how many more requests' worth the caller's pacing may
--          take for the publishing process's next messages, as far as the rate
--          and burst allow now (a lease: dataservice/limits/pacing.py); else 0
--
-- ARGV[20], ARGV[21] optional: the server's time (TIME's seconds and microseconds)
--          as the caller read it in the same step (broker/publish.lua); else read here
-- ARGV[22] optional: the lane's entry in ds:conf the caller took KEYS[1..3] and the
--          bounds from (broker/publish.lua, which keeps it between calls). Unless
--          the admission hash's `conf` field holds the same, nothing is done and
--          {'conf'} is returned: the caller reads ds:conf and calls again with
-- ARGV[23] '1': the entry was read from ds:conf in the same step; it is recorded
--          in the hash's `conf` field (dataservice/broker/library.py clears that
--          field when it writes ds:conf, so a change is seen)
-- Returns {'', epoch, leased} when the message was pushed (ARGV[17]: {'', '', leased},
-- admitted) (the epoch it was pushed in, which its caller keeps to tell a lost
-- request from a slow one; the requests' worth the pacing took beyond this
-- one, for ARGV[19]), or
-- {reason, retry_after_ms} with a
-- dataservice.refusals.Reason value: 'queue_full' (messages), 'queue_bytes',
-- 'queue_too_long' (the queue ahead of it and its own service time would take
-- longer than its deadline, or the standing queue is past its target wait) or
-- 'rate_limited' (the caller is over its rate:
-- the workers would refuse it).
--#include limits/gcra.lua

-- Every field this script changes is written once, at its end (finish).
local changed = {}
local function put(field, value)
  changed[#changed + 1] = field
  changed[#changed + 1] = value
end

local elsewhere = ARGV[17] == '1'
local depth = 0
if not elsewhere then depth = redis.call('LLEN', KEYS[1]) end
local service_field = ARGV[8] ~= '' and ARGV[8] or 'service:'
local mean_field = (ARGV[18] or '') ~= '' and ARGV[18] or 'mean:'
local h = redis.call('HMGET', KEYS[2], 'bytes', 'done', 'rate', 'rate_at', 'done_at',
  'service_at', service_field, 'empty_at', 'shedding', 'busy_at', 'arrivals', 'arrivals_at',
  'extra_ops', mean_field, 'offered', 'admitted', 'epoch', 'kept_at', 'lapse_at', 'held', 'conf')
-- The lane's configuration the caller took the keys and bounds from (ARGV[22]):
-- unless it is the one these books were kept under, or the caller has just read
-- it from ds:conf (ARGV[23]), nothing is done and the caller reads it again.
if ARGV[22] and h[21] ~= ARGV[22] then
  if ARGV[23] ~= '1' then return {'conf'} end
  put('conf', ARGV[22])
end
-- Workers only subtract; a negative balance (a completion counted twice after
-- a redelivery) must not become room beyond the bound.
local bytes = math.max(tonumber(h[1]) or 0, 0)
local done = tonumber(h[2]) or 0
local rate = tonumber(h[3]) or 0
local rate_at = tonumber(h[4])
local done_at = tonumber(h[5]) or 0
local size = tonumber(ARGV[2])
local remaining = tonumber(ARGV[5])
local cap = tonumber(ARGV[6])
local ops = tonumber(ARGV[16]) or 1
local extra = math.max(tonumber(h[13]) or 0, 0)
local t = ARGV[20] and {ARGV[20], ARGV[21]} or redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local expiry = tonumber(ARGV[7])
local kept_at = tonumber(h[18])
local lapse_at = tonumber(h[19])

-- Written at every return: the changed fields, then the expiries when due (a
-- hash this script just created has none yet). Returns whether it renewed them.
local function finish()
  local renew = kept_at == nil or now - kept_at >= expiry / 4
  if renew then put('kept_at', now) end
  if #changed > 0 then redis.call('HSET', KEYS[2], unpack(changed)) end
  if renew then
    redis.call('PEXPIRE', KEYS[2], expiry)
    redis.call('PEXPIRE', KEYS[3], expiry)
  end
  return renew
end

-- Past its deadline and the grace, a held request was lost on the way (a
-- worker past its deadline has long given it back): it stops counting. On
-- another broker (RabbitMQ) a message expires at its deadline, unseen by any
-- worker, and nothing gives it back: a short grace, for a worker finishing one
-- it took just before.
local HELD_GRACE_MS = 5000
local HELD_GRACE_ELSEWHERE_MS = 250
local held_count = math.max(tonumber(h[20]) or 0, 0)
local look = kept_at == nil or (lapse_at ~= nil and now >= lapse_at)
    or (lapse_at == nil and held_count > 0)
if look then
  held_count = redis.call('ZCARD', KEYS[3])
  put('held', held_count)
end
if look and held_count > 0 then
  local lapsed = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0, 100)
  if #lapsed > 0 then
    for _, member in ipairs(lapsed) do
      bytes = bytes - (tonumber(string.match(member, ':(%d+)$')) or 0)
      -- A batch's member is '<id>:<operations>:<bytes>'.
      extra = extra - ((tonumber(string.match(member, ':(%d+):%d+$')) or 1) - 1)
    end
    bytes = math.max(bytes, 0)
    extra = math.max(extra, 0)
    redis.call('ZREM', KEYS[3], unpack(lapsed))
    held_count = held_count - #lapsed
    put('held', held_count)
    put('bytes', bytes)
    put('extra_ops', extra)
  end
  -- The next to lapse; more than a hundred lapsed: look again next time.
  lapse_at = nil
  if #lapsed < 100 then
    local first = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
    if first[2] then lapse_at = tonumber(first[2]) end
  else
    lapse_at = now
  end
  put('lapse_at', lapse_at or '')
end

-- In operations: each message in the list counts one, and a held batch its
-- further operations too (while in a worker's hands as well: a little more
-- than waits, never less).
local held = held_count + extra
depth = depth + extra
-- On another broker, all that is known of the queue is what was admitted and
-- not yet answered: the count and byte bounds take it all as queued.
if elsewhere then depth = held end
-- Relied on only while the workers keep saying it: no workers, no estimate.
-- `service` (p90) is the request's own time once dequeued; `mean` says how
-- many the workers hold (below).
local service, mean = 0, 0
if now - (tonumber(h[6]) or 0) <= tonumber(ARGV[9]) then
  service = tonumber(h[7]) or 0
  mean = tonumber(h[14]) or service
end
local target = tonumber(ARGV[10])
-- Two measuring windows.
local BUSY_RECENT_MS = 2000
-- Arrivals this much above the drain rate are an overload (a little above
-- what a steady count at the capacity reads: its bias and jitter).
local OVERLOAD = 1.1
-- What waits is more than the list: each worker prefetches as many messages as
-- it has threads. Ahead of a new request are the lane's admitted requests not
-- yet done, less those the workers have in hand (the drain rate times the mean
-- time once dequeued, by Little's law). In hand is more than running: a lane
-- with more threads than permits (batch) holds messages that wait in the
-- worker for a permit. Their wait is in the time once dequeued, which the
-- p90 adds for the request itself below; taking the p90 for the count too
-- would count the lane's slowest as all of them, and what waits as less
-- than it is (on another broker, by all the p90 adds: no margin left). A
-- count that drifted (a message purged, never done) is held to what the
-- workers can hold besides the list: as many again as they have in hand.
-- On another broker no list is seen: what waits is what is held less what
-- is in hand. `queued`: something waits beyond that (the list is not empty;
-- on another broker, more is held than in hand: a rate measured short reads
-- as fewer in hand, so more waiting, and the window then measures the drain).
local in_hand = 0
if rate > 0 and mean > 0 then in_hand = rate * mean / 1000 end
local waiting, queued
if elsewhere then
  waiting = math.max(held - in_hand, 0)
  queued = waiting >= 1
else
  local ahead = math.min(math.max(depth, held), depth + 2 * in_hand + 1)
  waiting = math.max(depth, ahead - in_hand)
  queued = depth > 0
end
-- The rate says what the lane can drain only once a window measured it busy
-- (the target below wants that lately); a burst into a lane idle since may
-- queue up to its deadline at the rate it was measured busy, if ever.
local busy_at = tonumber(h[10]) or 0
local empty_at = tonumber(h[8])
local shedding = h[9] == '1'
if waiting < 1 or empty_at == nil then
  empty_at = now
  put('empty_at', now)
  if shedding then
    shedding = false
    put('shedding', '0')
  end
end

-- Decayed over half a second: a step in the load shows within a tenth of
-- that, and the count of a steady one varies little.
local ARRIVAL_TAU_MS = 500
local arrivals_at = tonumber(h[12]) or now
local decay = math.exp(-math.max(now - arrivals_at, 0) / ARRIVAL_TAU_MS)
local arrivals = (tonumber(h[11]) or 0) * decay + ops
local arriving = arrivals * 1000 / ARRIVAL_TAU_MS
put('arrivals', tostring(arrivals))
put('arrivals_at', now)
put('offered', (tonumber(h[15]) or 0) + ops)
if rate_at ~= nil and now - rate_at >= 1000 then
  -- A busy window (a queue in the list) measures what the lane can drain. A
  -- window with less to do drained what it was given: a floor, never a
  -- ceiling, so it only raises the estimate (after a stall had brought it
  -- down, nothing else would: the list stays empty while the workers keep up).
  local measured = (done - done_at) * 1000 / (now - rate_at)
  if queued then
    if rate > 0 then rate = (rate + measured) / 2 else rate = measured end
    if rate < 0.01 then rate = 0 end
    busy_at = now
    put('busy_at', now)
  elseif measured > rate then
    rate = measured
  end
  put('rate', tostring(rate))
  put('rate_at', now)
  put('done_at', done)
end

local function refuse(reason, retry_after_ms)
  finish()
  redis.call('HINCRBY', KEYS[2], 'refused:' .. reason, 1)
  return {reason, retry_after_ms}
end

-- How long until the queue drains by `n` messages at the measured rate.
local function drain_ms(n)
  if rate <= 0 then return 100 end
  return math.min(cap, math.max(10, math.ceil(n * 1000 / rate)))
end

if remaining <= 0 then
  return refuse('queue_too_long', 10)
end
if depth + ops > tonumber(ARGV[3]) then
  return refuse('queue_full', drain_ms(depth + ops - tonumber(ARGV[3])))
end
if bytes + size > tonumber(ARGV[4]) then
  return refuse('queue_bytes', drain_ms(ops))
end
-- Only a queue that was measured draining says how long it takes; an empty
-- one lets the request start at once (the workers refuse one that cannot run).
-- A lane never measured busy knows only a floor: what it was given, not what
-- it can drain. A burst of cache hits into a lane that had served a few slow
-- reads a second would be refused against a figure a hundred times too low;
-- the count and byte bounds hold it until a busy window measures the lane.
if rate > 0 and busy_at > 0 and waiting >= 1 then
  local wait = waiting * 1000 / rate
  if wait + service > remaining then
    return refuse('queue_too_long', math.min(cap, math.max(10, math.ceil(wait + service - remaining))))
  end
  -- A queue that stands (not one burst draining) under an overload only adds
  -- waiting to every request behind it: past its target, what joins it is
  -- refused at once, retryably, and the queue stays short enough that
  -- estimates hold. Shedding goes on until the wait is back within three
  -- quarters of the target (an overload that ends leaves the queue with room;
  -- not less: a client's throttle reads a spell of refusing everything as the
  -- service refusing most of what it is sent), or until no more arrives than
  -- the lane drains: at its capacity, the queue an overload left neither grows
  -- nor drains, and holding it to the target would refuse its every peak for
  -- as long as that load lasts. The deadline check above still bounds it.
  local overloaded = arriving > OVERLOAD * rate
  if not overloaded and shedding then
    shedding = false
    put('shedding', '0')
  end
  if overloaded and target > 0 and now - empty_at > tonumber(ARGV[11])
      and now - busy_at <= BUSY_RECENT_MS then
    local resume = target * 3 / 4
    if wait > target or (shedding and wait > resume) then
      if not shedding then put('shedding', '1') end
      return refuse('queue_too_long', math.min(cap, math.max(10, math.ceil(wait - resume))))
    end
    if shedding then put('shedding', '0') end
  end
end

-- The caller's rate, as the workers' gate will apply it: a request it would
-- refuse is not queued. The gate stays the authority (a caller can reset its
-- own pacing key); this only keeps a well-behaved caller's excess off the queue.
local leased = 0
if KEYS[5] then
  local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local interval, burst = tonumber(ARGV[14]), tonumber(ARGV[15])
  local new_tat, retry_ms = gcra_check(KEYS[5], now_us, interval, burst)
  if not new_tat then
    return refuse('rate_limited', retry_ms)
  end
  -- The lease: each request more moves the TAT an interval on, as long as
  -- the burst would have let that many pass at once.
  local want = tonumber(ARGV[19]) or 0
  if want > 0 then
    leased = math.max(0, math.min(want, math.floor((now_us + burst * interval - new_tat) / interval)))
    new_tat = new_tat + leased * interval
  end
  gcra_commit(KEYS[5], new_tat, now_us)
end

local epoch = ''
if not elsewhere then
  epoch = h[17]
  if not epoch then
    epoch = redis.call('GET', KEYS[4])
    if not epoch then
      epoch = ARGV[12]
      redis.call('SET', KEYS[4], epoch)
    end
    put('epoch', epoch)
  end
  redis.call('LPUSH', KEYS[1], ARGV[1])
end
local member = ARGV[13] .. ':' .. size
if ops > 1 then
  member = ARGV[13] .. ':' .. ops .. ':' .. size
  put('extra_ops', extra + ops - 1)
end
local grace = HELD_GRACE_MS
if elsewhere then grace = HELD_GRACE_ELSEWHERE_MS end
local lapses = now + remaining + grace
-- A message published again under the same id (a sender's retry) is held once.
local added = redis.call('ZADD', KEYS[3], lapses, member)
if lapse_at == nil or held_count == 0 or lapses < lapse_at then put('lapse_at', lapses) end
put('held', held_count + added)
put('bytes', bytes + size)
put('admitted', (tonumber(h[16]) or 0) + ops)
-- A set this push created has no expiry until the next renewal, or until
-- the workers next say their service times (service.lua), each second the
-- lane answers: one that empties goes with its last request.
finish()
return {'', epoch, leased}
