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
from typing import Any
from weakref import WeakKeyDictionary

from celery import Celery
from celery.worker.control import inspect_command

from dataservice.broker.glue import celery_app, direct_queue
from dataservice.changes.consumer import CHANGES_COMMAND, ChangeConsumer
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.ops.processes import node_name
from dataservice.pools.alive import add_alive_file
from dataservice.redis.keys import CHANGES_QUEUE

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


def run_changes_node(
    settings: Settings, config: Config, loglevel: str = "INFO", alive_file: Path | None = None
) -> None:
    """Run the consumer and its worker node until stopped (blocks)."""
    app = celery_app("dataservice-changes", settings, config)
    if alive_file is not None:
        add_alive_file(app, alive_file)
    # Declared like the lanes' queues (the service creates no queue implicitly).
    app.conf.task_queues = [*app.conf.task_queues, direct_queue(CHANGES_QUEUE)]
    consumer = ChangeConsumer(settings, config)
    _CONSUMERS[app] = consumer
    thread = threading.Thread(target=consumer.run, name="change-consumer", daemon=True)
    worker = app.Worker(
        hostname=node_name("changes"),
        queues=[CHANGES_QUEUE],
        pool="solo",
        concurrency=1,
        loglevel=loglevel,
        without_gossip=True,
        without_mingle=True,
        # The banner is not a log line.
        quiet=True,
    )
    log.info("change consumer node %s starting", worker.hostname)
    thread.start()
    try:
        worker.start()
    finally:
        consumer.stop()
        thread.join(config.changes.lease_ms / 1000 + 5)
        consumer.close()
