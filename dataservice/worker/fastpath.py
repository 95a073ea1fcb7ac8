"""A task ``Strategy`` that lets the worker answer a request on the consumer
thread, or hand it to the pool as it is, before Celery builds a request object.

Celery calls a task's strategy for every message the consumer receives.
:func:`inline_strategy` offers each eligible message to the task's *inline
handler* (an :class:`InlineHandler`, provided by the worker runtime). It
answers the message (:class:`Outcome`), declines it, or returns
:class:`PoolWork` that answers it on a thread of the worker's pool. Answered,
here or in the pool: the message is acknowledged after the answer was written
(late acknowledgement holds: a worker that dies before the ack leaves it
unacknowledged, and another worker answers it after the visibility timeout).
Declined: it goes on through Celery's default strategy exactly as if this
module did not exist.

A task opts in with ``serve_inline(task, handler)`` before the worker starts
(strategies are built when the consumer connects); without a handler it
gets Celery's default strategy itself.

The handler's contract:

- It runs on the consumer thread, which also runs the event loop: control
  commands (``inspect ping``, ``active_queues``), heartbeats, timers and every
  other delivery wait while it works. So it must stay sub-millisecond-ish:
  a few Redis round trips with tight socket timeouts, never a database call
  (that is :class:`PoolWork`'s).
- It never raises; if it does (a bug), the message goes to the pool as if
  declined. It may see a message more than once (``redelivered``).

What the default strategy does that this path keeps, or does not:

- Kept: late acknowledgement; reservations bounded by the prefetch window
  (a message holds its slot until acked, so a full pool also stalls inline
  answers); the pool's own lifecycle (a warm shutdown waits for pool work);
  Celery's per-worker totals (``inspect stats``, heartbeats); ``inspect
  active`` (and the heartbeats' active count): :class:`PoolWork` is listed
  among the worker's active requests from the moment it is handed to the
  pool until its message is settled, its arguments as the sender described
  them (``argsrepr``), never the body; task events, only while the worker
  sends them (``-E``); revocation, eta and rate limits, by falling back.
- Not kept: task signals, Celery's per-task log lines, ``inspect
  reserved`` (a message handed to the pool has a thread: the prefetch
  window is the pool's size), ``inspect query_task``, time limits (the
  threads pool has none either) and result storage. A message answered on
  the consumer thread is never listed: nothing else runs there meanwhile,
  ``inspect`` included.
- Drops, before anything else: a message in a content type the worker does
  not accept. kombu takes a message without one for raw bytes, which it
  never checks against the accepted types, and Celery's default strategy
  fails on such a body (a ``TypeError`` that stops the worker, and the
  message, unacknowledged, stops the next one). It is rejected without
  being queued again, and logged without its body.
- Falls back to the default strategy for: batch messages (``ds_ops``);
  protocol 1 messages; an ``eta``, ``countdown`` or ``expires``; a revoked id
  or stamp; a task rate limit (checked per message); a result Celery would
  store; embedded callbacks, errbacks, chains or chords; autoscaler hooks; a
  body Celery cannot decode.

The pool path sees the same ``redelivered`` flag through :func:`redelivered`.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final, Protocol

from dataservice.compat import celery as celery_compat
from dataservice.compat import kombu as kombu_compat
from dataservice.limits.admission import DEADLINE_HEADER, OPS_HEADER, SIZE_HEADER

__all__ = [
    "HANDLER_ATTRIBUTE",
    "INLINE_STRATEGY",
    "InlineHandler",
    "InlineMessage",
    "Outcome",
    "PoolWork",
    "inline_strategy",
    "redelivered",
    "serve_inline",
]

log = logging.getLogger(__name__)

INLINE_STRATEGY: Final = "dataservice.worker.fastpath:inline_strategy"
HANDLER_ATTRIBUTE: Final = "inline_handler"
# kombu's Redis transport sets it, in the headers and the delivery info, on a
# message it restored after the visibility timeout.
_REDELIVERED: Final = "redelivered"
# Signatures the trace would run or publish after the body; the inline path has no trace.
_EMBEDDED: Final = ("callbacks", "errbacks", "chain", "chord")
# What ``task-succeeded`` carries for a task that returns nothing (the repr
# of its return value): an inline answer has no return value either.
_NO_RESULT: Final = "None"

MessageHandler = celery_compat.MessageHandler


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
    #: What acknowledging it takes on the broker's Redis: kombu's unacked
    #: index, its unacked hash, the delivery tag (``Outcome.ANSWERED_AND_ACKED``).
    acknowledgement: tuple[str, str, str] = ("", "", "")
    #: The message as kombu records it among the unacknowledged, for a handler
    #: that records its delivery itself (:class:`PoolWork`); None if the
    #: channel cannot say.
    record: Callable[[], str] | None = None
    #: Nothing recorded its delivery yet: the record waits for the handler's
    #: decision (an answer given now has no record to remove).
    record_pending: bool = False

    @property
    def deadline(self) -> Any:
        return self.headers.get(DEADLINE_HEADER)  # raw, as the pool path reads it

    @property
    def admitted_size(self) -> Any:
        return self.headers.get(SIZE_HEADER)

    @property
    def admitted_ops(self) -> Any:
        return self.headers.get(OPS_HEADER)


class Outcome(enum.IntEnum):
    """What an inline handler did with a message (a plain bool works too)."""

    DECLINED = 0
    ANSWERED = 1
    # The answer and the acknowledgement went in one transaction
    # (``InlineMessage.acknowledgement``): only the consumer's books are left.
    ANSWERED_AND_ACKED = 2


@dataclass(frozen=True, slots=True)
class PoolWork:
    """Work the handler hands to the worker's pool: ``run`` answers the
    message there (an Outcome), off the consumer thread; it must never raise.
    ``recorded``: the handler already recorded the message's delivery on the
    broker (:attr:`InlineMessage.record`), so the channel need not."""

    run: Callable[[], Outcome]
    recorded: bool = False


class InlineHandler(Protocol):
    """Answer ``message`` (an :class:`Outcome`, True), decline it (False), or
    return :data:`PoolWork` that answers it on a pool thread (a request that
    needs the database: the pool's own lean path, without Celery's request
    and trace). Runs on the consumer thread; must be quick and never raise."""

    def __call__(self, message: InlineMessage, /) -> bool | Outcome | PoolWork: ...


def serve_inline(task: Any, handler: InlineHandler) -> None:
    """Have ``task``'s messages offered to ``handler`` first. Call it before
    the worker starts: Celery builds strategies when its consumer connects."""
    celery_compat.use_strategy(task, INLINE_STRATEGY)
    setattr(task, HANDLER_ATTRIBUTE, handler)


def redelivered(request: Any) -> bool:
    """Whether the pool path's ``task.request`` is a redelivery: Celery copies
    the flag into ``request.delivery_info`` (its trace reads it there too)."""
    info = getattr(request, "delivery_info", None) or {}
    return bool(info.get(_REDELIVERED))


def inline_strategy(task: Any, app: Any, consumer: Any, **options: Any) -> MessageHandler:
    """The ``Task.Strategy`` for a task with an inline handler: Celery's
    default strategy, with the handler offered each eligible message first."""
    default = celery_compat.default_strategy(task, app, consumer, **options)
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
        self._consumer = celery_compat.StrategyConsumer(consumer)
        self._handler = handler
        self._default = default
        self._results_stored = celery_compat.stores_results(app)
        self._accepted = frozenset(app.conf.accept_content)

    def __call__(
        self, message: Any, body: Any, ack: Any, reject: Any, callbacks: Any, **kwargs: Any
    ) -> Any:
        if message.content_type not in self._accepted:
            return self._dropped(message, reject)
        inline = None if callbacks or body is not None else self._eligible(message)
        if inline is None:
            return self._passed_on(message, body, ack, reject, callbacks, **kwargs)
        started = time.monotonic()
        try:
            answered = self._handler(inline)
        except Exception:
            log.exception("inline handler failed on %s; the pool serves it", inline.task_id)
            answered = False
        if isinstance(answered, PoolWork):
            self._in_pool(message, ack, started, answered)
            return None
        if not answered:
            return self._passed_on(message, body, ack, reject, callbacks, **kwargs)
        self._settle(message, ack, started, Outcome(answered))
        return None

    def _in_pool(self, message: Any, ack: Any, started: float, work: PoolWork) -> None:
        """Run ``work`` on a thread of the worker's pool, then settle the
        message there. The message stays delivered and unacknowledged until
        then: it holds its place in the prefetch window, and a worker that
        dies first leaves it to be delivered again. A warm shutdown waits for
        the pool, so for it too."""
        # The record of the message's delivery, if it waited for this
        # decision (dataservice/compat/kombu.py), unless the handler wrote it.
        if work.recorded:
            kombu_compat.recorded_elsewhere(message)
        else:
            kombu_compat.write_deferred(message)
        # Listed while the pool has it, for inspect active; both ends on this
        # thread, which also answers inspect.
        listed = celery_compat.LeanRequest(
            self._task, message.headers, message.delivery_info or {}, self._consumer.hostname
        )
        celery_compat.list_active(listed)

        def run() -> None:
            try:
                outcome = work.run()
            except Exception:
                # Never meant to happen (the work answers its own failures):
                # acknowledged, so that it is not delivered again to fail again.
                log.exception("pool work failed on %s", message.headers.get("id"))
                outcome = Outcome.ANSWERED
            # On the consumer's loop, which this wakes: a full prefetch window
            # asks the broker for the next message only once one is settled.
            self._consumer.soon(self._settle, message, ack, started, outcome, listed)

        self._consumer.in_pool(run)

    def _dropped(self, message: Any, reject: Any) -> None:
        """Reject a message no path here may read; it is not queued again."""
        log.warning(
            "dropped task message %s: content type %r is not accepted",
            message.headers.get("id"),
            message.content_type,
        )
        kombu_compat.write_deferred(message)
        self._consumer.reject(reject, log)

    def _passed_on(self, message: Any, *args: Any, **kwargs: Any) -> Any:
        """The default strategy's, after the record of the message's delivery,
        which may wait for this decision (``dataservice/compat/kombu.py``)."""
        kombu_compat.write_deferred(message)
        return self._default(message, *args, **kwargs)

    def _settle(
        self,
        message: Any,
        ack: Any,
        started: float,
        outcome: Outcome,
        listed: celery_compat.LeanRequest | None = None,
    ) -> None:
        """Acknowledge an answered message, count it and tell the events.
        Only now: the answer is written, so a crash before this point leaves
        the message unacknowledged and it is delivered again."""
        if listed is not None:
            celery_compat.unlist(listed)
        if outcome == Outcome.ANSWERED_AND_ACKED:
            kombu_compat.settle_acknowledged(message)
        else:
            self._consumer.acknowledge(ack, log)
        name = message.headers.get("shadow") or self._task.name
        celery_compat.count_processed(name)
        self._send_events(message.headers, name, time.monotonic() - started)

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
            # A batch is never answered here: it goes to the pool at once, and
            # its delivery is recorded before its (larger) envelope is opened.
            or headers.get(OPS_HEADER)
            or celery_compat.revoked(task_id, stamped=bool(headers.get("stamped_headers")))
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
        # Only kombu's Redis channel keeps books of its own (RabbitMQ keeps them).
        index, unacked = kombu_compat.unacked_keys(message) or ("", "")
        return InlineMessage(
            task_id=task_id,
            args=tuple(args),
            kwargs=MappingProxyType(kwargs),
            headers=MappingProxyType(headers),
            redelivered=bool(delivery_info.get(_REDELIVERED) or headers.get(_REDELIVERED)),
            acknowledgement=(index, unacked, str(message.delivery_tag)),
            record=kombu_compat.delivery_record(message),
            record_pending=kombu_compat.record_pending(message),
        )

    def _rate_limited(self) -> bool:
        return self._consumer.rate_limited(self._task.name)

    def _stores_result(self, headers: Mapping[str, Any]) -> bool:
        if not self._results_stored:
            return False
        ignore = headers.get("ignore_result")
        return not (self._task.ignore_result if ignore is None else ignore)

    def _send_events(self, headers: Mapping[str, Any], name: str, runtime_s: float) -> None:
        """Task events as the pool path sends them, when task events are on.

        The dispatcher is looked up per message (the consumer replaces it on
        reconnect) and its groups too (``enable_events`` changes them at run time).
        """
        eventer = self._consumer.events
        if eventer is None or not eventer.enabled or not self._task.send_events:
            return
        if eventer.groups and "task" not in eventer.groups:
            return
        task_id = headers.get("id")
        send = eventer.send
        send(
            "task-received",
            uuid=task_id,
            name=name,
            args=headers.get("argsrepr", ""),
            kwargs=headers.get("kwargsrepr", ""),
            root_id=headers.get("root_id"),
            parent_id=headers.get("parent_id"),
            retries=headers.get("retries", 0),
            eta=None,
            expires=None,
        )
        send("task-started", uuid=task_id)
        send("task-succeeded", uuid=task_id, result=_NO_RESULT, runtime=runtime_s)
