"""Open-loop traffic: arrivals at a fixed offered rate, whatever the answers do.

A scheduler thread per lane emits arrivals at evenly spaced instants of the
lane's current rate and hands them to a pool of caller threads. The pool grows
on demand up to ``max_callers`` (a caller waits up to its deadline, so the
pool must hold rate x deadline callers). An arrival sent more than
``LAG_TOLERANCE_S`` after its instant counts as generator lag: it is reported,
never hidden by slowing the schedule down.

Each request ends in one outcome; those a caller would act on differently
stay apart::

    ok            an answer
    rejected      ResourceExhausted: refused for load (rate, queue bounds, permits)
    unavailable   Unavailable: a dependency (the database, Redis) is down
    timeout       DeadlineExceeded: no answer before the deadline
    error         anything else
"""

from __future__ import annotations

import queue
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from dataservice.enums import LaneName
from dataservice.errors import DeadlineExceeded, ResourceExhausted, Unavailable

LAG_TOLERANCE_S = 0.010
# How long a closed-loop caller pauses after a refusal before its next request.
REFUSED_PAUSE_S = 0.010
# Share of reads in each lane's mix; the rest are writes (upserts of seeded ids).
READ_SHARE = {LaneName.INTERACTIVE: 0.9, LaneName.BATCH: 0.5}


class Outcome(StrEnum):
    OK = "ok"
    REJECTED = "rejected"
    UNAVAILABLE = "unavailable"
    TIMEOUT = "timeout"
    ERROR = "error"


_CLASSES: tuple[tuple[type[BaseException], Outcome], ...] = (
    (ResourceExhausted, Outcome.REJECTED),
    (Unavailable, Outcome.UNAVAILABLE),
    (DeadlineExceeded, Outcome.TIMEOUT),
)


def classify(exc: BaseException) -> Outcome:
    """The outcome of a request that raised ``exc``."""
    return next((outcome for cls, outcome in _CLASSES if isinstance(exc, cls)), Outcome.ERROR)


@dataclass(slots=True)
class RequestRecord:
    lane: LaneName
    scheduled: float  # seconds since the run's start
    sent: float
    done: float
    outcome: Outcome
    detail: str = ""  # the error's message; "" when OK
    op: str = ""  # "read" or "write"
    object_id: str = ""
    revision: int = 0  # an acknowledged write's revision; 0 otherwise
    reason: str = ""  # why it was refused ("queue_too_long", ...), when it says

    @property
    def latency_ms(self) -> float:
        return (self.done - self.sent) * 1000


class Adapter(Protocol):
    """How the harness calls one system under test; ``call`` raises unless
    answered, and returns an acknowledged write's revision where it knows it."""

    def call(
        self, lane: LaneName, op: str, object_id: str, payload: bytes, timeout_s: float
    ) -> int | None: ...

    def close(self) -> None: ...


def attempt(
    adapter: Adapter, lane: LaneName, op: str, object_id: str, payload: bytes, timeout_s: float
) -> tuple[Outcome, str, int, str]:
    """One call: its outcome, the error's message ("" when OK), an acknowledged
    write's revision (0 when not known) and the error's reason ("" if none)."""
    try:
        revision = adapter.call(lane, op, object_id, payload, timeout_s)
    except Exception as exc:  # an adapter bug must not kill the caller pool: it is an ERROR
        return classify(exc), str(exc), 0, str(getattr(exc, "reason", "") or "")
    return Outcome.OK, "", revision or 0, ""


RateFn = Callable[[LaneName, float], float]  # (lane, seconds since start) -> requests/s


