"""The ``dataservice`` command line."""

from __future__ import annotations

from pathlib import Path

import typer

from dataservice.cache.cli import app as cache_app
from dataservice.callers import KeyRing, load_keyring
from dataservice.callers_cli import app as keys_app
from dataservice.changes.cli import changes as changes_command
from dataservice.changes.user_cli import changes_user
from dataservice.cli_options import METRICS_ADDRESS, METRICS_PORT
from dataservice.config import Config
from dataservice.enums import LaneName
from dataservice.errors import DataServiceError
from dataservice.flower_cli import flower as flower_command
from dataservice.health_cli import health as health_command
from dataservice.inspect_cli import app as inspect_app
from dataservice.loadtest.faults import FAULTS
from dataservice.loadtest.scenarios import SCENARIOS
from dataservice.observe.logs import configure_logging
from dataservice.run_cli import run as run_command
from dataservice.settings import Settings

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Run and operate dataservice.")
db = typer.Typer(no_args_is_help=True, help="Database schema and the change consumer's user.")
app.add_typer(db, name="db")
db.command("changes-user")(changes_user)
acl = typer.Typer(no_args_is_help=True, help="Redis users (ACL) for callers and workers.")
app.add_typer(acl, name="acl")
app.add_typer(cache_app, name="cache")
app.add_typer(keys_app, name="keys")
app.add_typer(inspect_app, name="inspect")
app.command("changes")(changes_command)
app.command("health")(health_command)
app.command("flower")(flower_command)
app.command("run")(run_command)


def _fail(exc: DataServiceError, code: int) -> typer.Exit:
    typer.echo(f"error: {exc}", err=True)
    return typer.Exit(code)


def _load() -> tuple[Settings, Config]:
    """Settings and configuration, or exit 2 with the error that names the problem."""
    try:
        settings = Settings.from_env()
        return settings, settings.load()
    except DataServiceError as exc:
        raise _fail(exc, 2) from None


@db.command("upgrade")
def db_upgrade(revision: str = typer.Argument("head", help="Target migration.")) -> None:
    """Create the database if missing and migrate it to REVISION."""
    from dataservice.store.migrate import upgrade

    settings, config = _load()
    try:
        created = upgrade(settings.database_url, config.database, revision)
    except DataServiceError as exc:
        raise _fail(exc, 1) from None
    typer.echo(("created database; " if created else "") + f"schema at {revision}")


def _acl_inputs() -> tuple[Settings, Config, KeyRing]:
    """Settings, configuration and the callers file, or exit 2 naming the problem."""
    settings, config = _load()
    try:
        return settings, config, load_keyring(settings.callers_file)
    except DataServiceError as exc:
        raise _fail(exc, 2) from None


@acl.command("apply")
def acl_apply() -> None:
    """Create or replace the callers file's Redis users; print their names.

    Connects to DATASERVICE_REDIS_URL, which must name an administrator."""
    from dataservice.acl import admin_client, apply_acl

    settings, config, keyring = _acl_inputs()
    admin = admin_client(settings.redis_url)
    try:
        names = apply_acl(admin, keyring, config)
    except DataServiceError as exc:
        raise _fail(exc, 1) from None
    finally:
        admin.close()
    for name in names:
        typer.echo(name)
    if not names:
        typer.echo("no Redis passwords in the callers file: no users set", err=True)


@acl.command("show")
def acl_show() -> None:
    """Print the commands `acl apply` runs, with <password> placeholders.

    One ACL SETUSER per line, quoted for redis-cli."""
    from dataservice.acl import render_commands

    _, config, keyring = _acl_inputs()
    for line in render_commands(keyring, config):
        typer.echo(line)


@app.command("check-config")
def check_config() -> None:
    """Print the database budget arithmetic; exit 1 if any sum exceeds its bound."""
    from dataservice.budget import check_budget

    settings, config = _load()
    check = check_budget(config)
    typer.echo(f"{settings.config_path}:")
    for line in check.lines:
        typer.echo(f"  {line}")
    for problem in check.problems:
        typer.echo(f"over budget: {problem}", err=True)
    if not check.ok:
        raise typer.Exit(1)
    typer.echo("within budget")


@app.command()
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
) -> None:
    """Run one worker pool consuming only LANE's queue."""
    from dataservice.budget import require_within_budget
    from workers.pools import run_worker

    settings, config = _load()
    threads = config.lanes[lane].concurrency if concurrency is None else concurrency
    try:
        require_within_budget(config, lane, threads)
    except DataServiceError as exc:
        raise _fail(exc, 2) from None
    configure_logging(config.logging, loglevel)
    if metrics_port:
        from dataservice.metrics import serve

        serve(metrics_port, metrics_address)
    run_worker(
        settings,
        config,
        lane,
        concurrency=threads,
        loglevel=loglevel.upper(),
        alive_file=alive_file,
    )


@app.command()
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
    from dataservice.console import console
    from dataservice.loadtest.cli import run_loadtest, server_url

    settings, _ = _load()
    code = run_loadtest(
        console(),
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


def main() -> None:
    app()


if __name__ == "__main__":
    main()
