"""The rate algorithm (GCRA), written once for Python.

A caller's rate (:class:`~dataservice.config.rate.Rate`) is one request per
``interval_us``, with at most ``burst`` requests at once above it. Each
admitted request moves the caller's theoretical arrival time (TAT) one
interval on; a request may run at most ``burst`` intervals ahead of it. A
message of many operations is charged in one step of a rate made for it
(:meth:`~dataservice.config.rate.Rate.charged` at the gate,
:meth:`~dataservice.config.rate.Rate.paced` by a sender).

The same arithmetic in Lua is ``gcra.lua``,
which the Redis scripts include; ``tests/limits/test_limits_contract.py`` runs the
same cases against both.
"""

from __future__ import annotations

import math
import time

from dataservice.config.rate import Rate


def check(tat_us: int | None, now_us: int, rate: Rate) -> tuple[int, int]:
    """``(new TAT, 0)`` when a request may pass at ``now_us``, else ``(0, retry-after ms)``.

    Nothing is recorded: the caller stores the new TAT once every other check
    has passed too.
    """
    tat = now_us if tat_us is None or tat_us < now_us else tat_us
    allow_at = tat + rate.interval_us - rate.burst * rate.interval_us
    if allow_at > now_us:
        return 0, max(1, math.ceil((allow_at - now_us) / 1000))
    return tat + rate.interval_us, 0


def monotonic_us() -> int:
    return time.monotonic_ns() // 1000


class Arrivals:
    """Theoretical arrival times by key, in this process. Not locked: its
    owner checks and records under a lock of its own, with its other state."""

    def __init__(self) -> None:
        self._tat: dict[str, int] = {}

    def check(self, key: str, rate: Rate, now_us: int) -> tuple[int, int]:
        return check(self._tat.get(key), now_us, rate)

    def record(self, key: str, tat_us: int) -> None:
        self._tat[key] = tat_us
