"""In-process coalescing: concurrent misses for one key share one read.

The first thread to miss a key leads: it runs the read. Threads that miss the
same key while that read is in flight follow: they wait for its outcome, each
only until its own deadline, and a follower that gives up does not disturb the
leader. The map of reads in flight is bounded; beyond it a miss simply reads
on its own. An entry leaves the map when its read ends, however it ends
(value, exception, or the leader's thread unwinding).

A read that ended well is kept a while (``keep_ms``, bounded in keys too): a
request sent before it ended (its ``issued_ms``) overlapped it, as a follower
does, and takes its value instead of reading again. That matters when the
requests of one burst reach the threads in waves, one wave per read: without
it, each wave would read the database once more. A request sent after the
read ended never takes it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Generic, TypeVar

from dataservice.errors import CacheDetour
from dataservice.observe import trace as tracing
from dataservice.observe.metrics import Stage
from dataservice.store.connections import now_ms

T = TypeVar("T")


class FollowerTimedOut(CacheDetour):
    """A follower's own deadline came before the leader's outcome."""


class LeaderFailed(CacheDetour):
    """The read a follower waited for raised (the exception is the cause): the
    follower may try again itself, since its deadline is not the leader's."""


@dataclass(frozen=True, slots=True)
class _Ended(Generic[T]):
    value: T
    ended_ms: int
    until_ms: int


class Coalescer(Generic[T]):
    def __init__(
        self,
        max_keys: int,
        on_follow: Callable[[], None] = lambda: None,
        keep_ms: int = 0,
        clock: Callable[[], int] = now_ms,
    ) -> None:
        self._max_keys = max_keys
        self._on_follow = on_follow
        self._keep_ms = keep_ms
        self._clock = clock
        self._lock = threading.Lock()
        self._inflight: dict[Hashable, Future[T]] = {}
        # Reads that ended well, oldest first, at most max_keys of them.
        self._ended: dict[Hashable, _Ended[T]] = {}

    def __len__(self) -> int:
        return len(self._inflight)

    def run(
        self,
        key: Hashable,
        read: Callable[[], T],
        timeout_s: float,
        issued_ms: int | None = None,
    ) -> T:
        """``read()``'s outcome: this thread's own, or a concurrent leader's,
        or (``issued_ms``: when the request was sent) that of a read which
        ended after it was sent.

        A follower raises :class:`LeaderFailed` when the leader's read raised,
        and :class:`FollowerTimedOut` once it has waited ``timeout_s``.
        """
        with self._lock:
            ended = self._ended.get(key) if issued_ms is not None else None
            if ended is not None and issued_ms is not None:
                if ended.until_ms <= self._clock():
                    del self._ended[key]
                elif ended.ended_ms >= issued_ms:
                    self._on_follow()
                    return ended.value
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
            if self._keep_ms:
                self._keep(key, value)
            return value
        finally:
            with self._lock:
                del self._inflight[key]

    def _keep(self, key: Hashable, value: T) -> None:
        now = self._clock()
        with self._lock:
            self._ended.pop(key, None)
            while len(self._ended) >= self._max_keys:
                del self._ended[next(iter(self._ended))]
            self._ended[key] = _Ended(value, now, now + self._keep_ms)
