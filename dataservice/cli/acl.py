"""``dataservice acl``: the Redis users (ACL) of the callers and the workers."""

from __future__ import annotations

import typer

from dataservice.cli.common import fail, load
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.errors import DataServiceError
from dataservice.security.callers import KeyRing, load_keyring

app = typer.Typer(no_args_is_help=True, help="Redis users (ACL) for callers and workers.")


def _inputs() -> tuple[Settings, Config, KeyRing]:
    """Settings, configuration and the callers file, or exit 2 naming the problem."""
    settings, config = load()
    try:
        return settings, config, load_keyring(settings.callers_file)
    except DataServiceError as exc:
        raise fail(exc, 2) from None


@app.command("apply")
def acl_apply() -> None:
    """Create or replace the callers file's Redis users; print their names.

    Connects to DATASERVICE_REDIS_URL, which must name an administrator: on
    a sentinel:// URL, to the primary and every replica the Sentinels know of;
    exits 1 naming each server it could not reach, once the others have them."""
    from dataservice.security.acl import apply_everywhere

    settings, config, keyring = _inputs()
    try:
        names = apply_everywhere(settings.redis_url, keyring, config)
    except DataServiceError as exc:
        raise fail(exc, 1) from None
    for name in names:
        typer.echo(name)
    if not names:
        typer.echo("no Redis passwords in the callers file: no users set", err=True)


@app.command("show")
def acl_show() -> None:
    """Print the commands `acl apply` runs, with <password> placeholders.

    One ACL SETUSER per line, quoted for redis-cli."""
    from dataservice.security.acl import render_commands

    _, config, keyring = _inputs()
    for line in render_commands(keyring, config):
        typer.echo(line)
