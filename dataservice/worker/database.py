"""The time budget and the permit: how an operation gets the database.

:meth:`Database.run` is the one way in. It waits for a permit of the
operation's class at most ``database.pool_timeout_ms`` and never past the
point where the operation could still run: the deadline less what the class
has recently needed in the database (its p90, at least ``MIN_STATEMENT_MS``).
A request that cannot have that much is refused before any SQL, since it
would only run into its statement timeout, hold the permit for nothing and
cost a discarded connection. Each statement's timeout is then what is left
when it is sent (:mod:`dataservice.store.connections`).

A coalescing leader runs through here and holds a permit; its followers wait
for its answer and hold none.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from dataservice.enums import OperationClass
from dataservice.limits.permits import LanePermits
from dataservice.store import Bounds
from dataservice.store.connections import MIN_STATEMENT_MS, now_ms
from dataservice.worker.durations import RecentDurations
from dataservice.worker.failures import TooLittleTime, database_errors

T = TypeVar("T")


class Database:
    """One lane's way to the database, in one replica."""

    def __init__(
        self,
        permits: LanePermits,
        pool_timeout_ms: int,
        clock: Callable[[], int] = now_ms,
    ) -> None:
        self.permits = permits
        self.durations: RecentDurations[OperationClass] = RecentDurations()
        self._pool_timeout_ms = pool_timeout_ms
        self._clock = clock

    def run(self, op_class: OperationClass, deadline_ms: int, fn: Callable[[Bounds], T]) -> T:
        """``fn`` under a permit of ``op_class``, bounded by ``deadline_ms`` (Unix ms).

        Raises a :class:`~dataservice.refusals.Refusal` for anything that kept
        it from running or made it fail, database errors included.
        """
        # What the operation usually needs, so that a request that would only
        # run into its statement timeout does not take the database's time.
        needed = max(MIN_STATEMENT_MS, self.durations.p90(op_class))
        wait_ms = min(self._pool_timeout_ms, deadline_ms - self._clock() - needed)
        if wait_ms <= 0:
            raise TooLittleTime
        with database_errors(), self.permits.acquire(op_class, wait_ms / 1000) as permit:
            if deadline_ms - self._clock() < needed:
                raise TooLittleTime
            started = time.monotonic()
            # A new connection is worth waiting for only while the operation
            # still has the time it needs once connected.
            result = fn(Bounds(permit, deadline_ms, connect_by_ms=deadline_ms - int(needed)))
            self.durations.record(op_class, (time.monotonic() - started) * 1000)
            return result
