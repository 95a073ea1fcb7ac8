"""``dataservice loadtest``: the command, its runs, their output paths and the verdicts.

The command reaches ``dataservice`` through the entry-point group
``dataservice.commands`` (this package's ``pyproject.toml``)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from sqlalchemy.engine import make_url

from dataservice.broker import rabbitmq
from dataservice.cli.common import load
from dataservice.cli.console import console as make_console
from dataservice.errors import DataServiceError
from dataservice_tools.loadtest import report as rep
from dataservice_tools.loadtest.chart import missing_dependency, write_chart
from dataservice_tools.loadtest.display import summary_tables
from dataservice_tools.loadtest.faults import FAULTS, Fault
from dataservice_tools.loadtest.refill import write_refill_chart
from dataservice_tools.loadtest.runner import Run, RunOptions
from dataservice_tools.loadtest.scenarios import SCENARIOS, Scenario

SYSTEMS = ("service", "naive", "both")
# How long the broker named by the URL has to accept a connection.
CONNECT_TIMEOUT_S = 5.0


def write_outputs(
    console: Console,
    out: Path,
    name: str,
    report: dict[str, Any],
    title: str,
    no_chart: str | None,
) -> None:
    """A run's ``report.json``, and its ``chart.png`` unless ``no_chart`` says
    why it cannot be drawn (matplotlib missing)."""
    json_path = out / "report.json"
    rep.write_json(json_path, report)
    if no_chart is not None:
        console.print(f"{name}: report {json_path}")
        return
    png_path = out / "chart.png"
    write_chart(png_path, report, title)
    console.print(f"{name}: report {json_path}, chart {png_path}")


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
    broker_url: str | None = None,
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
    if fault is not None and broker_url is not None and Fault(fault).cuts:
        # The replicas run in a network namespace that reaches the run's own
        # Redis and MariaDB only.
        console.print("error: a partition fault runs on a Redis broker of the run's own")
        return 2
    if broker_url is not None:
        failure = rabbitmq.unreachable(broker_url, CONNECT_TIMEOUT_S)
        if failure:
            console.print(f"error: {rabbitmq.where(broker_url)}: {failure}")
            return 1
    chosen = SCENARIOS[scenario]
    if chosen.rotate_at is not None and system != "service":
        console.print(f"error: {scenario} reads through the service's cache: --system service")
        return 2
    out = out or Path(".state/loadtest") / time.strftime("%Y%m%dT%H%M%S")
    no_chart = missing_dependency()
    runs = _runs(chosen, system)
    reports: list[dict[str, Any]] = []
    capacity = capacity_after = None
    for name, system_name, coalesce in runs:
        options = RunOptions(
            scenario=chosen,
            system=system_name,
            coalesce=coalesce,
            duration_s=duration,
            rate=rate,
            replicas=replicas,
            out=out / name if len(runs) > 1 else out,
            base_config=base_config,
            db_delay_ms=db_delay_ms,
            live=live,
            root_url=root_url,
            fault=Fault(fault) if fault is not None else None,
            broker_url=broker_url,
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
        if name != system_name:
            report["variant"] = name
        reports.append(report)
        title = f"{name}: {scenario}, {replicas} replicas per lane"
        write_outputs(console, options.out, name, report, title, no_chart)
    if no_chart is not None:
        # The figures are all in the report; only the picture needs matplotlib.
        console.print(f"no chart: {no_chart}")
    elif chosen.rotate_at is not None:
        write_refill_chart(out / "refill.png", reports, f"{scenario}, {replicas} replicas per lane")
        console.print(f"refill chart {out / 'refill.png'}")
    for table in summary_tables(reports):
        console.print(table)
    for report in reports:
        name = report.get("variant", report["system"])
        console.print(f"{name} verdicts: {_verdict_line(report['verdicts'])}")
        console.print(f"{name} liveness and recovery: {_incident_line(report)}")
        if "changes" in report:
            console.print(f"{name} cache and change stream: {_changes_line(report)}")
        watched = report.get("fault", {}).get("watched_end")
        if watched is not None:
            console.print(f"{name} {report['fault']['fault']}: {_watched_line(report, watched)}")
        if report["verdicts"].get("baseline_within_share") is False:
            console.print(
                f"{name}: the baseline went over the database share: "
                "its figures are not comparable with the service's"
            )
    return 0


def _runs(scenario: Scenario, system: str) -> list[tuple[str, str, bool]]:
    """(name, system, coalescing) of each run: a cold cache is refilled with
    coalescing on and off, each system else runs once."""
    if scenario.rotate_at is not None:
        return [("coalescing-on", "service", True), ("coalescing-off", "service", False)]
    systems = ("service", "naive") if system == "both" else (system,)
    return [(name, name, True) for name in systems]


def server_url(database_url: str) -> str:
    """The server (and account) of ``database_url``, with no database.

    (``URL.set(database=None)`` leaves the database as it is: the empty name
    is what removes it.)"""
    return make_url(database_url).set(database="").render_as_string(hide_password=False)


def _changes_line(report: dict[str, Any]) -> str:
    changes = report["changes"]
    consumer = changes.get("consumer") or {}
    direct = (changes["direct_writes"] or {}).get("ok", 0)
    if changes["hit_ratio"] is None:
        return f"no cache; direct SQL writes {direct}"
    parts = [
        f"hit ratio {changes['hit_ratio']}",
        f"direct SQL writes {direct}",
        f"consumer lag max {consumer.get('lag_s_max')} s",
        f"guard engaged {consumer.get('guard_engaged_share')} of the time",
    ]
    refill = changes.get("refill")
    if refill is not None and refill["cold_at_s"] is not None:
        back = refill["refilled_s"]
        parts += [
            f"hit ratio {refill['hit_ratio_before']} before the rotation, "
            f"lowest {refill['hit_ratio_lowest_after']} after",
            f"back at {refill['refilled_at']} "
            + ("never" if back is None else f"{back} s after it"),
            f"database operations peak {refill['database_peak_per_s']}/s",
        ]
    return ", ".join(parts)


def _watched_line(report: dict[str, Any], w: dict[str, Any]) -> str:
    """The database and the goodput from the stall to the end of its watch."""
    fault = report["fault"]
    back = w["interactive_back_to_capacity_s"]
    return ", ".join(
        [
            f"stopped {fault['began_s']:.2f}-{fault['ended_s']:.2f} s",
            f"{w['samples']} samples at {w['sample_hz_after_end']} Hz after it "
            f"(first {w['first_sample_after_end_ms']} ms after, "
            f"longest gap {w['longest_gap_after_end_ms']} ms)",
            f"over the active share {w['samples_over_active_share']}, "
            f"over the connection share {w['samples_over_connection_share']}",
            f"peak active {w['peak_active']} of {w['share_active']}, "
            f"connections {w['peak_connections']} of {w['share_connections']}",
            f"new connections {w['new_connections_first_s_after_end']} in the first second",
            "interactive "
            + ("never back" if back is None else f"back to 0.9 of capacity in {back} s"),
        ]
    )


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


def loadtest(
    scenario: str = typer.Option(..., help=f"One of: {', '.join(SCENARIOS)}."),
    system: str = typer.Option(
        "service",
        help="service, naive (a plain Celery baseline) or both (same offered load, one after "
        "the other).",
    ),
    duration: float = typer.Option(20.0, min=2.0, help="Seconds of offered load."),
    rate: float | None = typer.Option(
        None, min=1.0, help="Interactive capacity in requests/s (default: a closed-loop probe)."
    ),
    replicas: int = typer.Option(3, min=1, help="Worker replicas per lane."),
    db_delay_ms: int = typer.Option(
        0, min=0, help="Statement time injected in the database for every scenario (ms)."
    ),
    out: Path | None = typer.Option(
        None, help="Output directory (default .state/loadtest/<time>)."
    ),
    live: bool = typer.Option(True, help="Show the live display."),
    server: str | None = typer.Option(
        None,
        help="The MariaDB server to run on, as an account that may create databases and "
        "users (default: the configured database's server and account).",
    ),
    fault: str | None = typer.Option(
        None,
        help=f"Inject a fault mid-run, on a Redis and a MariaDB of the run's own: one of "
        f'{", ".join(FAULTS)} (see docs/operations.md, "Faults").',
    ),
) -> None:
    """Offer a scenario's open-loop load to isolated replicas; write a JSON report and a chart."""
    settings, _ = load()
    code = run_loadtest(
        make_console(),
        scenario=scenario,
        system=system,
        duration=duration,
        rate=rate,
        replicas=replicas,
        db_delay_ms=db_delay_ms,
        out=out,
        live=live,
        base_config=settings.config_path,
        root_url=server or server_url(settings.database_url),
        fault=fault,
        # The service's own broker when it is RabbitMQ; a run's Redis db otherwise.
        broker_url=settings.broker_url if settings.broker_is_amqp else None,
    )
    raise typer.Exit(code)
