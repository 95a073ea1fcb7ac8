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
from dataservice.loadtest.faults import FAULTS, Fault
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
    fault: str | None = None,
) -> int:
    if scenario not in SCENARIOS:
        console.print(f"error: unknown scenario {scenario!r}; one of {', '.join(SCENARIOS)}")
        return 2
    if system not in SYSTEMS:
        console.print(f"error: unknown system {system!r}; one of {', '.join(SYSTEMS)}")
        return 2
    if fault is not None and fault not in FAULTS:
        console.print(f"error: unknown fault {fault!r}; one of {', '.join(FAULTS)}")
        return 2
    out = out or Path(".state/loadtest") / time.strftime("%Y%m%dT%H%M%S")
    systems = ("service", "naive") if system == "both" else (system,)
    reports: list[dict[str, Any]] = []
    capacity = capacity_after = None
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
            fault=Fault(fault) if fault is not None else None,
            # Both systems get the same offered load: the service's capacity
            # (and face the same slower database, measured once).
            capacity=capacity,
            capacity_after=capacity_after,
        )
        try:
            run = Run(options, console)
            report = run.execute()
        except DataServiceError as exc:
            console.print(f"error: {exc}")
            return 1
        capacity, capacity_after = run.capacity, run.capacity_after
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
        console.print(f"{report['system']} liveness and recovery: {_incident_line(report)}")
        if "changes" in report:
            console.print(f"{report['system']} cache and change stream: {_changes_line(report)}")
    return 0


def server_url(database_url: str) -> str:
    """The server (and account) of ``database_url``, with no database.

    (``URL.set(database=None)`` leaves the database as it is: the empty name
    is what removes it.)"""
    return make_url(database_url).set(database="").render_as_string(hide_password=False)


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
    if keep.get("liveness_green_throughout", False) is None:
        keep["liveness_green_throughout"] = "n/a"
    return ", ".join(f"{k}={v}" for k, v in keep.items())


def _incident_line(report: dict[str, Any]) -> str:
    """Liveness, and the recovery after the scenario's event per lane."""
    liveness = report["liveness"]
    if liveness["applicable"]:
        parts = [f"liveness red in {liveness['red_samples']} of {liveness['samples']} samples"]
    else:
        parts = ["liveness not applicable (no health check)"]
    recovery = report.get("recovery")
    if recovery is not None:
        for lane, figures in recovery["lanes"].items():
            back = figures["recovery_s"]
            held = "" if back is None or figures["held"] else ", did not hold"
            parts.append(
                f"{lane} {'not back' if back is None else f'back in {back} s'}{held} "
                f"(target {figures['target_per_s']}/s over {recovery['window_s']:g} s)"
            )
    return ", ".join(parts)
