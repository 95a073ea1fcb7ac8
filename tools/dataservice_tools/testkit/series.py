"""Latency samples and what is drawn from them: the one percentile the tests,
the benches, the load harness and the demo report, and the runs of one system
in one phase of a closed-loop benchmark."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in 0..100); None without samples."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def _ms(ns: float | None) -> float:
    return float("nan") if ns is None else ns / 1e6


@dataclass
class RunResult:
    """One measured run of one system: latencies and what it cost."""

    latencies_ns: list[int]
    window_s: float  # the steady window: until the first caller finished
    window_count: int  # completions inside it
    wall_s: float
    errors: int
    first_error: str | None
    cpu_s: dict[str, float | None]  # by process, as :class:`~.cpu.Components` names them


@dataclass
class Series:
    """All runs of one system in one phase."""

    runs: list[RunResult] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        lat = sorted(x for run in self.runs for x in run.latencies_ns)
        window_s = sum(run.window_s for run in self.runs)
        window_count = sum(run.window_count for run in self.runs)
        cpu_ms: dict[str, float | None] = {}
        for part in self.runs[0].cpu_s if self.runs else ():
            values = [run.cpu_s.get(part) for run in self.runs]
            cpu_ms[part] = (
                None
                if any(v is None for v in values) or not lat
                else 1000 * sum(v for v in values if v is not None) / len(lat)
            )
        return {
            "requests": len(lat),
            "errors": sum(run.errors for run in self.runs),
            "first_error": next((run.first_error for run in self.runs if run.first_error), None),
            "p50_ms": _ms(percentile(lat, 50)),
            "p95_ms": _ms(percentile(lat, 95)),
            "p99_ms": _ms(percentile(lat, 99)),
            "mean_ms": sum(lat) / len(lat) / 1e6 if lat else float("nan"),
            "max_ms": lat[-1] / 1e6 if lat else float("nan"),
            "throughput_per_s": window_count / window_s if window_s else float("nan"),
            "cpu_ms_per_request": cpu_ms,
            "rounds_p50_ms": [_ms(percentile(run.latencies_ns, 50)) for run in self.runs],
            "rounds_throughput_per_s": [
                run.window_count / run.window_s if run.window_s else float("nan")
                for run in self.runs
            ],
        }
