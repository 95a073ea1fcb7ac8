"""Open-loop reads for the flood runs, on the load harness's generator
(:mod:`dataservice_tools.loadtest.openloop`), and the figures drawn from them.

One caller's reads arrive at evenly spaced instants whatever the answers do,
from a fixed pool of caller threads over the clients given. Outcomes are the
generator's: ``rejected`` (ResourceExhausted) is what the summaries call
``exhausted``; every other failure is ``other``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dataservice.client import Client
from dataservice.enums import LaneName
from dataservice_tools.loadtest.openloop import LAG_TOLERANCE_S, OpenLoop, Outcome, RequestRecord
from dataservice_tools.loadtest.service import ServiceAdapter
from dataservice_tools.testkit.series import percentile

TIMEOUT_S = 2.0
LANE = LaneName.INTERACTIVE


def open_loop(
    clients: Sequence[Client],
    scope: str,
    ids: Sequence[str],
    rate: float,
    t0: float,
    seconds: float,
    threads: int,
) -> list[RequestRecord]:
    """Reads at ``rate``/s from monotonic ``t0`` for ``seconds``; every record,
    once each request is answered or has timed out."""
    # As many threads on each client as spreads them over all of them.
    adapter = ServiceAdapter(clients, scope=scope, per_client=-(-threads // len(clients)))
    loop = OpenLoop(
        adapter,
        lambda _lane, _t: rate,
        {LANE: TIMEOUT_S},
        ids,
        b"",
        seconds,
        t0,
        max_callers=threads,
        read_share={LANE: 1.0},
    )
    loop.start(threads)
    loop.join()
    return loop.records


def _r(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value, digits)


def _common(records: Sequence[RequestRecord]) -> dict[str, Any]:
    ok = sum(1 for r in records if r.outcome is Outcome.OK)
    exhausted = sum(1 for r in records if r.outcome is Outcome.REJECTED)
    sent = [r.sent for r in records]
    span = max(sent) - min(sent) if len(sent) > 1 else 0.0
    lags = [r.sent - r.scheduled for r in records]
    ok_ms = [r.latency_ms for r in records if r.outcome is Outcome.OK]
    return {
        "requests": len(records),
        "span_s": round(span, 3),
        "sent_per_s": round(len(records) / span, 1) if span else 0.0,
        "ok": ok,
        "exhausted": exhausted,
        "other": len(records) - ok - exhausted,
        "other_first": next(
            (r.detail for r in records if r.outcome not in (Outcome.OK, Outcome.REJECTED)), None
        ),
        "lagged": sum(1 for lag in lags if lag > LAG_TOLERANCE_S),
        "max_lag_ms": _r(max(lags, default=0.0) * 1000, 1),
        "p50_ms": _r(percentile(ok_ms, 50)),
        "p95_ms": _r(percentile(ok_ms, 95)),
        "p99_ms": _r(percentile(ok_ms, 99)),
        "max_ms": _r(max(ok_ms, default=None)),
    }


def summarize_steady(records: Sequence[RequestRecord]) -> dict[str, Any]:
    return _common(records)


def summarize_flood(records: Sequence[RequestRecord], rate: float, burst: int) -> dict[str, Any]:
    """The flood's figures; its accepted rate leaves out the bucket's initial burst."""
    stats = _common(records)
    refused = [r.latency_ms for r in records if r.outcome is Outcome.REJECTED]
    span = stats["span_s"]
    accepted = (stats["ok"] - burst) / span if span else None
    stats.update(
        rate_per_s=rate,
        burst=burst,
        accepted_per_s=_r(accepted, 3),
        accepted_over_rate=_r(None if accepted is None else accepted / rate, 4),
        accepted_per_s_with_burst=_r(stats["ok"] / span if span else None, 3),
        refused_p50_ms=_r(percentile(refused, 50)),
        refused_p99_ms=_r(percentile(refused, 99)),
    )
    return stats
