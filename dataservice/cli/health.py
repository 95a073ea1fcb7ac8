"""``dataservice health [--deep]``: liveness for whatever restarts processes,
deep readiness for people and dashboards (:mod:`dataservice.ops.health`)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from dataservice.cli.common import load

# How long an alive file may go untouched (--max-age's default): several missed
# touches (one a second), so a busy moment is not taken for a dead loop.
DEFAULT_MAX_AGE_S = 10.0


def health(
    deep: bool = typer.Option(
        False, "--deep", help="Also the database, the cache's Redis and the change stream."
    ),
    alive_file: list[Path] = typer.Option(
        [], "--alive-file", help="A worker's alive file (its --alive-file); repeatable."
    ),
    max_age: float = typer.Option(
        DEFAULT_MAX_AGE_S,
        min=1.0,
        help="Seconds an alive file may go untouched before it counts as stale.",
    ),
    timeout: float = typer.Option(2.0, min=0.1, max=30.0, help="Seconds each check may take."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object, for machines."),
) -> None:
    """Exit 0 when live (and, with --deep, ready); 1 not live; 3 live but not ready.

    Liveness never touches the database: give it, never --deep, to a load
    balancer or an orchestrator (docs/operations.md, "Health")."""
    # Imported here: dataservice.cli imports this module to register the command.
    from dataservice.ops.health import exit_status, liveness, readiness

    settings, config = load()
    live = liveness(settings, alive_file, max_age, timeout)
    ready = readiness(settings, config, timeout) if deep else []
    status = exit_status(live, ready)
    if as_json:
        document = {
            "status": status.name.lower(),
            "liveness": [{"name": c.name, "ok": c.ok, "detail": c.detail} for c in live],
            "readiness": [{"name": c.name, "ok": c.ok, "detail": c.detail} for c in ready],
        }
        typer.echo(json.dumps(document, indent=2))
    else:
        for kind, checks in (("live", live), ("ready", ready)):
            for check in checks:
                mark = "ok  " if check.ok else "FAIL"
                typer.echo(f"{mark} {kind:<5} {check.name}: {check.detail}")
        typer.echo(status.name.lower().replace("_", " "))
    raise typer.Exit(int(status))
