"""Database permits: how many operations one replica runs in the database at once.

Each lane has ``permits`` per replica, and each operation class a cap within
them (so, say, lists cannot take every permit from point reads). A permit is
held from before the first statement until the database has stopped working
for the request: the driver call has returned, or, when the connection was
lost before the server answered, the server has confirmed that the statement
is gone. In that case the permit is handed over (:meth:`Permit.hand_over`) to
the store's custody (:mod:`dataservice.store.custody`), which gives it back
on the server's word; otherwise release sits in ``finally``. Nothing else can
return a permit.

The gauge (:meth:`LanePermits.snapshot`) also names the database connection
each permit is using, so an operator (or a test) can match permits against the
server's own process list.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import TracebackType

from dataservice.config.model import LaneConfig
from dataservice.enums import OperationClass
from dataservice.observe import trace as tracing
from dataservice.observe.metrics import Stage
from dataservice.refusals import Refusal

# The Celery control command that reports a replica's gauge.
PERMITS_COMMAND = "dataservice_permits"


class PermitUnavailable(Refusal):
    """No permit became free within the wait the request could afford."""


@dataclass(slots=True, eq=False)
class Permit:
    """One held permit; the store records which connection it runs on."""

    op_class: OperationClass
    _owner: LanePermits = field(repr=False)
    _class_slot: threading.BoundedSemaphore = field(repr=False)
    acquired_at: float = field(default_factory=time.monotonic)
    connection_id: int | None = None
    _handed_over: bool = field(default=False, repr=False)

    @property
    def handed_over(self) -> bool:
        return self._handed_over

    def hand_over(self) -> Callable[[], None]:
        """Keep this permit taken after its block ends: the returned function
        gives it back (once), when the database has let go of its statement."""
        if self._handed_over:
            raise RuntimeError("the permit was handed over already")
        self._handed_over = True
        return functools.partial(self._owner._give_back, self)


@dataclass(frozen=True, slots=True)
class PermitSnapshot:
    capacity: int
    in_use: int
    # Of those, held for a statement the database has not confirmed gone.
    in_custody: int
    by_class: dict[str, int]
    connection_ids: list[int]
    acquired_total: int
    released_total: int
    refused_total: int


class _Holding:
    """The block of one permit of ``op_class``: taken on entry (waiting at
    most ``wait_s``), given back at the block's end however it ends, unless
    it was handed over. A class rather than a generator: every database
    operation takes one."""

    __slots__ = ("_op_class", "_owner", "_permit", "_wait_s")

    def __init__(self, owner: LanePermits, op_class: OperationClass, wait_s: float) -> None:
        self._owner = owner
        self._op_class = op_class
        self._wait_s = wait_s

    def __enter__(self) -> Permit:
        self._permit = self._owner._take(self._op_class, self._wait_s)
        return self._permit

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        permit = self._permit
        if not permit.handed_over:
            self._owner._give_back(permit)


class LanePermits:
    """The permits of one lane in one replica (one worker process)."""

    def __init__(self, lane: LaneConfig) -> None:
        self.capacity = lane.permits
        self._lane = threading.BoundedSemaphore(lane.permits)
        self._classes = {c: threading.BoundedSemaphore(lane.classes[c]) for c in OperationClass}
        self._lock = threading.Lock()
        self._holders: dict[int, Permit] = {}
        self._acquired = 0
        self._released = 0
        self._refused = 0
        # Told how long each permit was held, as it is given back (a metric).
        self.on_released: Callable[[float], None] = lambda held_s: None

    def acquire(self, op_class: OperationClass, wait_s: float) -> _Holding:
        """Hold a permit of ``op_class`` for the block, waiting at most ``wait_s``."""
        return _Holding(self, op_class, wait_s)

    def _take(self, op_class: OperationClass, wait_s: float) -> Permit:
        started = time.monotonic()
        deadline = started + max(wait_s, 0.0)
        class_slot = self._classes[op_class]
        # The class cap first: a request that could not run anyway never
        # occupies a lane permit while it waits.
        if not class_slot.acquire(timeout=max(wait_s, 0.0)):
            self._refuse(started)
        if not self._lane.acquire(timeout=max(deadline - time.monotonic(), 0.0)):
            class_slot.release()
            self._refuse(started)
        permit = self._held(op_class, class_slot)
        try:
            tracing.record(Stage.PERMIT_WAIT, time.monotonic() - started)
        except BaseException:
            self._give_back(permit)
            raise
        return permit

    @contextmanager
    def try_acquire(self, op_class: OperationClass) -> Iterator[Permit | None]:
        """Hold a permit of ``op_class`` for the block if one is free now, else
        None. Not waiting for one, it is not a refusal either: for work that is
        skipped when the lane is busy (shadow comparisons), never queued."""
        class_slot = self._classes[op_class]
        if not class_slot.acquire(blocking=False):
            yield None
            return
        if not self._lane.acquire(blocking=False):
            class_slot.release()
            yield None
            return
        permit = self._held(op_class, class_slot)
        try:
            yield permit
        finally:
            if not permit.handed_over:
                self._give_back(permit)

    def _held(self, op_class: OperationClass, class_slot: threading.BoundedSemaphore) -> Permit:
        """A permit whose lane and class slots are taken, on the books: its
        holder gives it back (:meth:`_give_back`) unless it hands it over."""
        try:
            permit = Permit(op_class, self, class_slot)
            with self._lock:
                self._acquired += 1
                self._holders[id(permit)] = permit
        except BaseException:
            self._lane.release()
            class_slot.release()
            raise
        return permit

    def _give_back(self, permit: Permit) -> None:
        # Once, whoever calls: the block's end or the custody.
        with self._lock:
            if self._holders.pop(id(permit), None) is None:
                return
            self._released += 1
        self._lane.release()
        permit._class_slot.release()
        self.on_released(time.monotonic() - permit.acquired_at)

    def _refuse(self, started: float) -> None:
        # A refused wait is a wait too: it is what saturation looks like.
        tracing.record(Stage.PERMIT_WAIT, time.monotonic() - started)
        with self._lock:
            self._refused += 1
        raise PermitUnavailable

    def snapshot(self) -> PermitSnapshot:
        with self._lock:
            holders = list(self._holders.values())
            acquired, released, refused = self._acquired, self._released, self._refused
        by_class = {c.value: 0 for c in OperationClass}
        for permit in holders:
            by_class[permit.op_class.value] += 1
        return PermitSnapshot(
            capacity=self.capacity,
            in_use=len(holders),
            in_custody=sum(1 for p in holders if p.handed_over),
            by_class=by_class,
            connection_ids=sorted(p.connection_id for p in holders if p.connection_id is not None),
            acquired_total=acquired,
            released_total=released,
            refused_total=refused,
        )
