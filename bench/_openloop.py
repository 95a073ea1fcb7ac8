"""Open-loop reads for ``bench/flood.py``: arrivals at evenly spaced instants,
whatever the answers do, and the figures drawn from them.

An arrival is handed to a fixed pool of caller threads; one sent more than
``LAG_TOLERANCE_S`` after its instant is counted as generator lag (reported,
never hidden by slowing the schedule down).
"""

from __future__ import annotations

import queue
import random
import threading
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

from dataservice.enums import ReadMode
from dataservice.errors import DeadlineExceeded, ResourceExhausted, Unavailable
from dataservice.loadtest.report import percentile

LAG_TOLERANCE_S = 0.010
TIMEOUT_S = 2.0

OK = "ok"
EXHAUSTED = "resource_exhausted"
UNAVAILABLE = "unavailable"
TIMEOUT = "timeout"
ERROR = "error"


class Sample(NamedTuple):
    """One request: times in seconds from the run's t0; what came back."""

    scheduled: float
    sent: float
    done: float
    outcome: str
    detail: str  # the error's message, "" when OK

    @property
    def latency_ms(self) -> float:
        return (self.done - self.sent) * 1000


def _classify(exc: Exception) -> str:
    if isinstance(exc, ResourceExhausted):
        return EXHAUSTED
    if isinstance(exc, Unavailable):
        return UNAVAILABLE
    if isinstance(exc, DeadlineExceeded):
        return TIMEOUT
    return ERROR


def open_loop(
    clients: Sequence[Any],
    scope: str,
    ids: Sequence[str],
    rate: float,
    t0: float,
    seconds: float,
    threads: int,
) -> list[Sample]:
    """Reads at ``rate``/s from monotonic ``t0`` for ``seconds``; every sample,
    once each request is answered or has timed out."""
    work: queue.Queue[float | None] = queue.Queue()
    samples: list[Sample] = []

    def caller(client: Any) -> None:
        rng = random.Random()
        while (at := work.get()) is not None:
            sent = time.monotonic() - t0
            try:
                client.read(scope, rng.choice(ids), mode=ReadMode.PRIMARY, timeout=TIMEOUT_S)
            except Exception as exc:
                outcome, detail = _classify(exc), str(exc)
            else:
                outcome, detail = OK, ""
            samples.append(Sample(at, sent, time.monotonic() - t0, outcome, detail))

    pool = [
        threading.Thread(target=caller, args=(clients[n % len(clients)],), daemon=True)
        for n in range(threads)
    ]
    for thread in pool:
        thread.start()
    at = 0.0
    while at < seconds:
        delay = t0 + at - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        work.put(at)
        at += 1.0 / rate
    for _ in pool:
        work.put(None)
    for thread in pool:
        thread.join()
    return samples


def _r(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value, digits)


def _common(samples: Sequence[Sample]) -> dict[str, Any]:
    counts = {o: sum(1 for s in samples if s.outcome == o) for o in (OK, EXHAUSTED)}
    sent = [s.sent for s in samples]
    span = max(sent) - min(sent) if len(sent) > 1 else 0.0
    lags = [s.sent - s.scheduled for s in samples]
    ok_ms = [s.latency_ms for s in samples if s.outcome == OK]
    return {
        "requests": len(samples),
        "span_s": round(span, 3),
        "sent_per_s": round(len(samples) / span, 1) if span else 0.0,
        "ok": counts[OK],
        "exhausted": counts[EXHAUSTED],
        "other": len(samples) - counts[OK] - counts[EXHAUSTED],
        "other_first": next((s.detail for s in samples if s.outcome not in (OK, EXHAUSTED)), None),
        "lagged": sum(1 for lag in lags if lag > LAG_TOLERANCE_S),
        "max_lag_ms": _r(max(lags, default=0.0) * 1000, 1),
        "p50_ms": _r(percentile(ok_ms, 50)),
        "p95_ms": _r(percentile(ok_ms, 95)),
        "p99_ms": _r(percentile(ok_ms, 99)),
        "max_ms": _r(max(ok_ms, default=None)),
    }


def summarize_steady(samples: Sequence[Sample]) -> dict[str, Any]:
    return _common(samples)


def summarize_flood(samples: Sequence[Sample], rate: float, burst: int) -> dict[str, Any]:
    """The flood's figures; its accepted rate leaves out the bucket's initial burst."""
    stats = _common(samples)
    refused = [s.latency_ms for s in samples if s.outcome == EXHAUSTED]
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
