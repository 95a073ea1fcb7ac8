"""Figures from one run: per-lane outcomes and latency, the database's view,
per-second series, the connection ramp, and the JSON report (the chart is
:mod:`.chart`'s)."""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from dataservice.enums import LaneName
from dataservice_tools.loadtest.openloop import Outcome, RequestRecord
from dataservice_tools.loadtest.sampler import Sample
from dataservice_tools.testkit.series import percentile


def sample_hz(count: int, span_s: float) -> float:
    """How often ``count`` samples over ``span_s`` seconds were taken."""
    return round((count - 1) / span_s, 1) if span_s > 0 else 0.0


def _r(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


_RATES = {
    "rejection": Outcome.REJECTED,
    "unavailable": Outcome.UNAVAILABLE,
    "timeout": Outcome.TIMEOUT,
    "error": Outcome.ERROR,
}


def lane_stats(
    records: Iterable[RequestRecord], lane: LaneName, start: float, end: float
) -> dict[str, Any]:
    """Outcomes of the lane's requests scheduled in [start, end) seconds of the run."""
    mine = [r for r in records if r.lane is lane and start <= r.scheduled < end]
    span = max(end - start, 1e-9)
    counts = {o.value: sum(1 for r in mine if r.outcome is o) for o in Outcome}
    ok_ms = [r.latency_ms for r in mine if r.outcome is Outcome.OK]
    # How long a caller waited to learn it was refused: a refusal is only
    # useful if it is fast (retries inside the call included).
    refused_ms = [r.latency_ms for r in mine if r.outcome is Outcome.REJECTED]
    attempts = len(mine)
    return {
        "window_s": [round(start, 2), round(end, 2)],
        "attempts": attempts,
        "completions": attempts - counts[Outcome.TIMEOUT.value],
        **counts,
        "offered_per_s": round(attempts / span, 1),
        "goodput_per_s": round(counts[Outcome.OK.value] / span, 1),
        **{
            f"{name}_rate": round(counts[outcome.value] / attempts, 4) if attempts else 0
            for name, outcome in _RATES.items()
        },
        "p50_ms": _r(percentile(ok_ms, 50)),
        "p95_ms": _r(percentile(ok_ms, 95)),
        "p99_ms": _r(percentile(ok_ms, 99)),
        "max_ms": _r(max(ok_ms) if ok_ms else None),
        "refused_p50_ms": _r(percentile(refused_ms, 50)),
        "refused_p99_ms": _r(percentile(refused_ms, 99)),
        "refused_by_reason": dict(
            Counter(r.reason or "unsaid" for r in mine if r.outcome is Outcome.REJECTED)
        ),
    }


def per_second(records: Sequence[RequestRecord], seconds: int) -> dict[str, Any]:
    """Per lane: arrivals per second of schedule; per second of completion, ok
    answers (goodput), their latency p50/p99, and each other outcome."""
    series: dict[str, Any] = {"t": list(range(seconds))}
    others = [o for o in Outcome if o is not Outcome.OK]
    for lane in LaneName:
        buckets: list[list[float]] = [[] for _ in range(seconds)]
        offered = [0] * seconds
        ended = {o: [0] * seconds for o in others}
        for r in records:
            if r.lane is not lane:
                continue
            if 0 <= int(r.scheduled) < seconds:
                offered[int(r.scheduled)] += 1
            second = int(r.done)
            if not 0 <= second < seconds:
                continue
            if r.outcome is Outcome.OK:
                buckets[second].append(r.latency_ms)
            else:
                ended[r.outcome][second] += 1
        series[lane.value] = {
            "offered": offered,
            "goodput": [len(b) for b in buckets],
            **{o.value: ended[o] for o in others},
            "p50_ms": [_r(percentile(b, 50)) for b in buckets],
            "p99_ms": [_r(percentile(b, 99)) for b in buckets],
        }
    return series


# New connections are also counted per 100 ms: a burst that opens a pool's
# worth in a few milliseconds shows as the rate it really had, which a
# per-second count spreads over the whole second.
FINE_BIN_S = 0.1


def new_connections_fine(samples: Sequence[Sample]) -> list[int]:
    """New connections per ``FINE_BIN_S`` of the run, from the server's totals."""
    if not samples:
        return []
    bins = [0] * (math.floor(samples[-1].t / FINE_BIN_S) + 1)
    previous = 0
    for s in samples:
        index = math.floor(s.t / FINE_BIN_S)
        if index >= 0:
            bins[index] += s.opened_total - previous
        previous = s.opened_total
    return bins


def database_stats(samples: Sequence[Sample], seconds: int) -> dict[str, Any]:
    """Peaks, share violations and new connections per second, from the samples."""
    if not samples:
        return {"samples": 0}
    over_conns = [s for s in samples if s.connections > s.share_connections]
    over_active = [s for s in samples if s.active > s.share_active]
    opened_at: list[int] = [0] * seconds
    max_conns = [0] * seconds
    max_active = [0] * seconds
    share_active = [0] * seconds
    share_conns = [0] * seconds
    previous = 0
    for s in samples:
        second = math.floor(s.t)
        if not 0 <= second < seconds:
            continue
        opened_at[second] += s.opened_total - previous
        previous = s.opened_total
        max_conns[second] = max(max_conns[second], s.connections)
        max_active[second] = max(max_active[second], s.active)
        share_active[second] = max(share_active[second], s.share_active)
        share_conns[second] = max(share_conns[second], s.share_connections)
    span = samples[-1].t - samples[0].t
    fine = new_connections_fine(samples)
    return {
        "samples": len(samples),
        "sample_hz": sample_hz(len(samples), span),
        "peak_connections": max(s.connections for s in samples),
        "peak_active": max(s.active for s in samples),
        "peak_share_connections": max(s.share_connections for s in samples),
        "peak_share_active": max(s.share_active for s in samples),
        "samples_over_connection_share": len(over_conns),
        "samples_over_active_share": len(over_active),
        "new_connections_total": samples[-1].opened_total,
        "peak_new_connections_per_s": max(opened_at),
        "peak_new_connections_per_s_over_100ms": round(max(fine, default=0) / FINE_BIN_S),
        "series": {
            "new_connections": opened_at,
            "new_connections_per_100ms": fine,
            "max_connections": max_conns,
            "max_active": max_active,
            "share_active": share_active,
            "share_connections": share_conns,
        },
    }


def reconnect_ramp(
    samples: Sequence[Sample],
    kill_t: float,
    processes: int,
    burst: int,
    rate_per_s: float,
    tolerance: int,
) -> dict[str, Any]:
    """New connections after the kill against the limiter's bound.

    Each process's token bucket holds at most ``burst`` tokens and refills at
    ``rate_per_s``, so by ``s`` seconds after the kill all processes together
    may have opened at most ``processes * (burst + rate_per_s * s)``.
    """
    after = [s for s in samples if s.t >= kill_t]
    if not after:
        return {"checked": False}
    base = after[0].opened_total
    worst_margin = math.inf
    worst_at = 0.0
    per_second: list[int] = []
    for s in after:
        elapsed = s.t - kill_t
        opened = s.opened_total - base
        bound = processes * (burst + rate_per_s * elapsed) + tolerance
        if bound - opened < worst_margin:
            worst_margin, worst_at = bound - opened, elapsed
        second = int(elapsed)
        while len(per_second) <= second:
            per_second.append(0)
        per_second[second] = opened - sum(per_second[:second])
    return {
        "checked": True,
        "processes": processes,
        "bound": f"{processes} x ({burst} + {rate_per_s:g}/s x t) + {tolerance}",
        "opened_after_kill": after[-1].opened_total - base,
        "new_connections_per_s_after_kill": per_second,
        "within_bound": worst_margin >= 0,
        "tightest_margin": round(worst_margin, 1),
        "tightest_at_s": round(worst_at, 2),
    }


def recovery_s(series: dict[str, Any], lane: LaneName, kill_t: float, seconds: int) -> float | None:
    """Seconds after the kill until a second's goodput is back to 90% of the
    seconds before: of their goodput, or of what was offered in them if that is
    less (the first second's catch-up, answers to requests sent in second 0,
    must not raise the bar above what callers ask)."""
    goodput = series[lane.value]["goodput"]
    offered = series[lane.value]["offered"]
    before = range(1, min(int(kill_t), len(goodput)))
    if not before:
        return None
    served, asked = sum(goodput[t] for t in before), sum(offered[t] for t in before)
    target = 0.9 * min(served, asked) / len(before)
    for t in range(int(kill_t) + 1, seconds):
        if goodput[t] >= target and offered[t] > 0:
            return round(t + 1 - kill_t, 2)
    return None


def write_json(path: Path, report: dict[str, Any]) -> None:
    path.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
