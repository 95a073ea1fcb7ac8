"""The time budget and the permit: how an operation gets the database.

:meth:`Database.run` is the one way in. It waits for a permit of the
operation's class as its lane says (``lanes.<lane>.permit_wait_ms``): so many
milliseconds, then the request is refused as ``no_permit`` (the interactive
lane: fail fast, the caller retries or gives up within its deadline); or
``deadline``, as long as the request's deadline allows (the batch lane: its
callers enqueue work to be done, and admission at publish has already refused
what the lane could not serve in time). Either way it never waits past the
point where the operation could still run: the deadline less what the class
has recently needed in the database (its p90, at least ``MIN_STATEMENT_MS``).
A request that cannot have that much is answered ``DEADLINE_EXCEEDED``
(:class:`TooLittleTime`) before any SQL, since it would only run into its
statement timeout, hold the permit for nothing and cost a discarded
connection; a wait that the deadline cut short ends the same way, not as a
refusal to retry. Each statement's timeout is then what is left when it is
sent (:mod:`dataservice.store.connections`).

A coalescing leader runs through here and holds a permit; its followers wait
for its answer and hold none.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from dataservice.config.model import UNTIL_DEADLINE, PermitWait
from dataservice.enums import OperationClass
from dataservice.handler.durations import RecentDurations
from dataservice.handler.failures import TooLittleTime, database_errors
from dataservice.limits.permits import LanePermits, PermitUnavailable
from dataservice.store import Bounds
from dataservice.store.connections import MIN_STATEMENT_MS, now_ms

T = TypeVar("T")


class Database:
    """One lane's way to the database, in one replica."""

    def __init__(
        self,
        permits: LanePermits,
        permit_wait_ms: PermitWait,
        clock: Callable[[], int] = now_ms,
    ) -> None:
        self.permits = permits
        self.durations: RecentDurations[OperationClass] = RecentDurations()
        self._permit_wait_ms = None if permit_wait_ms == UNTIL_DEADLINE else int(permit_wait_ms)
        self._clock = clock

    def run(
        self,
        op_class: OperationClass,
        deadline_ms: int,
        fn: Callable[[Bounds], T],
        *,
        hold_ms: int | None = None,
    ) -> T:
        """``fn`` under a permit of ``op_class``, bounded by ``deadline_ms`` (Unix
        ms) and, once it holds the permit, by ``hold_ms`` (a transaction's
        bound: counted from the permit, not from the wait before it).

        Raises a :class:`~dataservice.refusals.Refusal` for anything that kept
        it from running or made it fail, database errors included.
        """
        # What the operation usually needs, so that a request that would only
        # run into its statement timeout does not take the database's time.
        needed = max(MIN_STATEMENT_MS, self.durations.p90(op_class))
        last_ms = deadline_ms - self._clock() - needed
        if last_ms <= 0:
            raise TooLittleTime
        lane_wait_ms = self._permit_wait_ms
        wait_ms = last_ms if lane_wait_ms is None else min(lane_wait_ms, last_ms)
        held = False
        try:
            with database_errors(), self.permits.acquire(op_class, wait_ms / 1000) as permit:
                held = True
                bound_ms = deadline_ms
                if hold_ms is not None:
                    bound_ms = min(deadline_ms, self._clock() + hold_ms)
                if bound_ms - self._clock() < needed:
                    raise TooLittleTime
                started = time.monotonic()
                # A new connection is worth waiting for only while the operation
                # still has the time it needs once connected.
                result = fn(Bounds(permit, bound_ms, connect_by_ms=bound_ms - int(needed)))
                self.durations.record(op_class, (time.monotonic() - started) * 1000)
                return result
        except PermitUnavailable:
            # The deadline, not the lane's wait, ended it: the request is out of
            # time, and a retry could not be served either.
            if not held and (lane_wait_ms is None or last_ms < lane_wait_ms):
                raise TooLittleTime from None
            raise
