"""``dataservice loadtest``: the runs, their output paths and the verdicts."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rich.console import Console
from sqlalchemy.engine import make_url

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
    root_url: str,
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
            root_url=root_url,
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
        if "changes" in report:
            console.print(f"{report['system']} cache and change stream: {_changes_line(report)}")
    return 0


def server_url(database_url: str) -> str:
    """The server (and account) of ``database_url``, with no database."""
    return make_url(database_url).set(database=None).render_as_string(hide_password=False)


def _changes_line(report: dict[str, Any]) -> str:
    changes = report["changes"]
    consumer = changes.get("consumer") or {}
    if changes["hit_ratio"] is None:
        return f"no cache; direct SQL writes {changes['direct_writes']['ok']}"
    parts = [
        f"hit ratio {changes['hit_ratio']}",
        f"direct SQL writes {changes['direct_writes']['ok']}",
        f"consumer lag max {consumer.get('lag_s_max')} s",
        f"guard engaged {consumer.get('guard_engaged_share')} of the time",
    ]
    return ", ".join(parts)


def _verdict_line(verdicts: dict[str, Any]) -> str:
    keep = {
        k: v
        for k, v in verdicts.items()
        if not isinstance(v, dict) or k in ("goodput_over_capacity",)
    }
    if "reconnect" in verdicts:
        keep["reconnect_within_bound"] = verdicts["reconnect"].get("within_bound")
    return ", ".join(f"{k}={v}" for k, v in keep.items())
