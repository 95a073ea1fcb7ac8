"""What the ``dataservice`` commands share: loading the configuration, failing
with the error's own words, and options spelled once."""

from __future__ import annotations

import typer

from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.errors import DataServiceError

METRICS_PORT = typer.Option(
    0, min=0, max=65535, help="Serve Prometheus metrics on ADDRESS:PORT/metrics (0: off)."
)
METRICS_ADDRESS = typer.Option(
    "127.0.0.1", help="The metrics endpoint's address (0.0.0.0: every interface, in a container)."
)


def fail(exc: DataServiceError, code: int) -> typer.Exit:
    """Print ``error: <exc>`` on stderr; the exit to raise with ``code``."""
    typer.echo(f"error: {exc}", err=True)
    return typer.Exit(code)


def load() -> tuple[Settings, Config]:
    """Settings and configuration, or exit 2 with the error that names the problem."""
    try:
        settings = Settings.from_env()
        return settings, settings.load()
    except DataServiceError as exc:
        raise fail(exc, 2) from None
