"""Celery's internals the service relies on: the worker's task strategies,
its state, its consumer, and the control channel's raw request.

Tested with celery 5.7.0 (``pyproject.toml`` pins ``celery~=5.7.0`` for this
module's sake); ``tests/compat/test_compat.py`` pins each name below, by signature
and, where cheap, by behaviour.

Internal names, and why:

- ``celery.app.task.Task.Strategy``: what the worker builds a task's message
  handler from (``Task.start_strategy``, when its consumer connects); the
  fast path names its own (:func:`use_strategy`, ``dataservice/worker/fastpath.py``).
- ``celery.worker.strategy.default``: Celery's own strategy, to which the fast
  path hands every message it does not answer (:func:`default_strategy`).
  The handler it returns is called with ``(message, body, ack, reject,
  callbacks)``, and ``ack(logger, connection_errors)`` acknowledges.
- ``celery.utils.imports.symbol_by_name``: resolves that strategy by the name
  ``Task.Strategy`` holds by default.
- ``celery.backends.base.DisabledBackend``: an app without a result backend,
  whose results nobody stores (:func:`stores_results`).
- ``celery.worker.state.revoked``, ``revoked_stamps``: ids and stamps a
  worker was told to drop; such a message goes to the default strategy,
  which drops it (:func:`revoked`).
- ``celery.worker.state.total_count``, ``all_total_count``: the worker's
  totals (``inspect stats``, heartbeats), counted for a message answered
  outside Celery's request as Celery would (:func:`count_processed`).
- ``celery.worker.consumer.Consumer.pool``, ``call_soon``,
  ``connection_errors``, ``disable_rate_limits``, ``task_buckets``,
  ``event_dispatcher``: what a strategy uses of the worker's consumer
  (:class:`StrategyConsumer`).
- ``celery.worker.consumer.Consumer.ensure_connected``: where the consumer
  connects, and reconnects, to the broker; :class:`PacedConsumer` paces its
  attempts (``dataservice/worker/reconnect.py``).
- ``celery.worker.consumer.Consumer.Blueprint.default_steps`` and the step
  ``celery.worker.consumer.delayed_delivery:DelayedDelivery``: once Celery
  sees a quorum queue it declares 28 more (``celery_delayed_0`` ...) for
  native delayed delivery and binds every queue to them; the service never
  delays a message, so :class:`PacedConsumer` leaves the step out
  (:data:`DELAYED_DELIVERY_STEP`).
- ``celery.worker.state.active_requests``, ``reserved_requests``: the
  worker's books of the requests it holds, which ``inspect active`` and
  ``reserved``, the heartbeats' ``active`` count and Flower read; a message
  on the lean path is listed there while a pool thread serves it
  (:class:`LeanRequest`, :func:`list_active`, :func:`unlist`). What Celery
  itself reads of a listed request, and :class:`LeanRequest` answers:
  ``id``, ``name``, ``info(safe)`` (its keys as ``Request.info``'s), ``task``
  (its ``acks_late``), ``acknowledged``, ``cancel(pool, ...)`` (a cold
  shutdown cancels what is listed) and a writable ``eventer``.
- ``celery.app.control.Inspect._request``: a control command by name, for
  the service's own (``dataservice_permits``, ``dataservice_changes``), which
  ``Inspect`` has no method for (:func:`broadcast_request`).
- The loggers ``celery.worker.strategy`` and ``celery.app.trace``: a line per
  task received and succeeded (:data:`PER_TASK_LOGGERS`).
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Final

from celery.backends.base import DisabledBackend
from celery.utils.imports import symbol_by_name
from celery.worker import state as worker_state
from celery.worker.consumer import Consumer

__all__ = [
    "DEFAULT_STRATEGY",
    "DELAYED_DELIVERY_STEP",
    "PER_TASK_LOGGERS",
    "LeanRequest",
    "MessageHandler",
    "PacedConsumer",
    "StrategyConsumer",
    "broadcast_request",
    "count_processed",
    "default_strategy",
    "list_active",
    "revoked",
    "stores_results",
    "unlist",
    "use_strategy",
]

#: The consumer's step that sets up native delayed delivery on quorum queues.
DELAYED_DELIVERY_STEP: Final = "celery.worker.consumer.delayed_delivery:DelayedDelivery"
#: Where ``Task.Strategy`` points by default.
DEFAULT_STRATEGY: Final = "celery.worker.strategy:default"
#: Celery's loggers that write a line per task received and per task done.
PER_TASK_LOGGERS: Final = ("celery.worker.strategy", "celery.app.trace")

#: A strategy's message handler: ``(message, body, ack, reject, callbacks, **kwargs)``.
MessageHandler = Callable[..., Any]


def use_strategy(task: Any, strategy: str) -> None:
    """Have the worker build ``task``'s message handler with ``strategy``
    (``module:callable``, called as :func:`default_strategy` is); it does so
    when its consumer connects."""
    task.Strategy = strategy


def default_strategy(task: Any, app: Any, consumer: Any, **options: Any) -> MessageHandler:
    """Celery's own message handler for ``task`` (what a strategy receives,
    passed on)."""
    handler: MessageHandler = symbol_by_name(DEFAULT_STRATEGY)(task, app, consumer, **options)
    return handler


def stores_results(app: Any) -> bool:
    """Whether ``app`` has a result backend."""
    return not isinstance(app.backend, DisabledBackend)


def revoked(task_id: str, *, stamped: bool) -> bool:
    """Whether this worker was told to drop the task (by its id or, for a
    ``stamped`` message, possibly by a stamp)."""
    return task_id in worker_state.revoked or (stamped and bool(worker_state.revoked_stamps))


def count_processed(name: str) -> None:
    """Count a task of ``name`` as processed, in the worker's totals."""
    worker_state.total_count[name] += 1
    worker_state.all_total_count[0] += 1


