"""``dataservice loadtest``: runs, the summary table and the output paths."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from dataservice.errors import DataServiceError
from dataservice.loadtest import report as rep
from dataservice.loadtest.runner import Run, RunOptions
from dataservice.loadtest.scenarios import SCENARIOS

SYSTEMS = ("service", "naive", "both")


def _cell(value: Any, fmt: str = "{:.0f}") -> str:
    return "-" if value is None else fmt.format(value)


def _table(title: str, columns: tuple[str, ...], caption: str) -> Table:
    table = Table(title=title, caption=caption)
    for column in columns:
        left = column in ("system", "lane")
        table.add_column(column, justify="left" if left else "right", no_wrap=left)
    return table


def summary_tables(reports: list[dict[str, Any]]) -> list[Table]:
    """Per lane: load, outcomes and latency; per system: the database's view."""
    lanes = _table(
        "loadtest: lanes",
        ("system", "lane", "in/s", "ok/s", "x cap", "rej", "t/o", "p50", "p95", "p99"),
        "in: offered; ok: goodput; x cap: goodput / capacity; latency in ms, of ok answers",
    )
    database = _table(
        "loadtest: database (sampled as root)",
        ("system", "conns", "active", "share", "over", "new/s", "Hz", "lagged"),
        "peaks; share: what the live replicas may hold; over: samples above it",
    )
    for report in reports:
        ratio = report["verdicts"]["goodput_over_capacity"]
        for n, (lane, stats) in enumerate(report["lanes"].items()):
            lanes.add_row(
                report["system"] if n == 0 else "",
                lane,
                _cell(stats["offered_per_s"], "{:.1f}"),
                _cell(stats["goodput_per_s"], "{:.1f}"),
                _cell(ratio.get(lane), "{:.2f}"),
                _cell(stats["rejection_rate"], "{:.0%}"),
                _cell(stats["timeout_rate"], "{:.0%}"),
                _cell(stats["p50_ms"]),
                _cell(stats["p95_ms"]),
                _cell(stats["p99_ms"]),
            )
        db = report["database"]
        over = (db.get("samples_over_connection_share") or 0) + (
            db.get("samples_over_active_share") or 0
        )
        database.add_row(
            report["system"],
            _cell(db.get("peak_connections")),
            _cell(db.get("peak_active")),
            _cell(db.get("peak_share_active")),
            str(over),
            _cell(db.get("peak_new_connections_per_s")),
            _cell(db.get("sample_hz")),
            str(report["generator"]["lagged_requests"]),
        )
    return [lanes, database]


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
        rep.write_chart(png_path, report, f"{name}: {scenario}, {replicas} replicas per lane")
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
