"""``dataservice keys``: the callers' signing keys (``DATASERVICE_CALLERS_FILE``)."""

from __future__ import annotations

from pathlib import Path

import typer

from dataservice.cli.common import fail, load
from dataservice.config.settings import Settings
from dataservice.errors import DataServiceError

app = typer.Typer(no_args_is_help=True, help="Caller signing keys (DATASERVICE_CALLERS_FILE).")


def _callers_file(settings: Settings) -> Path:
    if settings.callers_file is None:
        typer.echo("error: DATASERVICE_CALLERS_FILE is not set", err=True)
        raise typer.Exit(2)
    return settings.callers_file


@app.command("init")
def keys_init() -> None:
    """Give every caller in queues.yml that has none a key (and a Redis password),
    creating the callers file (mode 600) if needed. Existing keys are kept."""
    from dataservice.security.callers import ensure_callers_file

    settings, config = load()
    path = _callers_file(settings)
    try:
        added = ensure_callers_file(settings, config)
    except DataServiceError as exc:
        raise fail(exc, 1) from None
    typer.echo(
        f"{path}: " + (f"new keys for {', '.join(added)}" if added else "every caller has a key")
    )


@app.command("rotate")
def keys_rotate(
    caller: str = typer.Argument(..., help="The caller whose signing key to replace."),
    key_id: str = typer.Option(..., "--key-id", help="The new key's id, unique across callers."),
) -> None:
    """Put a fresh signing key first for CALLER, keeping its current key as the second."""
    from dataservice.security.callers import rotate_key

    settings, _ = load()
    path = _callers_file(settings)
    try:
        dropped = rotate_key(path, caller, key_id)
    except DataServiceError as exc:
        raise fail(exc, 1) from None
    typer.echo(f"{caller} signs with {key_id}" + (f"; dropped {dropped}" if dropped else ""))
