"""What the processes' metrics endpoints say at the end of the demo, as tables:
the time per stage (count, p50, p99 over every process) and the counters that
tell outcomes, refusals, timeouts and failed dependencies apart."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping

from prometheus_client.samples import Sample
from rich.table import Table

from dataservice.observe.metrics import Stage
from dataservice.observe.metrics.endpoint import scrape_port

# (counter, the label that tells its series apart, whether each process
# reports the service's own figure: then the largest is the service's)
COUNTERS = (
    ("dataservice_requests", "code", False),
    ("dataservice_rejections", "reason", False),
    ("dataservice_admission_refusals", "reason", True),
    ("dataservice_timeouts", "stage", False),
    ("dataservice_dependency_failures", "dependency", False),
    ("dataservice_cache_reads", "format", False),
    ("dataservice_coalesced", "level", False),
)


def scrape(ports: Mapping[str, int]) -> dict[str, list[Sample]]:
    """Every sample of each process's endpoint, by process name; a process
    that does not answer has none."""
    return {name: scrape_port(port) or [] for name, port in ports.items()}


def _buckets(samples: Iterable[Sample]) -> dict[str, dict[float, float]]:
    """Each stage's cumulative bucket counts, summed over lanes and processes."""
    stages: dict[str, dict[float, float]] = defaultdict(lambda: defaultdict(float))
    for s in samples:
        if s.name == "dataservice_stage_seconds_bucket":
            stages[s.labels["stage"]][float(s.labels["le"])] += s.value
    return stages


def quantile(buckets: Mapping[float, float], q: float) -> float:
    """``q`` of a cumulative histogram, interpolated within its bucket (seconds)."""
    bounds = sorted(buckets)
    total = buckets[bounds[-1]] if bounds else 0.0
    if total <= 0:
        return 0.0
    rank, lower, below = q * total, 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if bound == float("inf"):
                return lower
            share = (rank - below) / (count - below) if count > below else 1.0
            return lower + (bound - lower) * share
        lower, below = bound, count
    return lower


def stage_table(scraped: Mapping[str, list[Sample]]) -> Table:
    stages = _buckets(s for samples in scraped.values() for s in samples)
    table = Table(title="time per stage, every process (dataservice_stage_seconds)")
    for column in ("stage", "count", "p50", "p99"):
        table.add_column(column, justify="left" if column == "stage" else "right")
    for stage in Stage:
        buckets = stages.get(stage.value, {})
        count = buckets.get(float("inf"), 0.0)
        table.add_row(
            stage.value,
            f"{count:.0f}",
            f"{quantile(buckets, 0.5) * 1000:.2f}ms",
            f"{quantile(buckets, 0.99) * 1000:.2f}ms",
        )
    return table


def counter_totals(scraped: Mapping[str, list[Sample]]) -> dict[str, dict[str, float]]:
    """Each counter of :data:`COUNTERS`, by its telling label."""
    totals: dict[str, dict[str, float]] = {name: defaultdict(float) for name, _, _ in COUNTERS}
    for samples in scraped.values():
        for name, label, shared in COUNTERS:
            for s in samples:
                if s.name != f"{name}_total":
                    continue
                key = s.labels.get(label, "")
                if shared:
                    totals[name][key] = max(totals[name][key], s.value)
                else:
                    totals[name][key] += s.value
    return totals


def counter_table(scraped: Mapping[str, list[Sample]]) -> Table:
    table = Table(title="counters, every process")
    table.add_column("counter")
    table.add_column("by")
    table.add_column("values")
    labels = {name: label for name, label, _ in COUNTERS}
    for name, values in counter_totals(scraped).items():
        shown = ", ".join(f"{k}: {v:.0f}" for k, v in sorted(values.items()) if v)
        table.add_row(f"{name}_total", labels[name], shown or "none")
    return table
