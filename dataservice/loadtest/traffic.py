"""Open-loop traffic: arrivals at a fixed offered rate, whatever the answers do.

A scheduler thread per lane emits arrivals at evenly spaced instants of the
lane's current rate and hands them to a pool of caller threads. The pool grows
on demand up to ``max_callers`` (a caller waits up to its deadline, so the
pool must hold rate x deadline callers). An arrival sent more than
``LAG_TOLERANCE_S`` after its instant counts as generator lag: it is reported,
never hidden by slowing the schedule down.
"""

from __future__ import annotations

import queue
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from dataservice.client import Client
from dataservice.config import Config
from dataservice.enums import LaneName, ReadMode
from dataservice.errors import DataServiceError, DeadlineExceeded, RetryableError
from dataservice.settings import Settings
from dataservice.types import ReadOp, WriteOp

CALLER = "loadtest"
SCOPE = "load"
LAG_TOLERANCE_S = 0.010
# Share of reads in each lane's mix; the rest are writes (upserts of seeded ids).
READ_SHARE = {LaneName.INTERACTIVE: 0.9, LaneName.BATCH: 0.5}


class Outcome(StrEnum):
    OK = "ok"
    REJECTED = "rejected"  # RESOURCE_EXHAUSTED / UNAVAILABLE: retryable, answered
    TIMEOUT = "timeout"  # no answer before the deadline
    ERROR = "error"


@dataclass(slots=True)
class RequestRecord:
    lane: LaneName
    scheduled: float  # seconds since the run's start
    sent: float
    done: float
    outcome: Outcome

    @property
    def latency_ms(self) -> float:
        return (self.done - self.sent) * 1000


class Adapter(Protocol):
    """How the harness calls one system under test; ``call`` returns the outcome."""

    def call(
        self, lane: LaneName, op: str, object_id: str, payload: bytes, timeout_s: float
    ) -> Outcome: ...

    def close(self) -> None: ...


def classify(exc: BaseException) -> Outcome:
    if isinstance(exc, DeadlineExceeded):
        return Outcome.TIMEOUT
    if isinstance(exc, RetryableError):
        return Outcome.REJECTED
    return Outcome.ERROR


class ServiceAdapter:
    """The service's public client: awaited calls on interactive, handles on batch.

    A ``Client`` keeps a bounded pool of connections to wait on answers, so
    callers share one client per ``CALLERS_PER_CLIENT`` threads instead of all
    waiting for one pool.
    """

    CALLERS_PER_CLIENT = 32

    def __init__(self, settings: Settings, config: Config, callers: int = 0) -> None:
        self._settings = settings
        self._config = config
        # Clients for the callers expected, made before the clock starts.
        self._clients = [
            Client(CALLER, settings, config) for _ in range(-(-callers // self.CALLERS_PER_CLIENT))
        ]
        self._local = threading.local()
        self._lock = threading.Lock()
        self._threads = 0

    def _client(self) -> Client:
        client: Client | None = getattr(self._local, "client", None)
        if client is not None:
            return client
        with self._lock:
            index = self._threads // self.CALLERS_PER_CLIENT
            self._threads += 1
            if index == len(self._clients):
                self._clients.append(Client(CALLER, self._settings, self._config))
            client = self._clients[index]
        self._local.client = client
        return client

    def call(
        self, lane: LaneName, op: str, object_id: str, payload: bytes, timeout_s: float
    ) -> Outcome:
        client = self._client()
        try:
            if lane is LaneName.BATCH:
                operation: ReadOp | WriteOp = (
                    ReadOp(SCOPE, object_id, ReadMode.PRIMARY)
                    if op == "read"
                    else WriteOp(SCOPE, object_id, payload)
                )
                client.submit(operation, timeout=timeout_s).result()
            elif op == "read":
                client.read(SCOPE, object_id, mode=ReadMode.PRIMARY, timeout=timeout_s)
            else:
                client.write(SCOPE, object_id, payload, timeout=timeout_s)
        except DataServiceError as exc:
            return classify(exc)
        return Outcome.OK

    def close(self) -> None:
        for client in self._clients:
            client.close()


RateFn = Callable[[LaneName, float], float]  # (lane, seconds since start) -> requests/s


class OpenLoop:
    """Arrivals per lane at ``rate(lane, t)`` for ``duration_s``; outcomes in ``records``."""

    def __init__(
        self,
        adapter: Adapter,
        rate: RateFn,
        timeouts: dict[LaneName, float],
        ids: list[str],
        payload: bytes,
        duration_s: float,
        t0: float,
        max_callers: int,
    ) -> None:
        self._adapter = adapter
        self._rate = rate
        self._timeouts = timeouts
        self._ids = ids
        self._payload = payload
        self.duration_s = duration_s
        self.t0 = t0
        self._max_callers = max_callers
        self.records: list[RequestRecord] = []
        self.scheduled: dict[LaneName, int] = dict.fromkeys(LaneName, 0)
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
        time to create; made on the fly at the start they would lag the schedule)."""
        with self._lock:
            for _ in range(min(callers, self._max_callers)):
                thread = threading.Thread(target=self._caller, daemon=True)
                thread.name = f"caller-{len(self._callers)}"
                self._callers.append(thread)
                self._idle += 1
                thread.start()
        for lane in LaneName:
            thread = threading.Thread(target=self._schedule, args=(lane,), daemon=True)
            thread.name = f"schedule-{lane.value}"
            self._schedulers.append(thread)
            thread.start()

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
                thread = threading.Thread(target=self._caller, daemon=True)
                thread.name = f"caller-{len(self._callers)}"
                self._callers.append(thread)
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
            op = "read" if rng.random() < READ_SHARE[lane] else "write"
            try:
                outcome = self._adapter.call(
                    lane, op, rng.choice(self._ids), self._payload, self._timeouts[lane]
                )
            except Exception:  # an adapter bug must not kill the caller pool
                outcome = Outcome.ERROR
            done = time.monotonic() - self.t0
            self.records.append(RequestRecord(lane, at, sent, done, outcome))
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
            outcome = adapter.call(lane, op, rng.choice(ids), payload, timeouts[lane])
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
