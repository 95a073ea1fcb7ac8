"""``dataservice flower``: Flower against the service's broker, authenticated.

Flower shows the lanes' queues and every worker node (the pools and the
change consumers) and can revoke tasks or shut workers down: it is an
operator's console, so basic authentication is on unless ``--no-auth`` is
given, and that is refused on any address but loopback. The credentials come
from ``DATASERVICE_FLOWER_AUTH`` (``user:password``, several separated by
commas), never from ``queues.yml`` or the command line, where ``ps`` would
show them; they reach Flower through its own ``FLOWER_BASIC_AUTH``.

With cells configured, one Flower watches one cell (``--cell`` or
``DATASERVICE_CELL``), as a worker serves one: each cell has its own broker,
and so its own queues and workers.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
from typing import Any

import typer

from dataservice.cli.common import fail, load
from dataservice.errors import DataServiceError

LOOPBACK_NAMES = frozenset({"localhost"})


def is_loopback(address: str) -> bool:
    if address in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def name_every_queue() -> None:
    """Flower lists only the queues the answering workers consume (all the
    app's only when none answers): a lane whose workers are all down would
    vanish from its broker page just when its backlog matters. Every queue the
    app declares is listed too."""
    from flower.views import BaseHandler

    reported = BaseHandler.get_active_queue_names

    def names(self: Any) -> list[str]:
        declared = {queue.name for queue in self.capp.conf.task_queues or [] if queue.name}
        return sorted(set(reported(self)) | declared)

    BaseHandler.get_active_queue_names = names


def check_auth(auth: str) -> str | None:
    """What is wrong with ``auth``, or None; never repeats a password."""
    for n, entry in enumerate(auth.split(","), start=1):
        user, sep, password = entry.partition(":")
        if not sep or not user.strip() or not password:
            return f"entry {n} of DATASERVICE_FLOWER_AUTH is not user:password"
    return None


def flower(
    address: str = typer.Option("127.0.0.1", help="Listen on this address."),
    port: int = typer.Option(5555, min=1, max=65535, help="Listen on this port."),
    no_auth: bool = typer.Option(
        False, "--no-auth", help="No basic authentication: refused unless on loopback."
    ),
    cell: str | None = typer.Option(
        None, help="The cell to watch, when cells are configured (DATASERVICE_CELL)."
    ),
) -> None:
    """Flower for the service's broker: the lanes' and the consumers' queues,
    with their lengths, and every worker node. Basic authentication from
    DATASERVICE_FLOWER_AUTH (docs/operations.md, "Flower")."""
    from dataservice.broker.celery import celery_app, direct_queue
    from dataservice.observe.logs import configure_logging
    from dataservice.redis.keys import CHANGES_QUEUE

    settings, config = load()
    try:
        if cell is not None:
            settings = dataclasses.replace(settings, cell=cell)
        settings = settings.for_worker(config)
    except DataServiceError as exc:
        raise fail(exc, 2) from None
    auth = settings.flower_auth
    if no_auth and not is_loopback(address):
        typer.echo(
            f"error: --no-auth on {address}: only a loopback address may go without", err=True
        )
        raise typer.Exit(2)
    if not no_auth:
        if auth is None:
            typer.echo(
                "error: set DATASERVICE_FLOWER_AUTH=user:password (or give --no-auth on a "
                "loopback address)",
                err=True,
            )
            raise typer.Exit(2)
        problem = check_auth(auth)
        if problem is not None:
            typer.echo(f"error: {problem}", err=True)
            raise typer.Exit(2)
        os.environ["FLOWER_BASIC_AUTH"] = auth
    else:
        os.environ.pop("FLOWER_BASIC_AUTH", None)
    # Never an unauthenticated API, whatever the environment says.
    os.environ.pop("FLOWER_UNAUTHENTICATED_API", None)
    # Before Flower parses its options: tornado adds no handler of its own then.
    configure_logging(config.logging)
    app = celery_app("dataservice-flower", settings, config)
    # Flower counts the queues the app names: the lanes', and the consumers' own.
    app.conf.task_queues = [*app.conf.task_queues, direct_queue(CHANGES_QUEUE)]
    # Flower reads queue lengths with a Redis client of its own, chosen by the
    # URL's scheme, which the service's transport hides; Flower publishes
    # nothing a caller would, so kombu's own Redis transport serves it.
    app.conf.broker_transport = None
    name_every_queue()
    app.start(["flower", f"--address={address}", f"--port={port}"])
