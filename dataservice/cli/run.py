"""``dataservice run``: the whole service in the foreground, and ``--demo``."""

from __future__ import annotations

import time
from collections.abc import Callable
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from dataservice.cli.common import fail, load
from dataservice.errors import DataServiceError, ServiceSetupError

if TYPE_CHECKING:
    from rich.console import Console

    from dataservice.config.settings import Settings
    from dataservice.ops.supervisor import Supervisor

    DemoRunner = Callable[[Console, Settings, Supervisor, int], int]

# The demo lives in the tooling package, which registers it here.
DEMO_GROUP = "dataservice.demo"


def _demo_runner() -> DemoRunner:
    """The installed demo, or exit 2 saying where it comes from."""
    for point in entry_points(group=DEMO_GROUP, name="run"):
        runner: DemoRunner = point.load()
        return runner
    raise fail(
        ServiceSetupError(
            "--demo needs the tooling package dataservice-tools (make installs it; "
            "or: pip install ./tools)"
        ),
        2,
    )


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

    from dataservice.cli.console import console as make_console
    from dataservice.ops.supervisor import Supervisor

    settings, config = load()
    run_demo = _demo_runner() if demo else None
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
        if run_demo is not None:
            raise typer.Exit(run_demo(console, settings, supervisor, demo))
        with Live(supervisor.table(supervisor.snapshot()), console=console) as live:
            while True:
                time.sleep(1.0)
                supervisor.check_pools()
                live.update(supervisor.table(supervisor.snapshot()))
    except KeyboardInterrupt:
        console.print("stopping: in-flight requests finish first")
    except DataServiceError as exc:
        raise fail(exc, 1) from None
    finally:
        supervisor.stop()
