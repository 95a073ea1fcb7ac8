"""The freshness guard: the cache is read only while the change stream keeps up.

With each report the active change consumer sets ``ds:changes:fresh`` to
expire when the cache may no longer be within ``changes.max_lag_s`` of the
database: ``max_lag_s`` minus its lag later, or at once when its lag is over
the bound or unknown. So the word lapses on its own when the consumer stalls,
dies or falls behind, however recent its last report. A replica looks at it
at most every ``cache.controls_max_age_ms``; while it is missing,
``ALLOW_CACHED`` reads go to the database under the normal budget
(``docs/changes.md``). A Redis that does not answer leaves the guard as it
was: the breaker decides about the cache itself.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import redis

from dataservice.redis.keys import CHANGES_FRESH_KEY, CHANGES_STATUS_KEY


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
            engaged = not self._redis.exists(CHANGES_FRESH_KEY)
        except redis.RedisError:
            return
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
