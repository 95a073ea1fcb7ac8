"""Options that several ``dataservice`` commands share, spelled once."""

from __future__ import annotations

import typer

METRICS_PORT = typer.Option(
    0, min=0, max=65535, help="Serve Prometheus metrics on ADDRESS:PORT/metrics (0: off)."
)
METRICS_ADDRESS = typer.Option(
    "127.0.0.1", help="The metrics endpoint's address (0.0.0.0: every interface, in a container)."
)
