"""A Celery app whose task opts in to the inline fast path, for
``tests/worker/test_fastpath.py``. Its worker runs as a process of its own:

    python -m tests.harness.fastpath_app --url redis://...|amqp://... [--answers-url redis://...]
        [--visibility-timeout S]

It is the service's worker set-up (the service's transport and protobuf
serializer, threads pool, prefetch 1, late acknowledgement, fair scheduling,
its consumer; on RabbitMQ quorum queues and confirmed publishes) with a task
of its own. A body is ``MODE:TOKEN``; every answer is RPUSHed to
:func:`reply_key`, on the answers' Redis (the broker's, or ``--answers-url``),
as ``PATH:REDELIVERED`` (PATH: who answered, ``inline`` or ``pool``;
REDELIVERED: ``1`` or ``0``). Modes:

- ``inline``: the inline handler answers it;
- ``pool``: the handler declines, the task body answers;
- ``raise``: the handler raises, the task body answers;
- ``hold-inline`` / ``hold-pool``: on first delivery, the handler (or the task
  body) RPUSHes the token to :data:`HELD` and blocks until :func:`release_key`
  exists (or the process is killed), so the message stays unacknowledged;
  then, or when redelivered, it is answered like ``inline`` / ``pool``.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
import time
from typing import Any

import redis
from celery import Celery, Task

from dataservice.broker.celery import CONTENT_TYPE, SERIALIZER
from dataservice.compat.celery import PacedConsumer
from dataservice.config.settings import AMQP_SCHEMES
from dataservice.worker.fastpath import InlineMessage, redelivered, serve_inline

TASK = "tests.fastpath.echo"
QUEUE = "fastpath"
HELD = "fastpath:held"
NODE_PREFIX = "fastpath"
# Longer than any test: a held message waits for its release or a SIGKILL.
HOLD_S = 120.0
_HOLD_POLL_S = 0.02
# A handler on the consumer thread must give up fast rather than stall it.
_SOCKET_TIMEOUT_S = 0.25


def reply_key(token: str) -> str:
    return f"fastpath:reply:{token}"


def release_key(token: str) -> str:
    return f"fastpath:release:{token}"


def node_name(pid: int) -> str:
    return f"{NODE_PREFIX}-{pid}@{socket.gethostname()}"


def send(app: Celery, body: bytes, task_id: str, queue: str = QUEUE, **options: Any) -> None:
    """Publish ``body`` as the service's client does: one bytes argument, protobuf."""
    app.send_task(
        TASK, args=(body,), task_id=task_id, queue=queue, serializer=SERIALIZER, **options
    )


def make_app(url: str, visibility_timeout_s: float = 3600) -> Celery:
    """The app on broker ``url`` (Redis, or RabbitMQ: every queue it names
    is made a quorum queue, as the service's lanes are)."""
    app = Celery("fastpath-tests", set_as_current=False)
    app.conf.update(
        broker_url=url,
        broker_connection_retry_on_startup=True,
        result_backend=None,
        task_ignore_result=True,
        # Per message, as the service's client does: control messages stay JSON.
        task_serializer="json",
        accept_content=[CONTENT_TYPE, "application/json"],
        task_default_queue=QUEUE,
        task_acks_late=True,
        worker_prefetch_multiplier=1,
        worker_hijack_root_logger=False,
        worker_redirect_stdouts=False,
        worker_consumer=f"{PacedConsumer.__module__}:{PacedConsumer.__name__}",
    )
    if url.startswith(AMQP_SCHEMES):
        app.conf.update(
            broker_transport_options={"confirm_publish": True},
            task_default_queue_type="quorum",
            task_create_missing_queue_type="quorum",
        )
        return app
    app.conf.update(
        broker_transport="dataservice.broker.redis:RedisTransport",
        broker_transport_options={
            "visibility_timeout": visibility_timeout_s,
            # Sweep for expired unacknowledged messages every second, not
            # every 100 s: the kill test waits for a redelivery.
            "unacked_restore_interval": 1,
            "unacked_restore_throttle": 1,
        },
    )
    return app


def _parse(body: object) -> tuple[str, str]:
    if not isinstance(body, bytes):
        return "", ""
    mode, _, token = body.decode().partition(":")
    return mode, token


def register(app: Celery, client: redis.Redis) -> Task:
    """The task, its body answering from the pool, and its inline handler."""

    def answer(token: str, path: str, again: bool) -> None:
        client.rpush(reply_key(token), f"{path}:{int(again)}")

    def hold(token: str) -> None:
        client.rpush(HELD, token)
        until = time.monotonic() + HOLD_S
        while not client.exists(release_key(token)) and time.monotonic() < until:
            time.sleep(_HOLD_POLL_S)

    @app.task(name=TASK, bind=True, typing=False, ignore_result=True, shared=False)
    def echo(self: Task, *args: Any) -> None:
        mode, token = _parse(args[0] if args else None)
        again = redelivered(self.request)
        if mode.startswith("hold") and not again:
            hold(token)
        answer(token, "pool", again)

    def inline(message: InlineMessage) -> bool:
        mode, token = _parse(message.args[0] if message.args else None)
        if mode == "raise":
            raise RuntimeError("a bug in the inline handler")
        if mode == "hold-inline" and not message.redelivered:
            hold(token)
        if mode not in ("inline", "hold-inline"):
            return False
        answer(token, "inline", message.redelivered)
        return True

    serve_inline(echo, inline)
    return echo


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True, help="The broker.")
    parser.add_argument("--answers-url", help="The answers' Redis (default: the broker).")
    parser.add_argument("--queue", default=QUEUE)
    parser.add_argument("--concurrency", type=int, default=3)
    parser.add_argument("--visibility-timeout", type=float, default=3600)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    app = make_app(args.url, args.visibility_timeout)
    client = redis.Redis.from_url(
        args.answers_url or args.url,
        socket_timeout=_SOCKET_TIMEOUT_S,
        socket_connect_timeout=_SOCKET_TIMEOUT_S,
    )
    register(app, client)
    worker = app.Worker(
        hostname=node_name(os.getpid()),
        queues=[args.queue],
        pool="threads",
        concurrency=args.concurrency,
        prefetch_multiplier=1,
        optimization="fair",
        loglevel="INFO",
        without_gossip=True,
        without_mingle=True,
    )
    worker.start()


if __name__ == "__main__":
    main()
