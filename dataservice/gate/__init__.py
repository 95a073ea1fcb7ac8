"""Per-caller limits shared by every replica: replay memory, rate and in-flight cap.

One Lua script (``gate.lua``) checks and records all three in Redis, so a
request is counted once, by every replica alike, and two replicas can never
both take a caller's last token or last slot.

When Redis cannot be reached the gate does not become unlimited: it falls
back to a conservative limit of this replica's own, the caller's rate, burst
and in-flight cap divided by ``budget.max_replicas`` (so all replicas together
stay within the shared limit, except that each allows at least one request
at once), with request ids remembered in a bounded in-process memory. It
tries Redis again after ``REDIS_RETRY_S``. While it runs on its own, a
request replayed to *another* replica is not recognised; that is the one
guarantee given up, and the fallback is logged and counted.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources

import redis
from redis.commands.core import Script

from dataservice.auth import Reason, Rejected
from dataservice.config import CallerPolicy, Config
from dataservice.errors import ResourceExhausted, Unauthenticated, Unavailable
from dataservice.keys import inflight_key, rate_key, replay_key

log = logging.getLogger(__name__)

REDIS_RETRY_S = 1.0
# Slots are few and short; a freed one is usually this far away.
RETRY_AT_CAP_MS = 25
# Request ids the fallback remembers; beyond this it refuses rather than forget.
LOCAL_REPLAY_CAPACITY = 200_000
RETRY_LOCAL_FULL_MS = 500

_SCRIPT = resources.files(__package__).joinpath("gate.lua").read_text("utf-8")


@dataclass(frozen=True, slots=True)
class Slot:
    """What a request holds while it runs: its place under the in-flight cap,
    in this replica's fallback count (``local``) and/or in Redis (``in_redis``:
    also after a failed call, which may have taken it before the reply was lost)."""

    caller: str
    request_id: str
    capped: bool
    local: bool
    in_redis: bool


def _rejection(verdict: int, retry_after_ms: int, caller: str) -> Rejected:
    if verdict == 1:
        return Rejected(Reason.REPLAYED, Unauthenticated("request id already used"), caller=caller)
    if verdict == 2:
        error = ResourceExhausted("the caller is over its rate", retry_after=retry_after_ms / 1000)
        return Rejected(Reason.RATE_LIMITED, error, caller=caller, retry_after_ms=retry_after_ms)
    error = ResourceExhausted(
        "the caller has too many interactive requests in flight",
        retry_after=retry_after_ms / 1000,
    )
    return Rejected(Reason.CONCURRENCY_LIMITED, error, caller=caller, retry_after_ms=retry_after_ms)


class _LocalLimits:
    """This replica's share of every caller's limits, for when Redis is away."""

    def __init__(self, replicas: int, clock: Callable[[], float] = time.monotonic) -> None:
        self._replicas = replicas
        self._clock = clock
        self._lock = threading.Lock()
        self._tat: dict[str, float] = {}
        self._inflight: dict[str, int] = {}
        self._seen: OrderedDict[str, float] = OrderedDict()

    def enter(
        self, caller: str, policy: CallerPolicy, request_id: str, ttl_ms: int, capped: bool
    ) -> tuple[int, int]:
        now = self._clock()
        interval = self._replicas / policy.rate_per_s
        burst = max(1, policy.burst // self._replicas)
        cap = max(1, policy.max_interactive // self._replicas)
        with self._lock:
            marker = f"{caller}:{request_id}"
            while self._seen and next(iter(self._seen.values())) <= now:
                self._seen.popitem(last=False)
            if marker in self._seen:
                return 1, 0
            if len(self._seen) >= LOCAL_REPLAY_CAPACITY:
                return 4, RETRY_LOCAL_FULL_MS
            # Ids are kept in order of expiry only roughly; bounded either way.
            self._seen[marker] = now + ttl_ms / 1000
            tat = max(self._tat.get(caller, now), now)
            allow_at = tat + interval - burst * interval
            if allow_at > now:
                return 2, math.ceil((allow_at - now) * 1000)
            if capped:
                if self._inflight.get(caller, 0) >= cap:
                    return 3, RETRY_AT_CAP_MS
                self._inflight[caller] = self._inflight.get(caller, 0) + 1
            self._tat[caller] = tat + interval
            return 0, 0

    def leave(self, caller: str) -> None:
        with self._lock:
            left = self._inflight.get(caller, 0) - 1
            if left > 0:
                self._inflight[caller] = left
            else:
                self._inflight.pop(caller, None)


class Gate:
    """Admits a caller's request against its shared limits, or rejects it."""

    def __init__(
        self,
        client: redis.Redis,
        config: Config,
        on_fallback: Callable[[], None] = lambda: None,
    ) -> None:
        self._redis = client
        self._script: Script = client.register_script(_SCRIPT)
        self._skew_ms = config.auth.max_clock_skew_ms
        self._grace_ms = config.results.grace_ms
        self._local = _LocalLimits(config.budget.max_replicas)
        self._redis_retry_at = 0.0
        self._on_fallback = on_fallback

    def enter(
        self,
        policy: CallerPolicy,
        caller: str,
        request_id: str,
        deadline_ms: int,
        now_ms: int,
        *,
        capped: bool,
    ) -> Slot:
        """Take the request's place, or raise :class:`~dataservice.auth.Rejected`."""
        # Beyond its deadline (plus the skew) a replay would be dropped as late anyway.
        ttl_ms = max(1, deadline_ms - now_ms + self._skew_ms)
        if time.monotonic() >= self._redis_retry_at:
            try:
                verdict, retry_ms = self._script(
                    keys=[replay_key(caller, request_id), rate_key(caller), inflight_key(caller)],
                    args=[
                        ttl_ms,
                        max(1, round(1_000_000 / policy.rate_per_s)),
                        policy.burst,
                        policy.max_interactive if capped else 0,
                        request_id,
                        deadline_ms + self._grace_ms,
                        RETRY_AT_CAP_MS,
                    ],
                )
            except redis.RedisError as exc:
                log.warning("limits fall back to this replica's share: %s", type(exc).__name__)
                self._redis_retry_at = time.monotonic() + REDIS_RETRY_S
                self._on_fallback()
            else:
                if verdict:
                    raise _rejection(int(verdict), int(retry_ms), caller)
                return Slot(caller, request_id, capped, local=False, in_redis=capped)
            # The script may have run before the reply was lost: its slot, if
            # any, is given back with this one.
            uncertain = True
        else:
            uncertain = False
        verdict, retry_ms = self._local.enter(caller, policy, request_id, ttl_ms, capped)
        if verdict == 4:
            unavailable = Unavailable(
                "the service cannot check for replays right now", retry_after=retry_ms / 1000
            )
            raise Rejected(
                Reason.LIMITS_UNAVAILABLE, unavailable, caller=caller, retry_after_ms=retry_ms
            )
        if verdict:
            raise _rejection(verdict, retry_ms, caller)
        return Slot(caller, request_id, capped, local=True, in_redis=capped and uncertain)

    @staticmethod
    def slot_member(slot: Slot) -> tuple[str, str] | None:
        """Where a slot may live in Redis (sorted set, member); None if nowhere."""
        if not slot.in_redis:
            return None
        return inflight_key(slot.caller), slot.request_id

    def leave(self, slot: Slot, *, released_in_redis: bool = False) -> None:
        """Give the slot back (its Redis part unless ``released_in_redis``); one
        that cannot be given back lapses at its deadline plus the grace."""
        if slot.local and slot.capped:
            self._local.leave(slot.caller)
        if not slot.in_redis or released_in_redis:
            return
        try:
            self._redis.zrem(inflight_key(slot.caller), slot.request_id)
        except redis.RedisError as exc:
            log.warning("could not release an in-flight slot: %s", type(exc).__name__)
