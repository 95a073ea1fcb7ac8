"""Celery's own command line as a way in: the apps the deployment's
``workers/`` modules hand to ``celery -A``.

``celery -A workers.interactive worker`` (and ``workers.batch``,
``workers.changes``) runs the same worker as ``dataservice worker --lane
interactive`` (``dataservice changes``): the same app, defaults and checks at
start (``dataservice/worker/start.py``, ``changes.py``). What the command
line adds here:

- settings from the environment, as every ``dataservice`` command reads
  them; a missing or unknown one stops the command before Celery starts,
  with ``error: ...`` and exit 2;
- the worker options ``--metrics-port``, ``--metrics-address`` and
  ``--alive-file``, as ``dataservice worker`` has them;
- the service's log lines (``logging.format`` in ``queues.yml``) at Celery's
  ``-l`` level, instead of Celery's own.

``celery -A workers.interactive inspect ...`` and ``... flower`` load the same
app: importing it builds nothing that connects (the runtime comes with a
worker's start).
"""

from __future__ import annotations

import logging
from typing import Any

import click
from celery import Celery, signals

from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.enums import LaneName
from dataservice.errors import DataServiceError
from dataservice.worker.start import lane_app, refuse

__all__ = ["changes_worker_app", "lane_worker_app"]

#: The options a worker started by Celery's command line takes beyond Celery's.
WORKER_OPTIONS = (
    click.Option(
        ["--metrics-port"],
        type=click.IntRange(0, 65535),
        default=0,
        help="Serve Prometheus metrics on ADDRESS:PORT/metrics (0: off).",
    ),
    click.Option(
        ["--metrics-address"],
        default="127.0.0.1",
        help="The metrics endpoint's address (0.0.0.0: every interface, in a container).",
    ),
    click.Option(
        ["--alive-file"],
        type=click.Path(dir_okay=False),
        default=None,
        help="Touch this file every second from the consumer loop (dataservice health).",
    ),
)


def _from_environment() -> tuple[Settings, Config]:
    try:
        settings = Settings.from_env()
        return settings, settings.load()
    except DataServiceError as exc:
        refuse(exc)


def _command_line(app: Celery, config: Config, *, worker_options: bool = True) -> Celery:
    if worker_options:
        app.user_options["worker"].update(WORKER_OPTIONS)

    def configure(loglevel: int | str | None = None, **_: Any) -> None:
        from dataservice.observe.logs import configure_logging

        level = logging.getLevelName(loglevel) if isinstance(loglevel, int) else loglevel
        configure_logging(config.logging, str(level or "WARNING"))

    # Celery asks for its logging once, when a worker starts; with a receiver
    # it configures nothing of its own.
    signals.setup_logging.connect(configure, weak=False)
    return app


def lane_worker_app(lane: LaneName) -> Celery:
    """``lane``'s app for ``celery -A``, with settings from the environment."""
    settings, config = _from_environment()
    try:
        settings = settings.for_worker(config)
    except DataServiceError as exc:
        refuse(exc)
    return _command_line(lane_app(settings, config, lane), config)


def changes_worker_app() -> Celery:
    """The change consumer's app for ``celery -A``, with settings from the environment."""
    from dataservice.worker.changes import changes_app

    settings, config = _from_environment()
    return _command_line(changes_app(settings, config), config)
