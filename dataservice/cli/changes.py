"""``dataservice changes``: the change consumer and its worker node, in the foreground."""

from __future__ import annotations

from pathlib import Path

import typer

from dataservice.cli.common import METRICS_ADDRESS, METRICS_PORT, load


def changes(
    loglevel: str = typer.Option("INFO", help="Log level."),
    metrics_port: int = METRICS_PORT,
    metrics_address: str = METRICS_ADDRESS,
    alive_file: Path | None = typer.Option(
        None, help="Touch this file every second from the node's loop (dataservice health)."
    ),
) -> None:
    """Tail the database's binlog and invalidate both cache formats for every
    change to a record (docs/changes.md). One consumer is active across all
    that run; the others stand by and take over when it stops. Each is a
    Celery worker node on the `changes` queue (inspect: dataservice_changes)."""
    # Imported here: dataservice.cli imports this module to register the command.
    from dataservice.observe.logs import configure_logging
    from dataservice.worker.changes import run_changes_node

    settings, config = load()
    # The node checks the server's settings and its grants as it starts
    # (every one missing named, exit 2), whichever command line starts it.
    configure_logging(config.logging, loglevel)
    run_changes_node(settings, config, loglevel.upper(), alive_file, metrics_port, metrics_address)
