"""The change consumer as a Celery worker node.

It consumes a ``changes`` queue of its own, to which nothing is sent: being a
worker node is what makes it answer ``celery inspect ping``, appear in
``dataservice run``'s summary and in Flower beside the two pools, and answer
``celery inspect dataservice_changes`` with its state (active or standby,
fencing token, position, lag in seconds, events and bytes behind the server).
The consumer itself runs on a thread of its own
(:class:`~dataservice.changes.consumer.ChangeConsumer`); Celery's warm
shutdown (``SIGTERM``) stops it, and its lease goes to a standby at once.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any, ClassVar
from weakref import WeakKeyDictionary

from celery import Celery, bootsteps
from celery.worker.control import inspect_command

from dataservice.broker.celery import celery_app, direct_queue
from dataservice.changes.consumer import CHANGES_COMMAND, ChangeConsumer
from dataservice.changes.server import check_server
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.errors import DataServiceError
from dataservice.ops.processes import node_name
from dataservice.redis.keys import CHANGES_QUEUE
from dataservice.worker.start import SideServices, consume_only, refuse

log = logging.getLogger(__name__)

_CONSUMERS: WeakKeyDictionary[Celery, ChangeConsumer] = WeakKeyDictionary()


@inspect_command(name=CHANGES_COMMAND)
def _changes(state: Any) -> dict[str, Any]:
    """The consumer's state, over Celery's control channel."""
    consumer = _CONSUMERS.get(state.consumer.app)
    if consumer is None:
        return {}
    current = consumer.state
    position = current.position
    return {
        "role": current.role,
        "token": current.token,
        "position": f"{position.log_file}:{position.log_pos}" if position else None,
        "lag_s": round(current.lag_s, 3),
        "lag_events": current.lag_events,
        "lag_bytes": current.lag_bytes,
        "transactions": current.transactions,
        "invalidated": current.invalidated,
    }


class ChangesStep(bootsteps.StartStopStep):  # type: ignore[misc]  # celery is untyped
    """The change consumer's node at start: the server's binlog settings and
    the consumer's grants checked (every one missing named, exit 2), its queue
    alone consumed; then the consumer runs on a thread of its own, from the
    worker's start to its shutdown. Also takes ``--metrics-port``,
    ``--metrics-address`` and ``--alive-file``.

    Subclassed per app by :func:`changes_app` (``settings``, ``config``).
    """

    name = "dataservice changes"
    settings: ClassVar[Settings]
    config: ClassVar[Config]

    def __init__(self, worker: Any, **options: Any) -> None:
        side = SideServices.taken_from(options)
        super().__init__(worker, **options)
        settings, config = self.settings, self.config
        try:
            consume_only(worker, CHANGES_QUEUE, "the change consumer's node")
            # Every missing setting and grant at once, before anything starts.
            check_server(settings.changes_url, replica_server_id=config.changes.server_id)
        except DataServiceError as exc:
            refuse(exc)
        side.start(worker)
        consumer = ChangeConsumer(settings, config)
        _CONSUMERS[worker.app] = consumer
        self._consumer = consumer
        self._thread = threading.Thread(target=consumer.run, name="change-consumer", daemon=True)
        self._stopped = False
        log.info("change consumer node %s starting", worker.hostname)

    def start(self, worker: Any) -> None:
        self._thread.start()

    def stop(self, worker: Any) -> None:
        """The consumer stopped and closed (once): its lease goes to a standby at once."""
        if self._stopped:
            return
        self._stopped = True
        self._consumer.stop()
        if self._thread.is_alive():
            self._thread.join(self.config.changes.lease_ms / 1000 + 5)
        self._consumer.close()

    # Celery's cold shutdown stops it the same way.
    terminate = stop


def changes_app(settings: Settings, config: Config) -> Celery:
    """The change consumer node's Celery app: one solo pool on the ``changes``
    queue, to which nothing is sent; the consumer starts with a worker of it
    (:class:`ChangesStep`)."""
    app = celery_app("dataservice-changes", settings, config)
    # Declared like the lanes' queues (the service creates no queue implicitly).
    app.conf.task_queues = [*app.conf.task_queues, direct_queue(CHANGES_QUEUE)]
    app.conf.update(worker_pool="solo", worker_concurrency=1)
    step = type("ChangesStep", (ChangesStep,), {"settings": settings, "config": config})
    app.steps["worker"].add(step)
    return app


def run_changes_node(
    settings: Settings,
    config: Config,
    loglevel: str = "INFO",
    alive_file: Path | None = None,
    metrics_port: int = 0,
    metrics_address: str = "127.0.0.1",
) -> None:
    """Run the consumer and its worker node until stopped (blocks): ``dataservice changes``."""
    worker = changes_app(settings, config).Worker(
        hostname=node_name("changes"),
        queues=[CHANGES_QUEUE],
        pool="solo",
        concurrency=1,
        loglevel=loglevel,
        without_gossip=True,
        without_mingle=True,
        # The banner is not a log line.
        quiet=True,
        alive_file=alive_file,
        metrics_port=metrics_port,
        metrics_address=metrics_address,
    )
    worker.start()