class OpenLoop:
    """Arrivals per lane at ``rate(lane, t)`` for ``duration_s``; outcomes in ``records``.

    ``read_share`` sets each lane's mix of reads (the rest are writes of ``payload``).
    """

    def __init__(
        self,
        adapter: Adapter,
        rate: RateFn,
        timeouts: Mapping[LaneName, float],
        ids: Sequence[str],
        payload: bytes,
        duration_s: float,
        t0: float,
        max_callers: int,
        read_share: Mapping[LaneName, float] = READ_SHARE,
    ) -> None:
        self._adapter = adapter
        self._rate = rate
        self._timeouts = timeouts
        self._ids = ids
        self._payload = payload
        self.duration_s = duration_s
        self.t0 = t0
        self._max_callers = max_callers
        self._read_share = read_share
        self.records: list[RequestRecord] = []
        self.scheduled: dict[LaneName, int] = dict.fromkeys(timeouts, 0)
        self.lagged = 0
        self.max_lag_s = 0.0
        self._work: queue.Queue[tuple[LaneName, float] | None] = queue.Queue()
        self._idle = 0
        self._callers: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._schedulers: list[threading.Thread] = []

    @property
    def callers(self) -> int:
        return len(self._callers)

    def start(self, callers: int = 0) -> None:
        """Start ``callers`` idle caller threads first (threads and clients cost
        time to create; made on the fly at the start they would lag the schedule),
        then a scheduler for each lane in ``timeouts``."""
        with self._lock:
            for _ in range(min(callers, self._max_callers)):
                thread = self._new_caller()
                self._idle += 1
                thread.start()
        for lane in self._timeouts:
            thread = threading.Thread(target=self._schedule, args=(lane,), daemon=True)
            thread.name = f"schedule-{lane.value}"
            self._schedulers.append(thread)
            thread.start()

    def _new_caller(self) -> threading.Thread:
        thread = threading.Thread(target=self._caller, daemon=True)
        thread.name = f"caller-{len(self._callers)}"
        self._callers.append(thread)
        return thread

    def _schedule(self, lane: LaneName) -> None:
        """Evenly spaced arrivals; a late wake-up emits every instant already due."""
        at = 0.0
        while at < self.duration_s:
            rate = self._rate(lane, at)
            if rate <= 0:
                at += 0.05
                continue
            delay = self.t0 + at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            self._submit(lane, at)
            at += 1.0 / rate

    def _submit(self, lane: LaneName, at: float) -> None:
        with self._lock:
            self.scheduled[lane] += 1
            grow = self._idle == 0 and len(self._callers) < self._max_callers
            if grow:
                thread = self._new_caller()
            else:
                self._idle -= 1 if self._idle > 0 else 0
        self._work.put((lane, at))
        if grow:
            thread.start()

    def _caller(self) -> None:
        rng = random.Random()
        while True:
            item = self._work.get()
            if item is None:
                return
            lane, at = item
            sent = time.monotonic() - self.t0
            lag = sent - at
            if lag > LAG_TOLERANCE_S:
                with self._lock:
                    self.lagged += 1
                    self.max_lag_s = max(self.max_lag_s, lag)
            op = "read" if rng.random() < self._read_share[lane] else "write"
            object_id = rng.choice(self._ids)
            outcome, detail, revision, reason = attempt(
                self._adapter, lane, op, object_id, self._payload, self._timeouts[lane]
            )
            done = time.monotonic() - self.t0
            self.records.append(
                RequestRecord(
                    lane, at, sent, done, outcome, detail, op, object_id, revision, reason
                )
            )
            with self._lock:
                self._idle += 1

    def join(self) -> None:
        """Wait for the schedule to end and every request to be answered or time out."""
        for thread in self._schedulers:
            thread.join()
        for _ in self._callers:
            self._work.put(None)
        for thread in self._callers:
            thread.join()


def closed_loop_capacity(
    adapter: Adapter,
    callers: dict[LaneName, int],
    timeouts: dict[LaneName, float],
    ids: list[str],
    payload: bytes,
    warmup_s: float,
    measure_s: float,
) -> dict[LaneName, float]:
    """Requests/s each lane completes with ``callers`` back-to-back callers (no queue build-up)."""
    stop = threading.Event()
    start = time.monotonic()
    window = (start + warmup_s, start + warmup_s + measure_s)
    counts: dict[LaneName, int] = dict.fromkeys(LaneName, 0)
    lock = threading.Lock()

    def loop(lane: LaneName) -> None:
        rng = random.Random()
        while not stop.is_set():
            op = "read" if rng.random() < READ_SHARE[lane] else "write"
            outcome, *_ = attempt(adapter, lane, op, rng.choice(ids), payload, timeouts[lane])
            if outcome is Outcome.REJECTED:
                # As a caller told to come back would: a refused loop that spun
                # at once would only burn the CPU the service runs on.
                time.sleep(REFUSED_PAUSE_S)
            now = time.monotonic()
            if outcome is Outcome.OK and window[0] <= now < window[1]:
                with lock:
                    counts[lane] += 1

    threads = [
        threading.Thread(target=loop, args=(lane,), daemon=True)
        for lane, n in callers.items()
        for _ in range(n)
    ]
    for thread in threads:
        thread.start()
    time.sleep(max(0.0, window[1] - time.monotonic()))
    stop.set()
    for thread in threads:
        thread.join()
    return {lane: counts[lane] / measure_s for lane in callers}
