"""``dataservice loadtest``: the runs, their output paths and the verdicts."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rich.console import Console

from dataservice.errors import DataServiceError
from dataservice.loadtest import report as rep
from dataservice.loadtest.chart import write_chart
from dataservice.loadtest.display import summary_tables
from dataservice.loadtest.runner import Run, RunOptions
from dataservice.loadtest.scenarios import SCENARIOS

SYSTEMS = ("service", "naive", "both")


def run_loadtest(
    console: Console,
    *,
    scenario: str,
    system: str,
    duration: float,
    rate: float | None,
    replicas: int,
    db_delay_ms: int,
    out: Path | None,
    live: bool,
    base_config: Path,
) -> int:
    if scenario not in SCENARIOS:
        console.print(f"error: unknown scenario {scenario!r}; one of {', '.join(SCENARIOS)}")
        return 2
    if system not in SYSTEMS:
        console.print(f"error: unknown system {system!r}; one of {', '.join(SYSTEMS)}")
        return 2
    out = out or Path(".state/loadtest") / time.strftime("%Y%m%dT%H%M%S")
    systems = ("service", "naive") if system == "both" else (system,)
    reports: list[dict[str, Any]] = []
    capacity = None
    for name in systems:
        options = RunOptions(
            scenario=SCENARIOS[scenario],
            system=name,
            duration_s=duration,
            rate=rate,
            replicas=replicas,
            out=out / name if len(systems) > 1 else out,
            base_config=base_config,
            db_delay_ms=db_delay_ms,
            live=live,
            # Both systems get the same offered load: the service's capacity.
            capacity=capacity,
        )
        try:
            run = Run(options, console)
            report = run.execute()
        except DataServiceError as exc:
            console.print(f"error: {exc}")
            return 1
        capacity = run.capacity
        json_path = options.out / "report.json"
        png_path = options.out / "chart.png"
        rep.write_json(json_path, report)
        write_chart(png_path, report, f"{name}: {scenario}, {replicas} replicas per lane")
        reports.append(report)
        console.print(f"{name}: report {json_path}, chart {png_path}")
    for table in summary_tables(reports):
        console.print(table)
    for report in reports:
        console.print(f"{report['system']} verdicts: {_verdict_line(report['verdicts'])}")
    return 0


def _verdict_line(verdicts: dict[str, Any]) -> str:
    keep = {
        k: v
        for k, v in verdicts.items()
        if not isinstance(v, dict) or k in ("goodput_over_capacity",)
    }
    if "reconnect" in verdicts:
        keep["reconnect_within_bound"] = verdicts["reconnect"].get("within_bound")
    return ", ".join(f"{k}={v}" for k, v in keep.items())
