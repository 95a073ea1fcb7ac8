"""This replica's share of every caller's limits, for when Redis is away.

The caller's rate, burst and in-flight cap divided by ``budget.max_replicas``
(so all replicas together stay within the shared limit, except that each
allows at least one request at once), with request ids remembered in a
bounded in-process memory. A request replayed to *another* replica is not
recognised: that is the one guarantee given up.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from dataservice.config.model import Config
from dataservice.limits.gcra import Arrivals
from dataservice.limits.slots import RETRY_AT_CAP_MS, Entry, Slot, rejection
from dataservice.refusals import Reason

# Request ids the fallback remembers; beyond this it refuses rather than forget.
LOCAL_REPLAY_CAPACITY = 200_000
RETRY_LOCAL_FULL_MS = 500


class LocalLimits:
    """The limits of one process; same contract as :class:`~.gate.RedisLimits`."""

    def __init__(
        self, config: Config, replicas: int, clock_ns: Callable[[], int] = time.monotonic_ns
    ) -> None:
        self._replicas = replicas
        self._skew_ms = config.auth.max_clock_skew_ms
        self._clock_ns = clock_ns
        self._lock = threading.Lock()
        self._arrivals = Arrivals()
        self._inflight: dict[str, int] = {}
        # Request ids by when they may be forgotten (monotonic µs).
        self._seen: OrderedDict[str, int] = OrderedDict()

    def enter(self, entry: Entry) -> Slot:
        policy, caller, capped = entry.policy, entry.caller, entry.capped
        now_us = self._clock_ns() // 1000
        rate = policy.rate.share(self._replicas).charged(entry.cost)
        cap = max(1, policy.max_interactive // self._replicas)
        remember_us = max(1, entry.deadline_ms - entry.now_ms + self._skew_ms) * 1000
        marker = f"{caller}:{entry.request_id}"
        with self._lock:
            while self._seen and next(iter(self._seen.values())) <= now_us:
                self._seen.popitem(last=False)
            if marker in self._seen:
                raise rejection(Reason.REPLAYED, caller)
            if len(self._seen) >= LOCAL_REPLAY_CAPACITY:
                raise rejection(Reason.LIMITS_UNAVAILABLE, caller, RETRY_LOCAL_FULL_MS)
            # Ids are kept in order of expiry only roughly; bounded either way.
            self._seen[marker] = now_us + remember_us
            tat, retry_ms = self._arrivals.check(caller, rate, now_us)
            if retry_ms:
                raise rejection(Reason.RATE_LIMITED, caller, retry_ms)
            if capped:
                if self._inflight.get(caller, 0) >= cap:
                    raise rejection(Reason.CONCURRENCY_LIMITED, caller, RETRY_AT_CAP_MS)
                self._inflight[caller] = self._inflight.get(caller, 0) + 1
            self._arrivals.record(caller, tat)
        return Slot(caller, entry.request_id, capped, local=True, in_redis=False)

    def leave(self, slot: Slot) -> None:
        if not (slot.local and slot.capped):
            return
        with self._lock:
            left = self._inflight.get(slot.caller, 0) - 1
            if left > 0:
                self._inflight[slot.caller] = left
            else:
                self._inflight.pop(slot.caller, None)
