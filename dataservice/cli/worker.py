"""``dataservice worker`` and ``dataservice check-config``: one lane's worker pool,
and the database budget it must fit in."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import typer

from dataservice.cli.common import METRICS_ADDRESS, METRICS_PORT, fail, load
from dataservice.enums import LaneName
from dataservice.errors import DataServiceError


def check_config() -> None:
    """Print the database budget arithmetic; exit 1 if any sum exceeds its bound."""
    from dataservice.config.budget import check_budget

    settings, config = load()
    check = check_budget(config)
    typer.echo(f"{settings.config_path}:")
    for line in check.lines:
        typer.echo(f"  {line}")
    for problem in check.problems:
        typer.echo(f"over budget: {problem}", err=True)
    if not check.ok:
        raise typer.Exit(1)
    typer.echo("within budget")


def worker(
    lane: LaneName = typer.Option(..., help="The lane whose queue this pool consumes."),
    concurrency: int | None = typer.Option(
        None, min=1, help="Worker threads (default: the lane's concurrency in queues.yml)."
    ),
    loglevel: str = typer.Option("INFO", help="Log level."),
    metrics_port: int = METRICS_PORT,
    metrics_address: str = METRICS_ADDRESS,
    alive_file: Path | None = typer.Option(
        None, help="Touch this file every second from the consumer loop (dataservice health)."
    ),
    cell: str | None = typer.Option(
        None, help="The cell this pool serves, when cells are configured (DATASERVICE_CELL)."
    ),
) -> None:
    """Run one worker pool consuming only LANE's queue: the short form of
    `celery -A workers.LANE worker -n LANE-<pid>@<host> --without-gossip
    --without-mingle` (docs/operations.md)."""
    from dataservice.config.budget import require_within_budget
    from dataservice.observe.logs import configure_logging
    from dataservice.worker.start import run_worker

    settings, config = load()
    threads = config.lanes[lane].concurrency if concurrency is None else concurrency
    try:
        if cell is not None:
            settings = dataclasses.replace(settings, cell=cell)
        settings = settings.for_worker(config)
        require_within_budget(config, lane, threads)
    except DataServiceError as exc:
        raise fail(exc, 2) from None
    configure_logging(config.logging, loglevel)
    run_worker(
        settings,
        config,
        lane,
        concurrency=threads,
        loglevel=loglevel.upper(),
        alive_file=alive_file,
        metrics_port=metrics_port,
        metrics_address=metrics_address,
    )
