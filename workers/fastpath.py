"""A task ``Strategy`` that lets the worker answer a request on the consumer
thread, before Celery builds a request object or touches the pool.

Celery calls a task's strategy for every message the consumer receives.
:func:`inline_strategy` offers each eligible message to the task's *inline
handler* (an :class:`InlineHandler`, provided by the worker runtime), which
either answers it completely and returns True, or returns False. Answered:
the message is acknowledged through the consumer's own ack callback, after
the answer was written (late acknowledgement holds: a worker that dies before
the ack leaves the message unacknowledged, and another worker answers it once
the visibility timeout has passed). Declined: the message goes on through
Celery's default strategy exactly as if this module did not exist.

How a task opts in: ``serve_inline(task, handler)`` before the worker starts
(strategies are built when the consumer connects). It sets the task's
``Strategy`` to :data:`INLINE_STRATEGY` and its ``inline_handler``. A task
whose ``inline_handler`` is None gets Celery's default strategy itself.

The handler's contract:

- It runs on the consumer thread, which also runs the event loop: control
  commands (``inspect ping``, ``active_queues``), heartbeats, timers and every
  other delivery wait while it works. So it must stay sub-millisecond-ish:
  a few Redis round trips with tight socket timeouts, never a database call.
- It never raises. If it does (a bug), the exception is logged and the
  message goes to the pool as if declined; nothing is lost, though the
  caller may see two answers if the handler had already written one.
- It may see a message more than once (``redelivered``): delivery is at
  least once.

What the default strategy does that this path keeps, or does not:

- Kept: late acknowledgement; reservations bounded by the prefetch window
  (an inline message holds its slot until acked: with prefetch equal to
  the pool's threads, a full pool also stalls inline answers); Celery's
  per-worker totals (``inspect stats`` ``total``, the heartbeat's
  ``processed``), counted under the task's name; task events
  (``task-received``, ``task-started``, ``task-succeeded``), sent after the
  answer and only while the worker sends task events (``-E`` or
  ``enable_events``); revocation, eta and rate limits, by falling back
  (below).
- Not kept: task signals (``task_received``, ``task_prerun``,
  ``task_postrun``, ``task_success``), Celery's "Task received/succeeded"
  log lines, ``inspect active``/``reserved`` listing (nothing can observe
  an inline message: control commands wait for it), time limits (the
  threads pool has none either) and result storage.
- Falls back to the default strategy for: protocol 1 messages; an ``eta``
  or ``countdown``; ``expires``; a revoked id (or revoked stamp); a rate
  limit on the task (checked per message, so ``rate_limit`` set by control
  applies at once); a result Celery would store; embedded callbacks,
  errbacks, chains or chords; autoscaler hooks; a body Celery cannot decode
  (the default strategy reports it as usual).

The pool path sees the same ``redelivered`` flag through :func:`redelivered`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final, Protocol

from celery.backends.base import DisabledBackend
from celery.utils.imports import symbol_by_name
from celery.worker import state as worker_state

from dataservice.limits.admission import DEADLINE_HEADER, SIZE_HEADER

__all__ = [
    "HANDLER_ATTRIBUTE",
    "INLINE_STRATEGY",
    "InlineHandler",
    "InlineMessage",
    "inline_strategy",
    "redelivered",
    "serve_inline",
]

log = logging.getLogger(__name__)

INLINE_STRATEGY: Final = "workers.fastpath:inline_strategy"
HANDLER_ATTRIBUTE: Final = "inline_handler"
_DEFAULT_STRATEGY: Final = "celery.worker.strategy:default"
# kombu's Redis transport sets it, in the headers and the delivery info, on a
# message it restored after the visibility timeout.
_REDELIVERED: Final = "redelivered"
# Signatures the trace would run or publish after the body; the inline path has no trace.
_EMBEDDED: Final = ("callbacks", "errbacks", "chain", "chord")
# What ``task-succeeded`` carries for a task that returns nothing (the repr
# of its return value): an inline answer has no return value either.
_NO_RESULT: Final = "None"

MessageHandler = Callable[..., Any]


@dataclass(frozen=True, slots=True)
class InlineMessage:
    """What the inline handler gets of one message, decoded once."""

    task_id: str
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]
    #: The message's headers, read-only: the default strategy may still need them.
    headers: Mapping[str, Any]
    #: Delivered before, to a worker that did not acknowledge it.
    redelivered: bool

    @property
    def deadline(self) -> Any:
        """The raw deadline header (``DEADLINE_HEADER``), as the pool path reads it."""
        return self.headers.get(DEADLINE_HEADER)

    @property
    def admitted_size(self) -> Any:
        """The raw size admission counted (``SIZE_HEADER``)."""
        return self.headers.get(SIZE_HEADER)


class InlineHandler(Protocol):
    """Answer ``message`` completely and return True, or return False to pass
    it to the pool. Runs on the consumer thread; must be quick and never raise."""

    def __call__(self, message: InlineMessage, /) -> bool: ...


def serve_inline(task: Any, handler: InlineHandler) -> None:
    """Have ``task``'s messages offered to ``handler`` first. Call it before
    the worker starts: Celery builds strategies when its consumer connects."""
    task.Strategy = INLINE_STRATEGY
    setattr(task, HANDLER_ATTRIBUTE, handler)


def redelivered(request: Any) -> bool:
    """Whether the pool path's ``task.request`` is a redelivery: Celery copies
    the flag into ``request.delivery_info`` (its trace reads it there too)."""
    info = getattr(request, "delivery_info", None) or {}
    return bool(info.get(_REDELIVERED))


def inline_strategy(task: Any, app: Any, consumer: Any, **options: Any) -> MessageHandler:
    """The ``Task.Strategy`` for a task with an inline handler: Celery's
    default strategy, with the handler offered each eligible message first."""
    default: MessageHandler = symbol_by_name(_DEFAULT_STRATEGY)(task, app, consumer, **options)
    handler: InlineHandler | None = getattr(task, HANDLER_ATTRIBUTE, None)
    if handler is None:
        return default
    return _InlineStrategy(task, app, consumer, handler, default)


class _InlineStrategy:
    """The message handler :func:`inline_strategy` returns (one per task and connection)."""

    def __init__(
        self,
        task: Any,
        app: Any,
        consumer: Any,
        handler: InlineHandler,
        default: MessageHandler,
    ) -> None:
        self._task = task
        self._consumer = consumer
        self._handler = handler
        self._default = default
        self._connection_errors = consumer.connection_errors
        self._results_stored = not isinstance(app.backend, DisabledBackend)

    def __call__(
        self, message: Any, body: Any, ack: Any, reject: Any, callbacks: Any, **kwargs: Any
    ) -> Any:
        inline = None if callbacks or body is not None else self._eligible(message)
        if inline is None:
            return self._default(message, body, ack, reject, callbacks, **kwargs)
        started = time.monotonic()
        try:
            answered = self._handler(inline)
        except Exception:
            log.exception("inline handler failed on %s; the pool serves it", inline.task_id)
            answered = False
        if not answered:
            return self._default(message, body, ack, reject, callbacks, **kwargs)
        # Only now: the answer is written, so a crash before this point leaves
        # the message unacknowledged and it is delivered again.
        ack(log, self._connection_errors)
        name = message.headers.get("shadow") or self._task.name
        worker_state.total_count[name] += 1
        worker_state.all_total_count[0] += 1
        self._send_events(inline, name, time.monotonic() - started)
        return None

    def _eligible(self, message: Any) -> InlineMessage | None:
        """The message as the handler sees it, or None when only the default
        strategy may handle it."""
        headers: dict[str, Any] = message.headers
        task_id = headers.get("id")
        if (
            "task" not in headers
            or not isinstance(task_id, str)
            or headers.get("eta")
            or headers.get("expires")
            or task_id in worker_state.revoked
            or (headers.get("stamped_headers") and worker_state.revoked_stamps)
            or self._rate_limited()
            or self._stores_result(headers)
        ):
            return None
        try:
            payload = message.payload
        except Exception:
            # The default strategy decodes it again and reports the error its own way.
            return None
        if not isinstance(payload, tuple | list) or len(payload) != 3:
            return None
        args, kwargs, embed = payload
        if (
            not isinstance(args, tuple | list)
            or not isinstance(kwargs, dict)
            or (isinstance(embed, dict) and any(embed.get(key) for key in _EMBEDDED))
        ):
            return None
        delivery_info = message.delivery_info or {}
        return InlineMessage(
            task_id=task_id,
            args=tuple(args),
            kwargs=MappingProxyType(kwargs),
            headers=MappingProxyType(headers),
            redelivered=bool(delivery_info.get(_REDELIVERED) or headers.get(_REDELIVERED)),
        )

    def _rate_limited(self) -> bool:
        consumer = self._consumer
        if consumer.disable_rate_limits:
            return False
        return consumer.task_buckets.get(self._task.name) is not None

    def _stores_result(self, headers: Mapping[str, Any]) -> bool:
        if not self._results_stored:
            return False
        ignore = headers.get("ignore_result")
        return not (self._task.ignore_result if ignore is None else ignore)

    def _send_events(self, inline: InlineMessage, name: str, runtime_s: float) -> None:
        """Task events as the pool path sends them, when task events are on.

        The dispatcher is looked up per message (the consumer replaces it on
        reconnect) and its groups too (``enable_events`` changes them at run time).
        """
        eventer = self._consumer.event_dispatcher
        if eventer is None or not eventer.enabled or not self._task.send_events:
            return
        if eventer.groups and "task" not in eventer.groups:
            return
        headers = inline.headers
        send = eventer.send
        send(
            "task-received",
            uuid=inline.task_id,
            name=name,
            args=headers.get("argsrepr", ""),
            kwargs=headers.get("kwargsrepr", ""),
            root_id=headers.get("root_id"),
            parent_id=headers.get("parent_id"),
            retries=headers.get("retries", 0),
            eta=None,
            expires=None,
        )
        send("task-started", uuid=inline.task_id)
        send("task-succeeded", uuid=inline.task_id, result=_NO_RESULT, runtime=runtime_s)
