"""The ``dataservice`` command line."""

from __future__ import annotations

import logging
import sys

import typer

from dataservice.config import LaneName, Settings
from dataservice.errors import DataServiceError

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Run and operate dataservice.")
db = typer.Typer(no_args_is_help=True, help="Database schema.")
app.add_typer(db, name="db")


def _settings() -> Settings:
    try:
        return Settings.from_env()
    except DataServiceError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


@db.command("upgrade")
def db_upgrade(revision: str = typer.Argument("head", help="Target migration.")) -> None:
    """Create the database if missing and migrate it to REVISION."""
    from dataservice.store.migrate import upgrade

    settings = _settings()
    try:
        created = upgrade(settings.database_url, settings.load().database, revision)
    except DataServiceError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(("created database; " if created else "") + f"schema at {revision}")


@app.command()
def worker(
    lane: LaneName = typer.Option(..., help="The lane whose queue this pool consumes."),
    loglevel: str = typer.Option("INFO", help="Log level."),
) -> None:
    """Run one worker pool consuming only LANE's queue."""
    from workers.pools import run_worker

    settings = _settings()
    try:
        config = settings.load()
    except DataServiceError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    logging.basicConfig(
        level=loglevel.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    run_worker(settings, config, lane, loglevel=loglevel.upper())


def main() -> None:
    app()
