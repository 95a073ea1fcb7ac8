"""The baseline for ``python -m bench.roundtrip``: a stock Celery app with a no-op task.

Redis broker *and* Redis result backend, awaited with ``.delay().get()``, as
stock Celery users do; or RabbitMQ as the broker (``--broker-url``), with a
quorum queue and publisher confirms, as Celery's documentation pairs them and
as the service runs. The worker is started with exactly the options
:func:`dataservice.worker.start.run_worker` gives the interactive lane (threads pool, the
lane's concurrency, prefetch multiplier 1, acks_late, fair scheduling, no
gossip, no mingle, the same chatty loggers silenced), so the only difference
between the two systems is what happens per message.

Run the worker with ``python -m bench.baselines.noop --url redis://... --concurrency N``.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys

from celery import Celery
from kombu import Queue

NOOP_TASK = "bench.noop"
# Celery's default queue: what a stock user gets without routing.
QUEUE = "celery"


def noop() -> None:
    """The task: nothing."""


def make_app(url: str, broker_url: str | None = None) -> Celery:
    """A stock Celery app on ``url`` (broker and result backend, unless
    ``broker_url`` names another broker) with the no-op task."""
    app = Celery("bench-bare", set_as_current=False)
    if broker_url and broker_url.startswith(("amqp://", "amqps://")):
        # On RabbitMQ, as Celery's documentation pairs them and as the service
        # runs: a quorum queue, every publish confirmed.
        app.conf.update(
            task_queues=[Queue(QUEUE, queue_arguments={"x-queue-type": "quorum"})],
            broker_transport_options={"confirm_publish": True},
        )
    app.conf.update(
        broker_url=broker_url or url,
        result_backend=url,
        broker_connection_retry_on_startup=True,
        task_default_queue=QUEUE,
        # The worker options the service's interactive lane runs with.
        task_acks_late=True,
        worker_prefetch_multiplier=1,
        # Same logging set-up as the service's worker (no cost difference per task).
        worker_hijack_root_logger=False,
        worker_redirect_stdouts=False,
    )
    # One module-level callable for every app (the bench makes one per caller
    # thread): Celery warns when a task name is bound to different callables.
    app.task(name=NOOP_TASK)(noop)
    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.baselines.noop", description=__doc__)
    parser.add_argument("--url", required=True, help="Redis URL: broker and result backend")
    parser.add_argument("--broker-url", help="another broker (RabbitMQ's amqp://...)")
    parser.add_argument("--concurrency", type=int, required=True)
    parser.add_argument("--loglevel", default="INFO")
    args = parser.parse_args(argv)
    serve(make_app(args.url, args.broker_url), args.concurrency, args.loglevel)


def serve(app: Celery, concurrency: int, loglevel: str = "INFO") -> None:
    """Run ``app``'s worker in the foreground with the lane's options."""
    from dataservice.compat.celery import PER_TASK_LOGGERS

    logging.basicConfig(
        level=loglevel.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for name in PER_TASK_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    worker = app.Worker(
        hostname=f"bare-{os.getpid()}@{socket.gethostname()}",
        queues=[QUEUE],
        pool="threads",
        concurrency=concurrency,
        prefetch_multiplier=1,
        optimization="fair",
        loglevel=loglevel.upper(),
        without_gossip=True,
        without_mingle=True,
    )
    worker.start()


if __name__ == "__main__":
    main()
