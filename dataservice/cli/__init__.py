"""The ``dataservice`` command line: one module per command group, the shared
helpers in :mod:`dataservice.cli.common`.

Commands from other installed packages (the tooling's ``loadtest``) register
under the entry-point group ``dataservice.commands``, each a command function.
They are imported only when no built-in command is named, so that starting
``dataservice worker`` imports nothing of theirs.
"""

from __future__ import annotations

import sys
from importlib.metadata import entry_points

import typer

from dataservice.cli import acl, db, inspect, keys
from dataservice.cli import cache as cache_cli
from dataservice.cli import cells as cells_cli
from dataservice.cli.changes import changes
from dataservice.cli.flower import flower
from dataservice.cli.health import health
from dataservice.cli.run import run
from dataservice.cli.worker import check_config, worker

PLUGIN_GROUP = "dataservice.commands"

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Run and operate dataservice.")
app.add_typer(db.app, name="db")
app.add_typer(acl.app, name="acl")
app.add_typer(cache_cli.app, name="cache")
app.add_typer(cells_cli.app, name="cells")
app.add_typer(keys.app, name="keys")
app.add_typer(inspect.app, name="inspect")
app.command("changes")(changes)
app.command("health")(health)
app.command("flower")(flower)
app.command("run")(run)
app.command("check-config")(check_config)
app.command("worker")(worker)


def _registered() -> set[str]:
    commands = [info.name for info in app.registered_commands]
    groups = [info.name for info in app.registered_groups]
    return {name for name in commands + groups if name}


def add_plugins(argv: list[str]) -> None:
    """Register other packages' commands, unless ``argv`` names a command
    already there (a built-in one: nothing else is imported)."""
    registered = _registered()
    if argv and argv[0] in registered:
        return
    for point in entry_points(group=PLUGIN_GROUP):
        if point.name not in registered:
            app.command(point.name)(point.load())


def main() -> None:
    add_plugins(sys.argv[1:2])
    app()


if __name__ == "__main__":
    main()
