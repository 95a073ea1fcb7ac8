"""Recovery after a scenario's incident (a drop of every connection, the
database slowed down): how long until goodput is back.

Goodput is counted over a trailing window of ``WINDOW_S`` seconds (ok answers
by completion time, per lane), evaluated every ``STEP_S``. Only windows wholly
after the event count, so answers from before it never make it look
recovered: the earliest possible recovery is ``WINDOW_S``. The recovery time is
the end of the first such window at the target. Goodput *held* if its mean from
the start of that window to the end of the offered load is at the target too:
a lane that reaches it and then collapses (a queue that grew past its callers'
timeout) recovered but did not hold. The target is
``SHARE`` of the capacity that applies after the event (the probed capacity at
the slower speed after a slow-down, the starting capacity otherwise), or of
the offered rate if that is lower (a lane offered 60 % of its capacity cannot
deliver more). The verdict: every lane recovered within ``LIMIT_S`` of the
event, and held.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from typing import Any

from dataservice.enums import LaneName
from dataservice_tools.loadtest.openloop import Outcome, RequestRecord
from dataservice_tools.loadtest.scenarios import Scenario

WINDOW_S = 2.0
STEP_S = 0.1
SHARE = 0.9
LIMIT_S = 10.0
# The chart's rolling-goodput line is drawn at this resolution.
SERIES_STEP_S = 0.5


def windowed_goodput(done: Sequence[float], end: float, window_s: float = WINDOW_S) -> float:
    """Ok answers per second in (end - window_s, end]; ``done`` sorted."""
    count = bisect.bisect_right(done, end) - bisect.bisect_right(done, end - window_s)
    return count / window_s


def lane_recovery(
    done: Sequence[float], event_t: float, target: float, end_s: float
) -> dict[str, Any]:
    """The recovery time (the first window at ``target``), whether goodput held
    (its mean from the start of that window to ``end_s`` is at the target),
    and the lowest windows after the event and after the recovery."""
    recovered: float | None = None
    lowest: float | None = None
    lowest_after: float | None = None
    steps = int((end_s - event_t - WINDOW_S) / STEP_S + 1e-9)
    for n in range(max(0, steps + 1)):
        t = event_t + WINDOW_S + n * STEP_S
        goodput = windowed_goodput(done, t)
        lowest = goodput if lowest is None else min(lowest, goodput)
        if recovered is None:
            if goodput >= target:
                recovered = t - event_t
        else:
            lowest_after = goodput if lowest_after is None else min(lowest_after, goodput)
    held: float | None = None
    if recovered is not None:
        since = event_t + recovered - WINDOW_S
        held = windowed_goodput(done, end_s, end_s - since)
    return {
        "target_per_s": round(target, 1),
        "recovery_s": None if recovered is None else round(recovered, 2),
        "mean_goodput_since_per_s": None if held is None else round(held, 1),
        "held": held is not None and held >= target,
        "lowest_window_goodput_per_s": None if lowest is None else round(lowest, 1),
        "lowest_window_after_recovery_per_s": (
            None if lowest_after is None else round(lowest_after, 1)
        ),
    }


def recovery_report(
    scenario: Scenario,
    records: Sequence[RequestRecord],
    events: Mapping[str, float],
    capacity: Mapping[LaneName, float],
    capacity_after: Mapping[LaneName, float] | None,
    duration_s: float,
) -> dict[str, Any] | None:
    """Per lane: the target, the recovery time and the lowest window after the
    event; the rolling series for the chart. None without an incident."""
    incident = scenario.incident
    if incident is None or incident[0] not in events:
        return None
    name, fraction = incident
    event_t = events[name]
    after = capacity_after or capacity
    lanes: dict[str, Any] = {}
    series: dict[str, Any] = {}
    times = [
        round(SERIES_STEP_S * n, 2)
        for n in range(int(WINDOW_S / SERIES_STEP_S), int(duration_s / SERIES_STEP_S) + 1)
    ]
    series["t"] = times
    for lane in LaneName:
        offered = scenario.factor(lane, fraction) * capacity[lane]
        if offered <= 0:
            continue
        done = sorted(r.done for r in records if r.lane is lane and r.outcome is Outcome.OK)
        target = SHARE * min(after[lane], offered)
        lanes[lane.value] = {
            "capacity_after_per_s": round(after[lane], 1),
            "offered_after_per_s": round(offered, 1),
            **lane_recovery(done, event_t, target, duration_s),
        }
        series[lane.value] = [round(windowed_goodput(done, t), 1) for t in times]
    times_s = [lane["recovery_s"] for lane in lanes.values()]
    return {
        "event": name,
        "at_s": event_t,
        "window_s": WINDOW_S,
        "share_of_capacity": SHARE,
        "limit_s": LIMIT_S,
        "capacity_after": "probed at the slower speed"
        if capacity_after
        else "the starting capacity",
        "lanes": lanes,
        "recovery_s": None if None in times_s else max(times_s, default=None),
        "recovered_within_limit": bool(times_s)
        and all(t is not None and t <= LIMIT_S for t in times_s),
        "held": bool(lanes) and all(lane["held"] for lane in lanes.values()),
        "rolling_goodput": series,
    }