class LeanRequest:
    """A message served on the lean path, as the worker's books list a request
    (:func:`list_active`): what ``inspect active`` shows of it and what a
    cold shutdown asks of it.

    Its arguments are shown as the sender described them (``argsrepr``,
    ``kwargsrepr``), never the body, whether or not ``inspect`` asks for the
    safe form: a request's payload stays out of control replies.
    """

    #: Never before its answer is written (late acknowledgement), and then it
    #: is no longer listed.
    acknowledged = False

    def __init__(
        self,
        task: Any,
        headers: Mapping[str, Any],
        delivery_info: Mapping[str, Any],
        hostname: str,
    ) -> None:
        # Only kept here: what inspect shows is put together when it asks.
        self.id = headers.get("id")
        self.name: str = headers.get("shadow") or task.name
        self.task = task
        self.eventer: Any = None
        self._headers = headers
        self._delivery = delivery_info
        self._hostname = hostname
        self._started = time.time()

    def info(self, safe: bool = False) -> dict[str, Any]:
        """As ``Request.info``: the same keys, for ``inspect active``."""
        headers, delivery = self._headers, self._delivery
        return {
            "id": self.id,
            "name": self.name,
            "args": headers.get("argsrepr", ""),
            "kwargs": headers.get("kwargsrepr", ""),
            "type": self.task.name,
            "hostname": self._hostname,
            "time_start": self._started,
            "acknowledged": self.acknowledged,
            "delivery_info": {
                key: delivery.get(key)
                for key in ("exchange", "routing_key", "priority", "redelivered")
            },
            "worker_pid": os.getpid(),
        }

    def cancel(self, pool: Any, signal: Any = None, emit_retry: bool = True) -> None:
        """Nothing to do: a pool thread cannot be stopped, and the message,
        unacknowledged until its answer is written, is delivered again to
        another worker if this one goes first."""


