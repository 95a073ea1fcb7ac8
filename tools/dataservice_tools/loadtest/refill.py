"""The cold-cache scenario's view: how the cache refills after it went cold.

:class:`RefillWatch` scrapes every replica's metrics twice a second while the
load runs: its cache lookups by outcome and its operations in the database
(``dataservice_stage_seconds`` of the ``sql`` stage, reads and writes of both
lanes). :meth:`RefillWatch.summary` turns them into per-second series (the
hit ratio, database operations per second) and the refill's figures: how long
after the cache went cold the hit ratio was back at :data:`REFILLED` and
stayed there, and the database's busiest second against what the permits let
it do.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from itertools import pairwise
from pathlib import Path
from typing import Any

from dataservice.enums import LaneName
from dataservice.errors import DataServiceError, RetryableError
from dataservice.observe.metrics.endpoint import scrape_port
from dataservice_tools.loadtest.openloop import Adapter
from dataservice_tools.loadtest.streamwatch import hit_ratio

# The hit ratio a refilled cache is back at (each write of the mix leaves one
# miss after it, so a warm cache reads a little under 1).
REFILLED = 0.9
SCRAPE_EVERY_S = 0.5
# The lowest hit ratio after the rotation is taken over one-second windows this
# far apart: the replicas see a rotation within ``cache.controls_max_age_ms``, so
# the cold moment falls anywhere in a second, and a whole-second bin that straddles
# it reads half warm.
WINDOW_STEP_S = 0.25
WARM_ATTEMPTS = 20
WARM_TIMEOUT_S = 10.0
_READS = "dataservice_cache_reads_total"
_STAGES = "dataservice_stage_seconds_count"


def warm(adapter: Adapter, ids: Sequence[str], callers: int) -> None:
    """Read every record once through the cache (``callers`` at a time), so
    that the run starts over a warm one; a read refused or failed is tried again."""

    def read(object_id: str) -> None:
        for attempt in range(WARM_ATTEMPTS):
            try:
                adapter.call(LaneName.INTERACTIVE, "read", object_id, b"", WARM_TIMEOUT_S)
                return
            except DataServiceError as exc:
                if attempt + 1 == WARM_ATTEMPTS:
                    raise
                # As a caller told to come back would.
                time.sleep(exc.retry_after if isinstance(exc, RetryableError) else 0.1)

    with ThreadPoolExecutor(max_workers=callers, thread_name_prefix="warm") as pool:
        list(pool.map(read, ids))


def scrape(ports: Iterable[int]) -> Counter[str]:
    """Hits, misses and database operations, summed over the replicas on ``ports``."""
    totals: Counter[str] = Counter()
    for port in ports:
        for sample in scrape_port(port) or ():
            if sample.name == _READS:
                totals[sample.labels["outcome"]] += int(sample.value)
            elif sample.name == _STAGES and sample.labels.get("stage") == "sql":
                totals["database"] += int(sample.value)
    return totals


class RefillWatch:
    """Cumulative counts over time, from ``t0`` (monotonic)."""

    def __init__(self, ports: list[int], t0: float) -> None:
        self._ports = ports
        self._t0 = t0
        self.points: list[tuple[float, Counter[str]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="refill-watch", daemon=True)

    def start(self) -> None:
        self.points.append((time.monotonic() - self._t0, scrape(self._ports)))
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(SCRAPE_EVERY_S):
            self.points.append((time.monotonic() - self._t0, scrape(self._ports)))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.points.append((time.monotonic() - self._t0, scrape(self._ports)))

    def summary(self, cold_at_s: float | None, duration_s: float) -> dict[str, Any]:
        return refill_summary(self.points, cold_at_s, duration_s)


def _at(points: list[tuple[float, Counter[str]]], t: float) -> Counter[str]:
    """The counts as of ``t``, between the scrapes around it in proportion: the
    scrapes come about twice a second, never on the second."""
    before = next((p for p in reversed(points) if p[0] <= t), None)
    after = next((p for p in points if p[0] > t), None)
    if before is None or after is None:
        return Counter() if before is None else before[1]
    share = (t - before[0]) / (after[0] - before[0])
    keys = before[1].keys() | after[1].keys()
    return Counter({k: before[1][k] + share * (after[1][k] - before[1][k]) for k in keys})


def refill_summary(
    points: list[tuple[float, Counter[str]]], cold_at_s: float | None, duration_s: float
) -> dict[str, Any]:
    """Per-second series and the refill's figures (``docs/loadtest.md``, "cold-cache")."""
    seconds = list(range(int(duration_s)))
    spans = list(pairwise(_at(points, s) for s in range(len(seconds) + 1)))
    ratios = [hit_ratio(begin, end) for begin, end in spans]
    database = [round(end["database"] - begin["database"]) for begin, end in spans]
    summary: dict[str, Any] = {
        "series": {"t": seconds, "hit_ratio": ratios, "database_per_s": database},
        "cold_at_s": cold_at_s,
        "refilled_at": REFILLED,
        "refilled_s": None,
    }
    if cold_at_s is None:
        return summary
    first = int(cold_at_s)
    before = [r for r in ratios[: max(first - 1, 0)] if r is not None]
    after = ratios[first:]
    summary["hit_ratio_before"] = round(sum(before) / len(before), 4) if before else None
    # Over any one-second window from the rotation on, not whole seconds (WINDOW_STEP_S).
    steps = math.floor((duration_s - 1 - cold_at_s) / WINDOW_STEP_S) + 1
    starts = [cold_at_s + n * WINDOW_STEP_S for n in range(steps)]
    windows = [hit_ratio(_at(points, t), _at(points, t + 1)) for t in starts]
    summary["hit_ratio_lowest_after"] = min((r for r in windows if r is not None), default=None)
    summary["database_peak_per_s"] = max(database[first:], default=0)
    # Refilled from the first second from which every later second reads at least REFILLED.
    for n in range(len(after)):
        if all(r is not None and r >= REFILLED for r in after[n:]) and after[n:]:
            summary["refilled_s"] = round(first + n + 1 - cold_at_s, 2)
            break
    return summary


