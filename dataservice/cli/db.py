"""``dataservice db``: the schema (``upgrade``) and the change-stream consumer's
database user (``changes-user``)."""

from __future__ import annotations

import typer

from dataservice.changes.user import DEFAULT_HOSTS, DEFAULT_USER
from dataservice.cli.common import fail, load
from dataservice.errors import DataServiceError

app = typer.Typer(no_args_is_help=True, help="Database schema and the change consumer's user.")


@app.command("upgrade")
def db_upgrade(revision: str = typer.Argument("head", help="Target migration.")) -> None:
    """Create the database if missing and migrate it to REVISION."""
    from dataservice.store.migrate import upgrade

    settings, config = load()
    try:
        created = upgrade(settings.database_url, config.database, revision)
    except DataServiceError as exc:
        raise fail(exc, 1) from None
    typer.echo(("created database; " if created else "") + f"schema at {revision}")


@app.command("changes-user")
def changes_user(
    user: str = typer.Option(DEFAULT_USER, help="The consumer's database user."),
    host: list[str] = typer.Option(
        list(DEFAULT_HOSTS), help="A host it connects from (repeat for several; '%' for any)."
    ),
    password_from_env: bool = typer.Option(
        False,
        "--password-from-env",
        help="Take the password from DATASERVICE_CHANGES_DATABASE_URL, which must name USER "
        "and a password (exit 2 otherwise), and print the URL with the password hidden.",
    ),
) -> None:
    """Create or update the change-stream consumer's database user with exactly
    the grants it needs, then print the DATASERVICE_CHANGES_DATABASE_URL line to use.

    Connects as DATASERVICE_DATABASE_URL's user, who must be allowed to create
    users; run it after `db upgrade`. The password is the one in
    DATASERVICE_CHANGES_DATABASE_URL when that names the same user (so running
    it again changes nothing), else a new one. It is stored nowhere: keep the
    printed line where the consumer's environment comes from. With
    --password-from-env the password is never drawn here nor printed: for a
    deployment that already gives the consumer its URL (compose/)."""
    # Imported here: the command line lists every command at each start.
    from sqlalchemy.engine import make_url

    from dataservice.changes.server import check_server
    from dataservice.changes.user import changes_url, create_changes_user, new_password
    from dataservice.errors import BinlogSetupError

    settings, config = load()
    admin = make_url(settings.database_url)
    if not admin.database:
        typer.echo("error: DATASERVICE_DATABASE_URL names no database", err=True)
        raise typer.Exit(2)
    current = make_url(settings.changes_database_url) if settings.changes_database_url else None
    kept = current is not None and current.username == user and bool(current.password)
    if password_from_env and not kept:
        # A random password here would be one the consumer's environment does not know.
        typer.echo(
            f"error: --password-from-env: DATASERVICE_CHANGES_DATABASE_URL must name user "
            f"{user} and a password",
            err=True,
        )
        raise typer.Exit(2)
    password = str(current.password) if current is not None and kept else new_password()
    try:
        create_changes_user(settings.database_url, user, password, admin.database, hosts=host)
    except DataServiceError as exc:
        raise fail(exc, 1) from None
    url = changes_url(settings.database_url, user, password)
    try:
        check_server(url, replica_server_id=config.changes.server_id)
    except BinlogSetupError as exc:
        # The user is there; the server itself still needs the settings named.
        typer.echo(f"warning: {exc}", err=True)
    except DataServiceError as exc:
        typer.echo(f"warning: could not check as {user}: {exc}", err=True)
    # Whoever set the password has it; a log that keeps this line need not.
    shown = make_url(url).render_as_string(hide_password=True) if password_from_env else url
    typer.echo(f"DATASERVICE_CHANGES_DATABASE_URL={shown}")
