"""How long things took recently, per kind, and their p90.

The database's time per operation class lets the handler refuse, before any
SQL, a request whose remaining time is shorter than what its operation
usually needs: such a request would only run until its statement timeout,
waste the permit's database time and cost a discarded connection, and its
caller would get DEADLINE_EXCEEDED anyway. A whole request's time per
operation tells admission how long a request takes once it leaves the queue
(:mod:`dataservice.limits.admission`).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Hashable
from typing import Generic, TypeVar

WINDOW = 64
QUANTILE = 0.9

K = TypeVar("K", bound=Hashable)


class RecentDurations(Generic[K]):
    """The last ``WINDOW`` durations (ms) of each kind, and their p90."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._samples: dict[K, deque[float]] = {}
        self._p90: dict[K, float] = {}
        self._recorded = 0

    def record(self, kind: K, duration_ms: float) -> None:
        with self._lock:
            samples = self._samples.get(kind)
            if samples is None:
                samples = self._samples[kind] = deque(maxlen=WINDOW)
            samples.append(duration_ms)
            ordered = sorted(samples)
            self._p90[kind] = ordered[min(len(ordered) - 1, int(QUANTILE * len(ordered)))]
            self._recorded += 1

    def p90(self, kind: K) -> float:
        """0 until the kind has been seen: nothing is refused on a guess."""
        return self._p90.get(kind, 0.0)

    def snapshot(self) -> tuple[int, dict[K, float]]:
        """How many durations were recorded so far, and each kind's p90."""
        with self._lock:
            return self._recorded, dict(self._p90)
