"""Publish-side pacing: each caller held to its rate where its messages are
published, before they take a place in a queue.

The admission script (``admit.lua``) applies the caller's rate (GCRA) to the
caller named in a message's ``ds_caller`` header, on ``ds:pace:<caller>``. It
is advisory: the workers' gate is the authority, on keys no caller reaches.
Taking one request's worth at a time costs every publish a read and a write of
that key. So a process takes a *lease* instead: one step takes this request
and up to :data:`LEASE_MAX` - 1 more, as far as the rate and burst allow at
that moment, and the process's next publishes of that caller spend them
without the key. A lease is charged in full when it is taken. What is not
spent within the time it stands for (its requests times the interval, and one
interval more; at least :data:`LEASE_HOLD_S`) is dropped, never carried on.

A lease comes only from the burst's headroom: a caller at its rate is paced
one request at a time, exactly as without leases. Its processes together can
publish at most their unspent leases (a few requests each) beyond what the
rate and burst allow, and the gate still holds those to the rate. A batch
message is paced by itself, every time: it is one step of many requests
already.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dataservice.config.rate import Rate

# The most requests one step takes; with a burst of b, at most b // 4 of it.
LEASE_MAX = 8
# The least time a lease may be spent in.
LEASE_HOLD_S = 0.1


@dataclass(frozen=True, slots=True)
class PaceStep:
    """What ``admit.lua`` applies to one message: its rate, and how many more
    requests' worth it may take for the process's next publishes."""

    rate: Rate
    lease: int


def lease_size(burst: float) -> int:
    """The requests' worth beyond one a step may take: none for a small burst,
    so a caller allowed a few at once keeps them for whichever process sends."""
    return max(0, min(LEASE_MAX, int(burst) // 4) - 1)


class Pacing:
    """The callers' rates (caller -> (interval µs, burst), as
    :func:`dataservice.limits.admission.caller_pacing` gives them) and this
    process's leases. Thread-safe: one is shared by a client's threads."""

    def __init__(self, rates: Mapping[str, Sequence[Any]]) -> None:
        self._rates = {caller: Rate(int(rate[0]), float(rate[1])) for caller, rate in rates.items()}
        # caller -> (requests left, until when they may be spent: monotonic s)
        self._leases: dict[str, tuple[int, float]] = {}
        self._lock = threading.Lock()

    def step(self, caller: object, ops: int) -> PaceStep | None:
        """How ``admit.lua`` paces a message of ``caller`` carrying ``ops``
        operations; None when it does not: an unknown caller, or one whose
        lease in this process pays for it (spent here)."""
        if not isinstance(caller, str) or (rate := self._rates.get(caller)) is None:
            return None
        if ops > 1:
            return PaceStep(rate.paced(ops), 0)
        with self._lock:
            left, until = self._leases.get(caller, (0, 0.0))
            if left > 0 and time.monotonic() < until:
                self._leases[caller] = (left - 1, until)
                return None
        return PaceStep(rate, lease_size(rate.burst))

    def granted(self, caller: object, requests: int) -> None:
        """``admit.lua`` took ``requests`` more for ``caller``: this process's
        next publishes spend them, within the time they stand for."""
        if not isinstance(caller, str) or (rate := self._rates.get(caller)) is None:
            return
        if requests <= 0:
            return
        with self._lock:
            # The time they stand for, and one interval more (a process sending
            # at the rate spends its last one at the end of that span), or
            # LEASE_HOLD_S for a caller whose interval is a few microseconds.
            span = max((requests + 1) * rate.interval_us / 1e6, LEASE_HOLD_S)
            self._leases[caller] = (requests, time.monotonic() + span)
