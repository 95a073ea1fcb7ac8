"""A circuit breaker for the cache's Redis.

Closed, every call goes through. After ``failures`` errors in a row it opens:
calls are refused at once (the read goes to the database, under its permits)
for ``open_ms``. Then it is half-open: exactly one call probes Redis; its
success closes the breaker, its failure opens it again. A dead Redis thus
costs one timed-out call per ``open_ms`` per replica, not one per request.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from enum import IntEnum
from typing import TypeVar

import redis

from dataservice.config.cache import BreakerConfig
from dataservice.errors import CacheDetour

T = TypeVar("T")


class BreakerState(IntEnum):
    """The gauge's values."""

    CLOSED = 0
    OPEN = 1
    HALF_OPEN = 2


class Breaker:
    def __init__(
        self,
        config: BreakerConfig,
        on_change: Callable[[BreakerState], None] = lambda state: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._threshold = config.failures
        self._open_s = config.open_ms / 1000
        self._on_change = on_change
        self._clock = clock
        self._lock = threading.Lock()
        self._failures = 0
        self._state = BreakerState.CLOSED
        self._reopen_at = 0.0

    @property
    def state(self) -> BreakerState:
        return self._state

    def allows(self) -> bool:
        """Whether a cache call may go ahead now (a half-open breaker lets one through)."""
        if self._state is BreakerState.CLOSED:
            return True
        with self._lock:
            if self._state is BreakerState.OPEN and self._clock() >= self._reopen_at:
                self._set(BreakerState.HALF_OPEN)
                return True
            return False

    def succeeded(self) -> None:
        if self._state is BreakerState.CLOSED and not self._failures:
            return
        with self._lock:
            self._failures = 0
            self._set(BreakerState.CLOSED)

    def failed(self) -> None:
        with self._lock:
            self._failures += 1
            if self._state is BreakerState.HALF_OPEN or self._failures >= self._threshold:
                self._reopen_at = self._clock() + self._open_s
                self._set(BreakerState.OPEN)

    def _set(self, state: BreakerState) -> None:
        if state is not self._state:
            self._state = state
            self._on_change(state)


class CacheDown(CacheDetour):
    """A cache call was not made (the breaker is open) or failed: the read
    goes to the database instead."""


class Guard:
    """Every cache call of one worker, through the breaker: a failure is
    counted (``on_failure``) and raised as :class:`CacheDown`."""

    def __init__(self, breaker: Breaker, on_failure: Callable[[Exception], None]) -> None:
        self.breaker = breaker
        self._on_failure = on_failure

    def __call__(self, step: Callable[[], T], *, probe: bool = True) -> T:
        """``step()``'s result. ``probe=False``: the call goes ahead even when
        the breaker is open (a leader's fill or release: its followers wait
        for it), and only its outcome is counted."""
        if probe and not self.breaker.allows():
            raise CacheDown
        try:
            result = step()
        except redis.RedisError as exc:
            self.breaker.failed()
            self._on_failure(exc)
            raise CacheDown from exc
        self.breaker.succeeded()
        return result
