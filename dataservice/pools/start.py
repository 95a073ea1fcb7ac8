"""Worker pool entry points: one Celery worker per lane.

Pool type: threads. The work is I/O-bound (a Redis or MySQL round trip per
request) and the database driver is a C extension that releases the GIL while
it waits, so threads overlap those waits at a fraction of prefork's memory. It
also keeps one SQLAlchemy pool per process, sized to the lane's concurrency, so
the connections a replica opens are exactly its thread count. Green threads
(gevent/eventlet) would need a driver that cooperates with their event loop;
mysqlclient blocks it.
"""

from __future__ import annotations

import logging
from pathlib import Path

from dataservice.compat.celery import PER_TASK_LOGGERS
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.enums import LaneName
from dataservice.ops.processes import node_name
from dataservice.pools.alive import add_alive_file
from dataservice.pools.app import create_app

log = logging.getLogger(__name__)


def run_worker(
    settings: Settings,
    config: Config,
    lane: LaneName,
    *,
    concurrency: int | None = None,
    loglevel: str = "INFO",
    alive_file: Path | None = None,
) -> None:
    """Consume ``lane``'s queue until stopped (blocks). Callers check the budget first."""
    lane_config = config.lanes[lane]
    threads = lane_config.concurrency if concurrency is None else concurrency
    app, runtime = create_app(settings, config, lane, threads)
    if alive_file is not None:
        add_alive_file(app, alive_file)
    # Celery logs every task received and succeeded at INFO: a line per request
    # is noise at this rate, and operators watch counters instead.
    for name in PER_TASK_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    node = node_name(lane.value)
    worker = app.Worker(
        hostname=node,
        queues=[lane_config.queue],
        pool="threads",
        concurrency=threads,
        prefetch_multiplier=1,
        optimization="fair",
        loglevel=loglevel,
        without_gossip=True,
        without_mingle=True,
        task_events=lane_config.task_events,
        # The banner is not a log line; the line below says what it would.
        quiet=True,
    )
    fields = {
        "node": node,
        "lane": lane.value,
        "queue": lane_config.queue,
        "threads": threads,
        "task_events": lane_config.task_events,
    }
    log.info("worker %s starting", node, extra={"fields": fields})
    try:
        worker.start()
    finally:
        runtime.close()
