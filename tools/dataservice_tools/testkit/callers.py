"""Closed-loop callers: threads that own their clients for their whole life and
make a given number of calls back to back when told, all released together.

A bench builds one :class:`Caller` per thread with a factory per system (each
factory makes that thread's call), then measures a round of one system with
:func:`run_round`: every caller makes its calls, and the round's latencies,
its steady window and the CPU the processes used come back as a
:class:`~dataservice_tools.testkit.series.RunResult`.
"""

from __future__ import annotations

import queue
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from dataservice_tools.testkit.cpu import Components
from dataservice_tools.testkit.series import RunResult

Call = Callable[[], None]
# A caller gives up on a round after this many failed calls (a dead worker
# would otherwise cost a full deadline per remaining request).
MAX_ERRORS_PER_ROUND = 10


@dataclass(frozen=True)
class Job:
    system: str
    count: int
    barrier: threading.Barrier
    out: queue.Queue[Outcome]


@dataclass(frozen=True)
class Outcome:
    latencies_ns: list[int]
    ends_ns: list[int]
    errors: int
    first_error: str | None


class Caller(threading.Thread):
    """A caller thread that owns its clients for its whole life.

    Stock Celery keeps its result backend (and its pub/sub connection) per
    thread, and the service client its connection pools per ``Client``: a
    thread made per round would measure their set-up.
    """

    def __init__(self, index: int, factories: dict[str, Callable[[random.Random], Call]]) -> None:
        super().__init__(name=f"caller-{index}", daemon=True)
        self._factories = factories
        self._rng = random.Random(index)
        self.jobs: queue.Queue[Job | None] = queue.Queue()
        self.ready = threading.Event()
        self.failure: BaseException | None = None

    def run(self) -> None:
        try:
            calls = {name: make(self._rng) for name, make in self._factories.items()}
        except BaseException as exc:
            self.failure = exc
            raise
        finally:
            self.ready.set()
        while (job := self.jobs.get()) is not None:
            call = calls[job.system]
            latencies: list[int] = []
            ends: list[int] = []
            errors = 0
            first_error: str | None = None
            clock = time.perf_counter_ns
            job.barrier.wait()
            for _ in range(job.count):
                started = clock()
                try:
                    call()
                except Exception as exc:
                    errors += 1
                    first_error = first_error or f"{type(exc).__name__}: {exc}"
                    if errors >= MAX_ERRORS_PER_ROUND:
                        break
                    continue
                ended = clock()
                latencies.append(ended - started)
                ends.append(ended)
            job.out.put(Outcome(latencies, ends, errors, first_error))


def run_round(
    callers: list[Caller], system: str, per_caller: int, components: Components
) -> RunResult:
    """``per_caller`` calls of ``system`` from each of ``callers``, released together."""
    out: queue.Queue[Outcome] = queue.Queue()
    barrier = threading.Barrier(len(callers) + 1)
    for caller in callers:
        caller.jobs.put(Job(system, per_caller, barrier, out))
    before = components.snapshot(system)
    barrier.wait()
    started = time.perf_counter_ns()
    results = [out.get() for _ in callers]
    after = components.snapshot(system)
    latencies = [x for r in results for x in r.latencies_ns]
    all_ends = [r.ends_ns for r in results]
    first_done = min((ends[-1] for ends in all_ends if ends), default=started)
    last_done = max((ends[-1] for ends in all_ends if ends), default=started)
    cpu: dict[str, float | None] = {}
    for part, b in before.items():
        a = after[part]
        cpu[part] = None if a is None or b is None else a - b
    return RunResult(
        latencies_ns=latencies,
        window_s=(first_done - started) / 1e9,
        window_count=sum(1 for ends in all_ends for end in ends if end <= first_done),
        wall_s=(last_done - started) / 1e9,
        errors=sum(r.errors for r in results),
        first_error=next((r.first_error for r in results if r.first_error), None),
        cpu_s=cpu,
    )
