"""A caller's rate, as the rate algorithm (GCRA, :mod:`dataservice.limits.gcra`
and ``limits/gcra.lua``) takes it: one request per ``interval_us``, with at
most ``burst`` requests at once above it.

A message carrying ``n`` operations (a batch) is charged as ``n`` requests by
one step of the same arithmetic, with an interval ``n`` times as long: the
TAT moves ``n`` intervals on. When it may pass depends on who asks:

- the service (the gate, :meth:`Rate.charged`) lets it pass whenever one
  request would, the rest taken as debt the caller's next requests wait out.
  A message larger than the burst still passes, once;
- a sender (:meth:`Rate.paced`) waits until ``min(n, burst)`` requests in a
  row would pass. Pacing and the gate are two clocks charging the same
  message at different moments; the gate's ``n - 1`` intervals of slack are
  what keep the time between them from refusing a paced batch.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Rate:
    """One request per ``interval_us`` microseconds, ``burst`` at once above it."""

    interval_us: int
    # A float only once charged for several requests (:meth:`charged`).
    burst: float

    @classmethod
    @functools.lru_cache(maxsize=1024)
    def per_second(cls, rate_per_s: float, burst: int) -> Rate:
        """Computed once per distinct limit (every request asks for its caller's)."""
        return cls(max(1, round(1_000_000 / rate_per_s)), burst)

    def share(self, parts: int) -> Rate:
        """One of ``parts`` equal shares; each keeps a burst of at least one."""
        return Rate(self.interval_us * parts, max(1, int(self.burst // parts)))

    def charged(self, n: int) -> Rate:
        """The service's rate for a message of ``n`` requests: it passes when
        one request would and moves the TAT ``n`` intervals on."""
        return self._step(n, 1)

    def paced(self, n: int) -> Rate:
        """A sender's rate for a message of ``n`` requests: it passes once
        ``min(n, burst)`` requests in a row would, and moves the TAT ``n``
        intervals on."""
        return self._step(n, min(n, self.burst))

    def _step(self, n: int, ready: float) -> Rate:
        # One step of n intervals passes when the TAT is at most
        # (burst' - 1) * n intervals ahead; that is (burst - ready) intervals.
        if n <= 1:
            return self
        return Rate(self.interval_us * n, 1 + (self.burst - ready) / n)
