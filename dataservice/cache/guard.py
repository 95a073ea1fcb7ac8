"""The freshness guard: the cache is read only while the change stream keeps up.

The active change consumer reports in ``ds:changes:status`` every second,
with an expiry of ``changes.max_lag_s``: the hash is gone when no consumer
has reported for that long. A replica looks at it at most every
``cache.controls_max_age_ms``; while the hash is missing or its lag is over
the bound, ``ALLOW_CACHED`` reads go to the database under the normal budget
(``docs/changes.md``). A Redis that does not answer leaves the guard as it
was: the breaker decides about the cache itself.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import redis

from dataservice.keys import CHANGES_STATUS_KEY


class FreshnessGuard:
    def __init__(
        self,
        client: redis.Redis,
        max_lag_s: float,
        max_age_ms: int,
        on_change: Callable[[bool], None] = lambda engaged: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._redis = client
        self._max_lag_s = max_lag_s
        self._max_age_s = max_age_ms / 1000
        self._on_change = on_change
        self._clock = clock
        self._lock = threading.Lock()
        self._checked_at = float("-inf")
        self.engaged = False

    def allows_cache(self) -> bool:
        """Whether the change stream keeps up (re-checked at most every max age)."""
        if self._clock() - self._checked_at >= self._max_age_s and self._lock.acquire(False):
            try:
                self._checked_at = self._clock()
                self._check()
            finally:
                self._lock.release()
        return not self.engaged

    def _check(self) -> None:
        try:
            lag = self._redis.hget(CHANGES_STATUS_KEY, "lag_s")
        except redis.RedisError:
            return
        # A negative lag is one the consumer cannot tell yet (docs/changes.md).
        engaged = lag is None or not 0 <= float(lag) <= self._max_lag_s
        if engaged != self.engaged:
            self.engaged = engaged
            self._on_change(engaged)


def stream_status(client: redis.Redis) -> dict[str, str] | None:
    """What the active change consumer last reported (None: none within
    ``changes.max_lag_s``); raises ``redis.RedisError``."""
    raw = client.hgetall(CHANGES_STATUS_KEY)
    if not raw:
        return None
    return {
        (k.decode() if isinstance(k, bytes) else str(k)): (
            v.decode() if isinstance(v, bytes) else str(v)
        )
        for k, v in raw.items()
    }
