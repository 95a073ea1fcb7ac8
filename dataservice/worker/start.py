"""Worker pool entry points: one Celery worker per lane.

Pool type: threads. The work is I/O-bound (a Redis or MySQL round trip per
request) and the database driver is a C extension that releases the GIL while
it waits, so threads overlap those waits at a fraction of prefork's memory. It
also keeps one SQLAlchemy pool per process, sized to the lane's concurrency, so
the connections a replica opens are exactly its thread count. Green threads
(gevent/eventlet) would need a driver that cooperates with their event loop;
mysqlclient blocks it.

A lane's app (:func:`lane_app`) is the same whichever command line starts its
worker, ``dataservice worker --lane LANE`` (:func:`run_worker`) or Celery's
own ``celery -A workers.LANE worker`` (``dataservice/worker/entry.py``): its
settings default to the lane's (threads, the lane's concurrency, its queue
alone, prefetch 1, late acknowledgement, the lane's task events), and its
:class:`LaneStep` checks what the worker was given before anything connects
to the database, then builds the lane's runtime and registers its task.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, NoReturn

from celery import Celery, bootsteps, concurrency, signals

from dataservice.broker.celery import celery_app
from dataservice.compat.celery import PER_TASK_LOGGERS
from dataservice.config.budget import require_within_budget
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.enums import LaneName
from dataservice.errors import ConfigError, DataServiceError
from dataservice.ops.processes import node_name
from dataservice.worker.alive import add_alive_file
from dataservice.worker.app import LaneRuntime, register_task
from dataservice.worker.reconnect import reconnect_promptly

log = logging.getLogger(__name__)

#: The pool every lane's worker runs (the module's docstring says why).
POOL = "threads"


def refuse(exc: DataServiceError) -> NoReturn:
    """Stop a worker before it starts: ``error: <exc>`` on stderr, exit 2, as
    the ``dataservice`` commands refuse (no traceback: the words say it)."""
    print(f"error: {exc}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def consume_only(worker: Any, queue: str, who: str) -> None:
    """Have ``worker`` consume ``queue`` alone: the default when it was given
    no ``-Q``; any other choice is refused (:class:`ConfigError`)."""
    queues = worker.app.amqp.queues
    chosen = set(queues.consume_from)
    if chosen == {queue}:
        return
    if chosen == set(queues) and queue in chosen:
        # Celery's default, every declared queue: this worker's is its own alone.
        queues.select([queue])
        return
    raise ConfigError(
        f"{who} consumes its own queue alone ({queue!r}), not {', '.join(sorted(chosen))}"
    )


@dataclass(frozen=True, slots=True)
class SideServices:
    """What a worker started by Celery's command line serves beside its work
    (the options :data:`dataservice.worker.entry.WORKER_OPTIONS` adds):
    metrics on ``metrics_address:metrics_port``, an alive file touched from
    the consumer loop."""

    metrics_port: int | None = None
    metrics_address: str | None = None
    alive_file: Path | str | None = None

    @classmethod
    def taken_from(cls, options: dict[str, Any]) -> SideServices:
        """The side services' options, taken out of a step's ``options``."""
        return cls(
            *(options.pop(name, None) for name in ("metrics_port", "metrics_address", "alive_file"))
        )

    def start(self, worker: Any) -> None:
        if self.metrics_port:
            from dataservice.observe.metrics import serve

            serve(self.metrics_port, self.metrics_address or "127.0.0.1")
        if self.alive_file is not None:
            # A consumer step: the consumer is built after every worker step's __init__.
            add_alive_file(worker.app, Path(self.alive_file))


class LaneStep(bootsteps.Step):  # type: ignore[misc]  # celery is untyped
    """The lane's worker at start: its pool, queue and thread count checked
    (the database budget as ``dataservice check-config`` computes it), then
    its runtime built and its task registered. Also takes the options
    ``--metrics-port``, ``--metrics-address`` and ``--alive-file``.

    Subclassed per app by :func:`lane_app` (``settings``, ``config``, ``lane``).
    """

    name = "dataservice lane"
    settings: ClassVar[Settings]
    config: ClassVar[Config]
    lane: ClassVar[LaneName]

    def __init__(self, worker: Any, **options: Any) -> None:
        side = SideServices.taken_from(options)
        super().__init__(worker, **options)
        lane, config = self.lane, self.config
        lane_config = config.lanes[lane]
        threads = int(worker.concurrency)
        try:
            who = f"the {lane.value} lane's worker"
            if worker.pool_cls is not concurrency.get_implementation(POOL):
                given = str(worker.pool_cls.__module__).rsplit(".", 1)[-1]
                raise ConfigError(
                    f"{who} runs the {POOL} pool (-P {POOL}), not {given}: its permits, "
                    "connections and lean path are one process's"
                )
            consume_only(worker, lane_config.queue, who)
            require_within_budget(config, lane, threads)
        except DataServiceError as exc:
            refuse(exc)
        # Celery logs every task received and succeeded at INFO: a line per
        # request is noise at this rate, and operators watch counters instead.
        for name in PER_TASK_LOGGERS:
            logging.getLogger(name).setLevel(logging.WARNING)
        side.start(worker)
        runtime = LaneRuntime(self.settings, config, lane, threads)
        register_task(worker.app, runtime)

        def close(**_: Any) -> None:
            # After the pool has finished its work (a warm shutdown waits for it).
            runtime.close()

        signals.worker_shutdown.connect(close, sender=worker, weak=False)
        fields = {
            "node": worker.hostname,
            "lane": lane.value,
            "queue": lane_config.queue,
            "threads": threads,
            "task_events": bool(worker.task_events),
        }
        log.info("worker %s starting", worker.hostname, extra={"fields": fields})


def lane_app(settings: Settings, config: Config, lane: LaneName) -> Celery:
    """The Celery app of ``lane``'s workers, with the lane's defaults; its
    runtime is built when a worker of it starts (:class:`LaneStep`), so that
    ``celery inspect`` and Flower load it without touching the database."""
    lane_config = config.lanes[lane]
    app = celery_app("dataservice", settings, config)
    reconnect_promptly(app)
    app.conf.update(
        worker_pool=POOL,
        worker_concurrency=lane_config.concurrency,
        # One message per thread: a message waiting behind a busy thread
        # could be served by another replica meanwhile.
        worker_prefetch_multiplier=1,
        task_acks_late=True,
        worker_send_task_events=lane_config.task_events,
    )
    step = type("LaneStep", (LaneStep,), {"settings": settings, "config": config, "lane": lane})
    app.steps["worker"].add(step)
    return app


def run_worker(
    settings: Settings,
    config: Config,
    lane: LaneName,
    *,
    concurrency: int | None = None,
    loglevel: str = "INFO",
    alive_file: Path | None = None,
    metrics_port: int = 0,
    metrics_address: str = "127.0.0.1",
) -> None:
    """Consume ``lane``'s queue until stopped (blocks): ``dataservice worker``."""
    lane_config = config.lanes[lane]
    app = lane_app(settings, config, lane)
    worker = app.Worker(
        hostname=node_name(lane.value),
        queues=[lane_config.queue],
        pool=POOL,
        concurrency=lane_config.concurrency if concurrency is None else concurrency,
        prefetch_multiplier=1,
        loglevel=loglevel,
        # Nothing to learn from the other workers at start or while running.
        without_gossip=True,
        without_mingle=True,
        # The banner is not a log line; LaneStep logs what it would say.
        quiet=True,
        alive_file=alive_file,
        metrics_port=metrics_port,
        metrics_address=metrics_address,
    )
    worker.start()
