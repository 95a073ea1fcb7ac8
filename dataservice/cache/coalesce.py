"""In-process coalescing: concurrent misses for one key share one read.

The first thread to miss a key leads: it runs the read. Threads that miss the
same key while that read is in flight follow: they wait for its outcome, each
only until its own deadline, and a follower that gives up does not disturb the
leader. The map of reads in flight is bounded; beyond it a miss simply reads
on its own. An entry leaves the map when its read ends, however it ends
(value, exception, or the leader's thread unwinding).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Generic, TypeVar

from dataservice.errors import CacheDetour
from dataservice.metrics import Stage
from dataservice.observe import trace as tracing

T = TypeVar("T")


class FollowerTimedOut(CacheDetour):
    """A follower's own deadline came before the leader's outcome."""


class LeaderFailed(CacheDetour):
    """The read a follower waited for raised (the exception is the cause): the
    follower may try again itself, since its deadline is not the leader's."""


class Coalescer(Generic[T]):
    def __init__(self, max_keys: int, on_follow: Callable[[], None] = lambda: None) -> None:
        self._max_keys = max_keys
        self._on_follow = on_follow
        self._lock = threading.Lock()
        self._inflight: dict[Hashable, Future[T]] = {}

    def __len__(self) -> int:
        return len(self._inflight)

    def run(self, key: Hashable, read: Callable[[], T], timeout_s: float) -> T:
        """``read()``'s outcome: this thread's own, or a concurrent leader's.

        A follower raises :class:`LeaderFailed` when the leader's read raised,
        and :class:`FollowerTimedOut` once it has waited ``timeout_s``.
        """
        with self._lock:
            future = self._inflight.get(key)
            leads = future is None and len(self._inflight) < self._max_keys
            if leads:
                future = Future()
                self._inflight[key] = future
        if future is None:
            return read()
        if not leads:
            self._on_follow()
            try:
                with tracing.timed(Stage.COALESCING_WAIT):
                    return future.result(timeout=max(timeout_s, 0.0))
            except FutureTimeout:
                raise FollowerTimedOut from None
            except Exception as exc:
                raise LeaderFailed from exc
        try:
            value = read()
        except BaseException as exc:
            future.set_exception(exc)
            raise
        else:
            future.set_result(value)
            return value
        finally:
            with self._lock:
                del self._inflight[key]