def write_refill_chart(path: Path, reports: list[dict[str, Any]], title: str) -> None:
    """Each run's refill side by side: the hit ratio, the database's operations
    per second against both lanes' capacity, and the interactive lane's
    goodput, refusals and timeouts; the rotation marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(10, 9), sharex=True)
    ratio, database, outcomes = axes
    for report, style in zip(reports, ("-", "--"), strict=False):
        name = report.get("variant", report["system"])
        refill = report["changes"]["refill"]
        series = refill["series"]
        ratio.plot(series["t"], series["hit_ratio"], linestyle=style, label=name)
        database.plot(series["t"], series["database_per_s"], linestyle=style, label=name)
        lane = report["series"]["interactive"]
        t = report["series"]["t"]
        for key, colour in (("goodput", "tab:green"), ("rejected", "tab:red")):
            outcomes.plot(t, lane[key], color=colour, linestyle=style, label=f"{key}, {name}")
        outcomes.plot(t, lane["timeout"], color="black", linestyle=style, label=f"timeout, {name}")
        if refill["cold_at_s"] is not None:
            for axis in axes:
                axis.axvline(refill["cold_at_s"], color="grey", linewidth=0.8)
    capacity = sum(reports[0]["config"]["capacity_per_s"].values())
    database.axhline(capacity, color="black", linestyle=":", label="both lanes' capacity")
    ratio.axhline(REFILLED, color="grey", linestyle=":", label=f"{REFILLED:g}")
    ratio.set_ylabel("cache hit ratio")
    database.set_ylabel("database operations/s")
    outcomes.set_ylabel("interactive, per s")
    outcomes.set_xlabel("seconds (grey line: generation rotated)")
    for axis in axes:
        axis.legend(fontsize="x-small", loc="best")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
