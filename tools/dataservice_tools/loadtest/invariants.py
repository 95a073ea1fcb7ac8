"""What a fault run must show, checked rather than eyeballed.

- No caller waits longer than its timeout plus ``CALLER_MARGIN_S``, during the
  fault or after it (each request's latency against its lane's timeout).
- The service serves again: interactive goodput is back to 0.9 of what it was
  before the fault within ``RECOVERY_BOUND_S`` of the fault's end, and stays
  there (its mean from then to the end of the load, not one lucky second).

(The database share is the run's own verdict, sampled from PROCESSLIST.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dataservice.enums import LaneName
from dataservice_tools.loadtest.faults import FAULT_BEGINS, FAULT_ENDS
from dataservice_tools.loadtest.openloop import RequestRecord
from dataservice_tools.loadtest.report import recovery_s

CALLER_MARGIN_S = 0.1
RECOVERY_BOUND_S = 5.0
HELD_SHARE = 0.9


def _held(series: dict[str, Any], began: float, recovered_at: float, end: float) -> float | None:
    """Interactive goodput from recovery to the end of the load, as a share of
    its mean before the fault."""
    goodput = series[LaneName.INTERACTIVE.value]["goodput"]
    before = goodput[1 : int(began)]
    after = goodput[int(recovered_at) : int(end)]
    if not before or not after or sum(before) == 0:
        return None
    ratio = (sum(after) / len(after)) / (sum(before) / len(before))
    return round(float(ratio), 2)


def slowest_per_second(
    records: Sequence[RequestRecord], timeouts: Mapping[LaneName, float], seconds: int
) -> list[float | None]:
    """Per second of completion: the longest call's time past its timeout (ms;
    negative while within it), over both lanes."""
    slowest: list[float | None] = [None] * seconds
    for r in records:
        second = int(r.done)
        if not 0 <= second < seconds:
            continue
        over = r.latency_ms - timeouts[r.lane] * 1000
        current = slowest[second]
        slowest[second] = over if current is None else max(current, over)
    return [None if s is None else round(s, 1) for s in slowest]


def fault_report(
    fault: str,
    events: Mapping[str, float],
    records: Sequence[RequestRecord],
    timeouts: Mapping[LaneName, float],
    series: dict[str, Any],
    seconds: int,
    duration_s: float,
    settles_after_s: float = 0.0,
) -> dict[str, Any]:
    """The fault's figures and the invariants' verdicts. Recovery is measured
    from the fault's end, or from ``settles_after_s`` after its start if that
    is later (:meth:`Fault.settles_after_s`)."""
    ended = events.get(FAULT_ENDS)
    if ended is not None:
        ended = max(ended, events.get(FAULT_BEGINS, 0.0) + settles_after_s)
    worst = max(records, key=lambda r: r.latency_ms - timeouts[r.lane] * 1000, default=None)
    over_ms = None if worst is None else worst.latency_ms - timeouts[worst.lane] * 1000
    recovered = None if ended is None else recovery_s(series, LaneName.INTERACTIVE, ended, seconds)
    held = None
    if ended is not None and recovered is not None:
        held = _held(series, events.get(FAULT_BEGINS, 0.0), ended + recovered, duration_s)
    return {
        "fault": fault,
        "began_s": events.get(FAULT_BEGINS),
        "ended_s": events.get(FAULT_ENDS),
        "recovery_from_s": None if ended is None else round(ended, 2),
        "slowest_past_timeout_ms": None if over_ms is None else round(over_ms, 1),
        "slowest_call": None
        if worst is None
        else {
            "lane": worst.lane.value,
            "sent_s": round(worst.sent, 2),
            "latency_ms": round(worst.latency_ms, 1),
            "outcome": worst.outcome.value,
        },
        "slowest_past_timeout_ms_per_s": slowest_per_second(records, timeouts, seconds),
        "recovery_s": recovered,
        "goodput_after_recovery": held,
        "verdicts": {
            "no_caller_past_its_timeout": over_ms is not None and over_ms <= CALLER_MARGIN_S * 1000,
            "serves_again_within_bound": recovered is not None
            and recovered <= RECOVERY_BOUND_S
            and held is not None
            and held >= HELD_SHARE,
        },
    }