def list_active(request: LeanRequest) -> None:
    """List ``request`` among the worker's active requests. Called on the
    consumer thread, where the control commands that read the list run."""
    worker_state.active_requests.add(request)


def unlist(request: LeanRequest) -> None:
    """Take ``request`` off the worker's books (on the consumer thread too)."""
    worker_state.active_requests.discard(request)
    # A connection lost meanwhile copies what is active into the reserved.
    worker_state.reserved_requests.discard(request)


def _ignore(result: object) -> None:
    """The pool's callback for work whose outcome it settles itself."""


class StrategyConsumer:
    """What a strategy uses of the worker's consumer (the one it is built with)."""

    def __init__(self, consumer: Any) -> None:
        self._consumer = consumer
        self.connection_errors: tuple[type[BaseException], ...] = consumer.connection_errors
        #: The worker's node name (``interactive-1234@host``).
        self.hostname: str = consumer.hostname

    def acknowledge(self, ack: Any, logger: logging.Logger) -> None:
        """Call the ``ack`` a handler received; a failure is logged on ``logger``."""
        ack(logger, self.connection_errors)

    def reject(self, reject: Any, logger: logging.Logger) -> None:
        """Call the ``reject`` a handler received: the message is dropped, not
        queued again; a failure is logged on ``logger``."""
        reject(logger, self.connection_errors, requeue=False)

    def in_pool(self, run: Callable[[], None]) -> None:
        """Run ``run`` on a thread (or process) of the worker's pool."""
        self._consumer.pool.apply_async(run, callback=_ignore)

    def soon(self, callback: Callable[..., Any], *args: Any) -> None:
        """Run ``callback(*args)`` on the consumer's event loop, waking it."""
        self._consumer.call_soon(callback, *args)

    def rate_limited(self, task_name: str) -> bool:
        """Whether the worker holds ``task_name`` to a rate limit."""
        consumer = self._consumer
        if consumer.disable_rate_limits:
            return False
        return consumer.task_buckets.get(task_name) is not None

    @property
    def events(self) -> Any:
        """The consumer's event dispatcher (None without one); looked up each
        time, as the consumer replaces it on reconnect."""
        return self._consumer.event_dispatcher


class PacedConsumer(Consumer):  # type: ignore[misc]  # celery is untyped
    """Celery's worker consumer, its connection attempts paced by
    :attr:`reconnect_intervals`: (first, step, most) seconds apart, as
    ``kombu.Connection.ensure_connection``'s ``interval_start``,
    ``interval_step`` and ``interval_max``; None keeps kombu's. It sets up
    no native delayed delivery (:data:`DELAYED_DELIVERY_STEP`)."""

    reconnect_intervals: ClassVar[tuple[float, float, float] | None] = None

    class Blueprint(Consumer.Blueprint):  # type: ignore[misc]  # celery is untyped
        """Celery's consumer steps, less native delayed delivery."""

        default_steps: ClassVar[list[str]] = [
            step for step in Consumer.Blueprint.default_steps if step != DELAYED_DELIVERY_STEP
        ]

    def ensure_connected(self, conn: Any) -> Any:
        if self.reconnect_intervals is None:
            return super().ensure_connected(conn)
        first, step, most = self.reconnect_intervals
        conn.ensure_connection = functools.partial(
            conn.ensure_connection,
            interval_start=first,
            interval_step=step,
            interval_max=most,
        )
        try:
            return super().ensure_connected(conn)
        finally:
            del conn.ensure_connection


def broadcast_request(inspect: Any, command: str, **arguments: Any) -> dict[str, Any] | None:
    """The replies to control command ``command`` (with ``arguments``) by
    node name, as ``inspect`` (a ``celery.app.control.Inspect``) asks its
    own commands (to one ``destination`` named alone: its reply); None when
    no node replied."""
    replies: dict[str, Any] | None = inspect._request(command, **arguments)
    return replies
