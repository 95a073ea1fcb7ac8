"""What a fault run must show, checked rather than eyeballed.

- No caller waits longer than its timeout plus ``CALLER_MARGIN_S``, during the
  fault or after it (each request's latency against its lane's timeout).
- The service serves again: interactive goodput is back to 0.9 of what it was
  before the fault within ``RECOVERY_BOUND_S`` of the fault's end, and stays
  there (its mean from then to the end of the load, not one lucky second).

(The database share is the run's own verdict, sampled from PROCESSLIST.)

A fault watched after its end (``db-stall-long``, :attr:`Fault.watch_after_s`)
adds two, from the moment the server stopped until ``watch_after_s`` after it
continued (:func:`watched_end`):

- **The budget held**: no sample above the active-statement share nor above
  the connection share of the replicas alive, none above
  ``budget.max_connections``; with the sampler's figures that say whether it
  looked closely enough (its rate, its first sample after the stall, its
  longest gap), and the connections opened after it.
- **Back to capacity**: a whole second's interactive goodput at ``HELD_SHARE``
  of the lane's capacity within ``RECOVERY_BOUND_S`` of the end (the capacity
  probed before the run, not the seconds before the stall).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

from dataservice.enums import LaneName
from dataservice_tools.loadtest.faults import FAULT_BEGINS, FAULT_ENDS
from dataservice_tools.loadtest.openloop import RequestRecord
from dataservice_tools.loadtest.report import recovery_s, sample_hz
from dataservice_tools.loadtest.sampler import Sample

CALLER_MARGIN_S = 0.1
RECOVERY_BOUND_S = 5.0
HELD_SHARE = 0.9
# The samples over a share the report lists, of those after a watched fault.
LISTED = 10


def _held(series: dict[str, Any], began: float, recovered_at: float, end: float) -> float | None:
    """Interactive goodput from recovery to the end of the load, as a share of
    its mean before the fault."""
    goodput = series[LaneName.INTERACTIVE.value]["goodput"]
    before = goodput[1 : int(began)]
    # From the whole second nearest recovery: flooring it counted a second
    # spent mostly before recovery (10.0-11.0 for a recovery at 10.996), and a
    # verdict then turned on where recovery fell within its second.
    after = goodput[round(recovered_at) : int(end)] or goodput[int(recovered_at) : int(end)]
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


def watched_end(
    samples: Sequence[Sample],
    events: Mapping[str, float],
    watch_after_s: float,
    max_connections: int,
    series: dict[str, Any],
    capacity: float,
) -> dict[str, Any]:
    """The database's view from the fault's start to ``watch_after_s`` after
    its end, against the share of the replicas alive and ``max_connections``;
    interactive goodput against ``capacity`` after the end. Verdicts:
    ``within_share_through_stall_and_after``, ``interactive_back_to_capacity``."""
    began, ended = events[FAULT_BEGINS], events[FAULT_ENDS]
    until = ended + watch_after_s
    window = [s for s in samples if began <= s.t <= until]
    after = [s for s in window if s.t >= ended]
    before = [s for s in samples if s.t < began]
    opened_before = before[-1].opened_total if before else 0
    over = [s for s in window if s.active > s.share_active or s.connections > s.share_connections]
    times = [ended, *(s.t for s in after)]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    first_s = next((s for s in after if s.t >= ended + 1.0), after[-1] if after else None)
    figures: dict[str, Any] = {
        "window_s": [round(began, 3), round(until, 3)],
        "samples": len(window),
        "sample_hz_after_end": sample_hz(len(after), after[-1].t - after[0].t) if after else 0.0,
        "first_sample_after_end_ms": round((after[0].t - ended) * 1000, 1) if after else None,
        "longest_gap_after_end_ms": round(max(gaps) * 1000, 1) if after else None,
        "peak_active": max((s.active for s in window), default=None),
        "peak_connections": max((s.connections for s in window), default=None),
        "share_active": max((s.share_active for s in window), default=None),
        "share_connections": max((s.share_connections for s in window), default=None),
        "max_connections": max_connections,
        "samples_over_active_share": sum(1 for s in window if s.active > s.share_active),
        "samples_over_connection_share": sum(
            1 for s in window if s.connections > s.share_connections
        ),
        "over_share": [_listed(s) for s in over[:LISTED]],
        "new_connections_first_s_after_end": (
            None if first_s is None else first_s.opened_total - opened_before
        ),
        "new_connections_after_end": after[-1].opened_total - opened_before if after else None,
    }
    within = bool(after) and not over and max(s.connections for s in window) <= max_connections
    back = back_to_capacity_s(series, capacity, ended)
    return {
        **figures,
        "interactive_capacity_per_s": round(capacity, 1),
        "interactive_goodput_after_end": series[LaneName.INTERACTIVE.value]["goodput"][
            int(ended) : int(until) + 1
        ],
        "interactive_back_to_capacity_s": back,
        "verdicts": {
            "within_share_through_stall_and_after": within,
            "interactive_back_to_capacity": back is not None and back <= RECOVERY_BOUND_S,
        },
    }


def _listed(s: Sample) -> dict[str, Any]:
    return {
        "t": round(s.t, 3),
        "active": s.active,
        "share_active": s.share_active,
        "connections": s.connections,
        "share_connections": s.share_connections,
    }


def back_to_capacity_s(series: dict[str, Any], capacity: float, ended: float) -> float | None:
    """Seconds from ``ended`` to the end of the first whole second whose
    interactive goodput is ``HELD_SHARE`` of ``capacity`` (the second the
    fault ended in counts: it cannot reach the mark on what came before)."""
    goodput = series[LaneName.INTERACTIVE.value]["goodput"]
    for t in range(int(ended), len(goodput)):
        if goodput[t] >= HELD_SHARE * capacity:
            return round(t + 1 - ended, 2)
    return None
