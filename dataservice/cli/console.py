"""The commands' console (rich): on a terminal, the terminal's width;
elsewhere (a pipe, a log file, CI) wide enough that no table cuts its cells,
unless ``COLUMNS`` says otherwise."""

from __future__ import annotations

import os
import sys

from rich.console import Console

# Columns off a terminal: the widest table (the load test's lanes) fits.
WIDTH_OFF_TERMINAL = 200


def console() -> Console:
    """A console for a command's output."""
    if sys.stdout.isatty() or "COLUMNS" in os.environ:
        return Console()
    return Console(width=WIDTH_OFF_TERMINAL)
