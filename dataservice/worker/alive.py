"""A worker's word that its consumer loop turns: a file touched from the loop.

The step runs on the worker's own timer, which the consumer's event loop
drives: a loop that stalls stops touching the file. Liveness
(``dataservice health --alive-file``) reads only the file's age and the
broker, never the database (``docs/operations.md``, "Health").
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from celery import Celery, bootsteps

# How often the loop touches the file; liveness allows several missed touches.
ALIVE_EVERY_S = 1.0


def touch(path: Path) -> None:
    path.touch()


def add_alive_file(app: Celery, path: Path) -> None:
    """Have ``app``'s workers touch ``path`` every second from their consumer loop."""
    path.parent.mkdir(parents=True, exist_ok=True)

    class AliveFile(bootsteps.StartStopStep):  # type: ignore[misc]  # celery is untyped
        def __init__(self, parent: Any, **kwargs: Any) -> None:
            super().__init__(parent, **kwargs)
            self._entry: Any = None

        def start(self, c: Any) -> None:
            touch(path)
            self._entry = c.timer.call_repeatedly(ALIVE_EVERY_S, touch, (path,))

        def stop(self, c: Any) -> None:
            if self._entry is not None:
                self._entry.cancel()
                self._entry = None

    app.steps["consumer"].add(AliveFile)
