"""``dataservice run``: the whole service in the foreground, and ``--demo``."""

from __future__ import annotations

import time
from pathlib import Path

import typer

from dataservice.errors import DataServiceError


def run(
    demo: int = typer.Option(
        0, min=0, help="Run the demo: write and read back this many records per lane, then exit."
    ),
    log_dir: Path = typer.Option(Path(".state/logs"), help="Where the worker pools log."),
    flower_port: int = typer.Option(
        5555,
        min=0,
        max=65535,
        help="Flower on 127.0.0.1:PORT (0: none; needs DATASERVICE_FLOWER_AUTH).",
    ),
    metrics_port: int = typer.Option(
        9101,
        min=0,
        max=65535,
        help="Metrics of the interactive pool on 127.0.0.1:PORT, the batch pool PORT+1 and "
        "the change consumer PORT+2 (0: none).",
    ),
) -> None:
    """Run both worker pools and the change consumer in the foreground with a
    live summary (Ctrl-C stops)."""
    from rich.live import Live

    from dataservice.cli import _fail, _load
    from dataservice.console import console as make_console
    from dataservice.demo import run_demo
    from dataservice.supervisor import Supervisor

    settings, config = _load()
    console = make_console()
    if flower_port and settings.flower_auth is None:
        console.print("Flower: off (DATASERVICE_FLOWER_AUTH is not set; `make services` sets it)")
        flower_port = 0
    supervisor = Supervisor(
        settings,
        config,
        log_dir,
        changes=True,
        flower_port=flower_port or None,
        metrics_port=metrics_port or None,
    )
    supervisor.start()
    try:
        supervisor.wait_ready()
        console.print(f"worker pools ready; logs in {log_dir}")
        if demo:
            raise typer.Exit(run_demo(console, settings, supervisor, demo))
        with Live(supervisor.table(supervisor.snapshot()), console=console) as live:
            while True:
                time.sleep(1.0)
                supervisor.check_pools()
                live.update(supervisor.table(supervisor.snapshot()))
    except KeyboardInterrupt:
        console.print("stopping: in-flight requests finish first")
    except DataServiceError as exc:
        raise _fail(exc, 1) from None
    finally:
        supervisor.stop()
