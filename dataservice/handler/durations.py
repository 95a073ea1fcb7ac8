"""How long things took recently, per kind: their p90, and their mean.

The database's time per operation class lets the handler refuse, before any
SQL, a request whose remaining time is shorter than what its operation
usually needs: such a request would only run until its statement timeout,
waste the permit's database time and cost a discarded connection, and its
caller would get DEADLINE_EXCEEDED anyway. A whole request's time per
operation tells admission how long a request takes once it leaves the queue
(:mod:`dataservice.limits.admission`): the p90 for the request's own time,
and the mean for how many the workers hold at once (Little's law wants the
mean: the p90 would count a lane's slowest requests as all of them).

Only successes are recorded, so an estimate that nothing renews is forgotten
after ``MAX_AGE_S``: a few slow operations (a reconnect, a stalled database)
must not leave a p90 longer than every request's remaining time, which would
refuse every request, record nothing new and hold that p90 for good.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from typing import Generic, NamedTuple, TypeVar

WINDOW = 64
QUANTILE = 0.9
# A kind's p90 is worked out again after this many new durations: sorting the
# window on every request would cost more than the estimate is worth.
REFRESH_EVERY = 8
# A kind with no duration recorded for this long has no estimate (p90 0).
MAX_AGE_S = 5.0

K = TypeVar("K", bound=Hashable)


class Recent(NamedTuple):
    """A kind's recent durations (ms), summed up."""

    p90: float
    mean: float


_NONE = Recent(0.0, 0.0)


class RecentDurations(Generic[K]):
    """The last ``WINDOW`` durations (ms) of each kind: their p90 and mean."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._samples: dict[K, deque[float]] = {}
        self._recent: dict[K, Recent] = {}
        self._last: dict[K, float] = {}
        # Durations recorded since each kind's p90 was last worked out.
        self._fresh: dict[K, int] = {}
        self._recorded = 0

    def record(self, kind: K, duration_ms: float) -> None:
        with self._lock:
            samples = self._samples.get(kind)
            if samples is None:
                samples = self._samples[kind] = deque(maxlen=WINDOW)
            samples.append(duration_ms)
            # Worked out when asked, and again every few durations: service
            # times are recorded per request and read once a second.
            fresh = self._fresh.get(kind, 0) + 1
            if fresh >= REFRESH_EVERY or len(samples) < REFRESH_EVERY:
                self._recent.pop(kind, None)
                fresh = 0
            self._fresh[kind] = fresh
            self._last[kind] = self._clock()
            self._recorded += 1

    def p90(self, kind: K) -> float:
        """0 until the kind has been seen, and again once nothing has renewed
        it for ``MAX_AGE_S``: nothing is refused on a guess or an old figure."""
        return self.recent(kind).p90

    def recent(self, kind: K) -> Recent:
        """The kind's p90 and mean; both 0 as :meth:`p90` says."""
        last = self._last.get(kind)
        if last is None:
            return _NONE
        if self._clock() - last > MAX_AGE_S:
            with self._lock:
                if self._last.get(kind) == last:
                    del self._samples[kind], self._last[kind]
                    self._recent.pop(kind, None)
            return _NONE
        cached = self._recent.get(kind)
        if cached is not None:
            return cached
        with self._lock:
            samples = self._samples.get(kind)
            if not samples:
                return _NONE
            ordered = sorted(samples)
            p90 = ordered[min(len(ordered) - 1, int(QUANTILE * len(ordered)))]
            value = self._recent[kind] = Recent(p90, sum(ordered) / len(ordered))
            return value

    def snapshot(self) -> tuple[int, dict[K, Recent]]:
        """How many durations were recorded so far, and each kind's current figures."""
        with self._lock:
            kinds = list(self._samples)
        return self._recorded, {kind: r for kind in kinds if (r := self.recent(kind)).p90 > 0}
