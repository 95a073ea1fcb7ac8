"""How long operations take in the database, recently, per operation class.

The handler uses it to refuse, before any SQL, a request whose remaining time
is shorter than what its operation usually needs: such a request would only
run until its statement timeout, waste the permit's database time and cost a
discarded connection, and its caller would get DEADLINE_EXCEEDED anyway.
"""

from __future__ import annotations

import threading
from collections import deque

from dataservice.enums import OperationClass

WINDOW = 64
QUANTILE = 0.9


class RecentDurations:
    """The last ``WINDOW`` durations (ms) of each operation class, and their p90."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._samples = {c: deque[float](maxlen=WINDOW) for c in OperationClass}
        self._p90: dict[OperationClass, float] = dict.fromkeys(OperationClass, 0.0)

    def record(self, op_class: OperationClass, duration_ms: float) -> None:
        with self._lock:
            samples = self._samples[op_class]
            samples.append(duration_ms)
            ordered = sorted(samples)
            self._p90[op_class] = ordered[min(len(ordered) - 1, int(QUANTILE * len(ordered)))]

    def p90(self, op_class: OperationClass) -> float:
        """0 until the class has been seen: nothing is refused on a guess."""
        return self._p90[op_class]
