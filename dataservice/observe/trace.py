"""One request's way through the stages: timed into the stage histograms,
and kept for its log line.

A :class:`Trace` starts when a worker opens a request, and is the *current*
trace of the thread working on it; the stages it passes (the caller-limits
script, the permit, the connection, the statements, the cache, the
coalescing wait, the encoding) record their time with :class:`timed` or
:func:`record`, wherever they are in the code, without being handed the trace.
A request the consumer thread passes on to the pool carries its trace with it
(:func:`resume`). Work that serves no request (a purge, a test's seeding)
has no current trace and is not timed.
"""

from __future__ import annotations

import threading
import time
from types import TracebackType

from prometheus_client import Histogram

from dataservice.observe.metrics.requests import STAGE_SECONDS, Stage

_local = threading.local()
# The labelled children, resolved once per lane: a label lookup per
# observation would cost more than the observation. Each with its stage's
# name, which an enum's ``value`` would look up again on every call.
_CHILDREN: dict[str, dict[Stage, tuple[Histogram, str]]] = {}


def _children(lane: str) -> dict[Stage, tuple[Histogram, str]]:
    children = _CHILDREN.get(lane)
    if children is None:
        children = {
            stage: (STAGE_SECONDS.labels(lane, stage.value), stage.value) for stage in Stage
        }
        _CHILDREN[lane] = children
    return children


class Trace:
    """Where one request's time went, stage by stage (milliseconds)."""

    __slots__ = (
        "_histograms",
        "caller",
        "dropped",
        "operation",
        "request_id",
        "stages",
        "started",
    )

    def __init__(self, lane: str, request_id: str) -> None:
        self.request_id = request_id
        self.caller = ""
        self.operation = ""
        # Why the request was dropped unanswered ("late", "replayed"), if it was.
        self.dropped = ""
        self.started = time.perf_counter()
        self.stages: dict[str, float] = {}
        self._histograms = _children(lane)

    def add(self, stage: Stage, seconds: float) -> None:
        histogram, name = self._histograms[stage]
        histogram.observe(seconds)
        stages = self.stages
        stages[name] = stages.get(name, 0.0) + seconds * 1000

    def elapsed_s(self) -> float:
        return time.perf_counter() - self.started


def begin(lane: str, request_id: str) -> Trace:
    """A new trace, current on this thread."""
    trace = Trace(lane, request_id)
    _local.trace = trace
    return trace


def resume(trace: Trace | None) -> None:
    """Make ``trace`` (a request handed over from another thread) current here."""
    _local.trace = trace


def current() -> Trace | None:
    trace: Trace | None = getattr(_local, "trace", None)
    return trace


def detach() -> Trace | None:
    """The current trace, no longer current on this thread."""
    trace = current()
    _local.trace = None
    return trace


def record(stage: Stage, seconds: float) -> None:
    """Add ``seconds`` in ``stage`` to the current request, if there is one."""
    trace = current()
    if trace is not None:
        trace.add(stage, seconds)


class timed:
    """Time the block as ``stage`` of the current request, however it ends."""

    __slots__ = ("_stage", "_started")

    def __init__(self, stage: Stage) -> None:
        self._stage = stage
        self._started = 0.0

    def __enter__(self) -> None:
        self._started = time.perf_counter()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        record(self._stage, time.perf_counter() - self._started)
