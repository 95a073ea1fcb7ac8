"""Keeps a caller's requests within its rate in this process, before they are sent.

Two things, shared by every client of a caller in the process:

- the caller's own rate and burst from ``queues.yml`` (the same GCRA the
  service applies across all its callers' processes), so one process alone
  never sends more than the service would accept;
- after the service refused the caller for its rate (several processes
  together were over it), nothing until that refusal's retry-after.

A request held back is refused here with ``ResourceExhausted`` (reason
``rate_limited``), as the service would have, without being sent: a caller
far above its rate costs the service almost nothing.
"""

from __future__ import annotations

import threading

from dataservice.config.rate import Rate
from dataservice.errors import ResourceExhausted
from dataservice.limits.gcra import Arrivals, monotonic_us
from dataservice.refusals import LIMIT_MESSAGES, Reason


class Pacer:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._arrivals = Arrivals()
        # Per caller: nothing is sent before this (monotonic µs).
        self._until: dict[str, int] = {}

    def take(self, caller: str, rate: Rate | None) -> None:
        """Pass one request of ``caller`` (held to ``rate`` when given), or raise."""
        now = monotonic_us()
        with self._lock:
            wait_us = self._until.get(caller, 0) - now
            if wait_us <= 0 and rate is not None:
                tat, retry_ms = self._arrivals.check(caller, rate, now)
                if retry_ms:
                    wait_us = retry_ms * 1000
                else:
                    self._arrivals.record(caller, tat)
        if wait_us > 0:
            raise ResourceExhausted(
                LIMIT_MESSAGES[Reason.RATE_LIMITED] + "; not sent",
                retry_after=wait_us / 1_000_000,
                reason=Reason.RATE_LIMITED,
            )

    def clear(self) -> None:
        """Forget every caller's pace and hold (a process that starts over)."""
        with self._lock:
            self._arrivals = Arrivals()
            self._until.clear()

    def refused(self, caller: str, retry_after: float) -> None:
        """The service refused ``caller`` for its rate: hold it back that long."""
        until = monotonic_us() + int(retry_after * 1_000_000)
        with self._lock:
            if until > self._until.get(caller, 0):
                self._until[caller] = until


PACER = Pacer()
