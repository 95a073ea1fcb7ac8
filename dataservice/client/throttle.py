"""Client-side adaptive throttling: a client stops sending what the service
would only refuse.

Per lane, over the last ``client.throttle.window_ms``, a process counts for
each caller (every ``Client`` of that caller in the process, and all their
threads, share one throttle: spread over several clients, each would see too
few requests to tell a recovered service from a refusing one) the
requests its callers made and those the service accepted (admitted at
publish: an answer comes too late, often a window later, to tell the throttle
that the service is accepting again). While the service accepts
most of what it is sent, nothing changes. Once it refuses more, each request
is refused here, before it is sent, with probability::

    max(0, (requests - k * accepts) / (requests + 1))

(the rule of Google's SRE book, "Handling Overload"), so the client sends
about ``k`` times what the service accepts however much its callers offer.
Two bounds keep the rule from doing harm: below ``MIN_REQUESTS`` in the
window nothing is refused here (so quiet a caller cannot multiply an
overload, and one refusal must not hold back half of its next requests), and
never more than ``MAX_REJECTION`` of the requests (a service that sheds
everything for a moment still receives a share, accepts it once it can, and
the throttle sees that within its window instead of starving itself of the
accepts it needs to let go). A
refusal here is the service's own error, ``ResourceExhausted`` (reason
``throttled``), with the retry-after the service last gave on that lane.

Retries follow the same accounting: a refused call is tried again only while
the lane is not being throttled and its retries in the window stay within
``RETRY_BUDGET`` of its requests, so under overload a caller learns at once
and its retries cannot multiply the overload. The window is short (seconds,
not minutes), so a service that recovers is noticed within about one window.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from dataservice.config.model import ThrottleConfig
from dataservice.enums import LaneName
from dataservice.errors import ResourceExhausted
from dataservice.refusals import LIMIT_MESSAGES, Reason

# Each window is counted in this many slices, so old counts leave it smoothly.
SLICES = 10
# Retries at most this share of a lane's requests in the window (SRE's per-client
# retry budget), and this many whatever the volume, so a quiet caller may retry.
RETRY_BUDGET = 0.1
RETRY_FLOOR = 5
# See the module's docstring.
MIN_REQUESTS = 10
MAX_REJECTION = 0.9
# The retry-after of a local refusal before the service has given one (s).
DEFAULT_RETRY_AFTER_S = 0.1


@dataclass(slots=True)
class _Slice:
    start: float = 0.0
    requests: int = 0
    accepts: int = 0
    retries: int = 0


class _LaneWindow:
    """Requests, accepts and retries over a sliding window of ``SLICES`` slices."""

    def __init__(self, window_s: float) -> None:
        self._slice_s = window_s / SLICES
        self._slices = [_Slice() for _ in range(SLICES)]
        self.retry_after_s = DEFAULT_RETRY_AFTER_S

    def current(self, now: float) -> _Slice:
        start = now - now % self._slice_s
        slot = self._slices[int(now / self._slice_s) % SLICES]
        if slot.start != start:
            slot.start, slot.requests, slot.accepts, slot.retries = start, 0, 0, 0
        return slot

    def totals(self, now: float) -> tuple[int, int, int]:
        oldest = now - self._slice_s * SLICES
        live = [s for s in self._slices if s.start > oldest]
        return (
            sum(s.requests for s in live),
            sum(s.accepts for s in live),
            sum(s.retries for s in live),
        )


class Throttle:
    """A throttle per lane, shared by the threads that use it (see :func:`for_caller`)."""

    def __init__(
        self,
        config: ThrottleConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self.config = config
        self._clock = clock
        self._rng = rng
        self._lock = threading.Lock()
        self._lanes = {lane: _LaneWindow(config.window_ms / 1000) for lane in LaneName}

    def rejection_probability(self, lane: LaneName) -> float:
        """The share of new requests refused here now."""
        with self._lock:
            requests, accepts, _ = self._lanes[lane].totals(self._clock())
        return self._probability(requests, accepts)

    def _probability(self, requests: int, accepts: int) -> float:
        if not self.config.enabled or requests < MIN_REQUESTS:
            return 0.0
        rule = (requests - self.config.k * accepts) / (requests + 1)
        return min(MAX_REJECTION, max(0.0, rule))

    def check(self, lane: LaneName, n: int = 1) -> None:
        """Pass ``n`` requests about to be sent, or refuse them all here (then
        counted: the rule needs what the callers asked for)."""
        if not self.config.enabled:
            return
        now = self._clock()
        with self._lock:
            window = self._lanes[lane]
            requests, accepts, _ = window.totals(now)
            if self._rng() >= self._probability(requests, accepts):
                return
            window.current(now).requests += n
            retry_after = window.retry_after_s
        raise ResourceExhausted(
            LIMIT_MESSAGES[Reason.THROTTLED], retry_after=retry_after, reason=Reason.THROTTLED
        )

    def outcome(
        self, lane: LaneName, sent: int, accepted: int, retry_after_s: float | None = None
    ) -> None:
        """Admission answered ``sent`` requests, accepting ``accepted``; a
        refusal's retry-after is the one to give locally from now on. Counted
        only once answered: a publish still in flight is neither, and other
        threads' checks must not take it for a refusal."""
        if not self.config.enabled:
            return
        with self._lock:
            window = self._lanes[lane]
            slot = window.current(self._clock())
            slot.requests += sent
            slot.accepts += accepted
            if retry_after_s is not None:
                window.retry_after_s = max(0.001, retry_after_s)

    def refused(self, lane: LaneName, error: ResourceExhausted, accepted: int = 0) -> None:
        """Admission refused a publish after accepting ``accepted`` of its messages.
        A refusal for the caller's own rate is the pacer's to hold back, not
        overload: only what was accepted counts."""
        if error.reason == Reason.RATE_LIMITED:
            self.outcome(lane, accepted, accepted)
        else:
            self.outcome(lane, accepted + 1, accepted, error.retry_after)

    def may_retry(self, lane: LaneName, reason: str = "") -> bool:
        """Whether a call refused for ``reason`` may try again now (and, if so,
        count the retry); the caller's own rate always may (see :meth:`refused`)."""
        if reason == Reason.RATE_LIMITED:
            return True
        now = self._clock()
        with self._lock:
            window = self._lanes[lane]
            requests, accepts, retries = window.totals(now)
            if self._probability(requests, accepts) > 0:
                return False
            budget = max(RETRY_FLOOR, RETRY_BUDGET * requests)
            if self.config.enabled and retries + 1 > budget:
                return False
            window.current(now).retries += 1
            return True


_shared: dict[tuple[str, ThrottleConfig], Throttle] = {}
_shared_lock = threading.Lock()


def for_caller(caller: str, config: ThrottleConfig) -> Throttle:
    """The throttle every client of ``caller`` in this process shares (one per
    configuration: a client configured otherwise keeps its own accounting)."""
    with _shared_lock:
        throttle = _shared.get((caller, config))
        if throttle is None:
            throttle = _shared[(caller, config)] = Throttle(config)
        return throttle
