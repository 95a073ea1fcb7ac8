"""``dataservice cells``: which cell each caller belongs to (docs/operations.md, "Cells")."""

from __future__ import annotations

import typer

from dataservice.cli.common import load

app = typer.Typer(no_args_is_help=True, help="The cells and the callers each one serves.")


@app.command("show")
def cells_show(
    with_names: list[str] = typer.Option(
        [], "--with", help="A cell to add to the configured ones: who would move to it."
    ),
    without: list[str] = typer.Option(
        [], "--without", help="A configured cell to leave out: who would move from it."
    ),
) -> None:
    """Print each configured caller's cell and whether it is pinned; with
    --with or --without, the cells it would have then."""
    from dataservice.config.cells import CellsConfig

    _, config = load()
    cells = config.cells
    if not cells.names:
        typer.echo("no cells configured: one deployment on the environment's URLs")
        return
    names = tuple(n for n in (*cells.names, *with_names) if n not in without)
    pins = {caller: cell for caller, cell in cells.callers.items() if cell in names}
    if not names:
        typer.echo("error: --without leaves no cell", err=True)
        raise typer.Exit(2)
    now = cells.assign(config.callers)
    then = CellsConfig(names=names, callers=pins).assign(config.callers)
    for caller in sorted(config.callers):
        line = f"{caller}: {now[caller]}" + (" (pinned)" if caller in cells.callers else "")
        if then[caller] != now[caller]:
            line += f" -> {then[caller]}"
        typer.echo(line)
    for cell in cells.names:
        typer.echo(f"cell {cell}: {sum(1 for c in now.values() if c == cell)} callers")
