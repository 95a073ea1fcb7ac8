"""The client's side of the wire: publish an envelope to a lane, await its answer.

Messages follow Celery's task protocol, so any Celery worker or tool reads
them; the client builds each one itself (:mod:`.message`) and pushes it
through the broker channel's admission, on a connection from Celery's
connection pool (:data:`PUBLISH_CONNECTIONS`). A client's
answers come back on its reply channel (:class:`~.inbox.Inbox`), whose slot
for each request is made before the request is published. No Celery type
leaves this module.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any
from weakref import WeakKeyDictionary

import redis
from kombu.exceptions import LimitExceeded
from kombu.exceptions import OperationalError as BrokerError

from dataservice.broker.glue import celery_app
from dataservice.broker.rabbitmq import AMQP_ERRORS, AmqpPublisher, lane_queues
from dataservice.broker.results import ResultStore
from dataservice.client.inbox import Inbox
from dataservice.client.message import task_message
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.enums import LaneName
from dataservice.errors import DeadlineExceeded, InternalError, Unavailable
from dataservice.limits.admission import (
    CALLER_HEADER,
    DEADLINE_HEADER,
    OPERATION_HEADER,
    OPS_HEADER,
    AdmissionRefused,
    caller_pacing,
    lane_admission_bounds,
)
from dataservice.redis.bounded import SLACK_S, left, within

RETRY_BROKER_DOWN_S = 0.5
# A publish that failed for want of a broker (or of the Redis admission runs on).
_PUBLISH_ERRORS: tuple[type[BaseException], ...] = (
    BrokerError,
    redis.RedisError,
    LimitExceeded,
    *AMQP_ERRORS,
)
_EPOCHS_KEPT = 8
# Broker connections a client publishes on, however many of its threads
# publish at once: a publish holds one for a round trip, far less than the
# rest of a call costs its thread. (Each holds two Redis connections: kombu
# checks a new channel on a pool of its own.)
PUBLISH_CONNECTIONS = 1
# On RabbitMQ a publish holds its connection until the broker confirms it, a
# quorum of the queue having written it: about a millisecond, as long as the
# rest of a call. A few let a client's threads publish side by side.
AMQP_PUBLISH_CONNECTIONS = 4
# The broker's epoch is asked at most this often (s), however many calls wait.
_EPOCH_EVERY_S = 0.5


class Epochs:
    """The broker epochs a client has seen end, and when (monotonic): shared
    by every handle of the client, so a backlog lost in one restart is
    reported in one grace period, not one per handle. However many calls
    wait, the broker is asked at most once per ``_EPOCH_EVERY_S``."""

    def __init__(self) -> None:
        self._ended: dict[str, float] = {}
        self._asked = 0.0
        self._lock = threading.Lock()

    def ended_for(self, epoch: str) -> float | None:
        """How long ago the broker's epoch was first seen to differ from
        ``epoch`` (None: not seen)."""
        with self._lock:
            seen = self._ended.get(epoch)
        return None if seen is None else time.monotonic() - seen

    def may_ask(self, epoch: str, deadline_ms: int) -> float:
        """Seconds a look at the broker's epoch may take now (0: none is due)."""
        left_s = (deadline_ms - time.time() * 1000) / 1000
        if left_s <= 0 or self.ended_for(epoch) is not None:
            return 0.0
        with self._lock:
            if time.monotonic() - self._asked < _EPOCH_EVERY_S:
                return 0.0
            self._asked = time.monotonic()
        return left_s

    def saw(self, epoch: str, now: str) -> None:
        """The broker said its epoch is ``now``."""
        if now == epoch:
            return
        with self._lock:
            self._ended.setdefault(epoch, time.monotonic())
            # Epochs end once per Redis restart: a few are plenty to remember.
            while len(self._ended) > _EPOCHS_KEPT:
                del self._ended[next(iter(self._ended))]


def broker_failure(deadline_ms: int) -> DeadlineExceeded | Unavailable:
    """What a caller hears of a publish the broker did not take: its deadline
    passed meanwhile, or the broker is unreachable (retryably)."""
    if time.time() * 1000 >= deadline_ms:
        return DeadlineExceeded("the deadline passed before the broker answered")
    return Unavailable("the broker is unreachable", retry_after=RETRY_BROKER_DOWN_S)


def item_headers(caller: str, deadline_ms: int, operation: str, ops: int) -> dict[str, Any]:
    """The service's own headers of one message (admission reads them)."""
    headers: dict[str, Any] = {DEADLINE_HEADER: deadline_ms}
    if caller:
        headers[CALLER_HEADER] = caller
    if operation:
        headers[OPERATION_HEADER] = operation
    if ops > 1:
        headers[OPS_HEADER] = ops
    return headers


class Transport:
    """``caller``: the caller whose reply channel (:attr:`inbox`) receives the
    answers; without one, answers are read from :attr:`results`, under each
    request's own key, by whoever published it."""

    def __init__(
        self, settings: Settings, config: Config, *, caller: str = "", max_waiters: int = 4
    ) -> None:
        self.config = config
        self._app = celery_app("dataservice-client", settings, config, caller=True)
        # A pool of its own: the app's (broker_pool_limit) resizes every kombu
        # pool in the process, a worker's included.
        self._connection = self._app.connection_for_write()
        self._pool = self._connection.Pool(
            limit=AMQP_PUBLISH_CONNECTIONS if settings.broker_is_amqp else PUBLISH_CONNECTIONS
        )
        # Made lazily, as every pool here: a client that never reads a key
        # this way holds no connection for it.
        self.results = ResultStore.from_url(
            settings.result_backend_url, max_waiters=max_waiters, bounded=True
        )
        self.inbox = Inbox(settings.result_backend_url, caller) if caller else None
        self._grace_s = config.results.grace_ms / 1000
        self._reply_to = self._app.thread_oid
        self.epochs = Epochs()
        # On RabbitMQ, admission runs on the result backend's Redis, then the
        # message is published and confirmed (dataservice/broker/rabbitmq.py).
        self._amqp = settings.broker_is_amqp
        self._publishers: WeakKeyDictionary[Any, AmqpPublisher] = WeakKeyDictionary()
        # What every channel's publisher admits and declares by (made once).
        self._amqp_lanes = (
            lane_admission_bounds(config),
            caller_pacing(config),
            lane_queues(config),
        )

    def publish(
        self,
        body: bytes,
        *,
        request_id: str,
        lane: LaneName,
        deadline_ms: int,
        caller: str = "",
        operation: str = "",
        ops: int = 1,
    ) -> str:
        """Publish one request (of ``ops`` operations); returns the broker's
        epoch it went out in."""
        return self.publish_many(
            [(body, request_id, deadline_ms, operation, ops)], lane=lane, caller=caller
        )

    def publish_many(
        self,
        items: Iterable[tuple[bytes, str, int, str, int]],
        *,
        lane: LaneName,
        caller: str = "",
    ) -> str:
        """Publish in order; returns the broker's epoch they went out in. A
        refusal raises :class:`AdmissionRefused` (its ``sent``: how many went
        before it, and its ``epoch``). With an :attr:`inbox`, each item's
        answer is expected there from just before it is pushed; an item not
        pushed is expected no more.
        ``caller`` (when given) holds the messages to that caller's rate at
        admission, as the workers will; each item's operation (``read``, ...;
        '' if unknown) lets admission add what such a request takes to the
        queue's wait. Each item: the signed body, the message id, its
        deadline, its operation and how many operations it carries (a batch's
        many: admission counts operations)."""
        sent = 0
        epoch = ""
        refusal = None
        queue = self.config.lanes[lane].queue
        items = list(items)
        # Every Redis call of the publish, and the wait for a connection, keeps
        # to the earliest deadline among the items.
        deadline_ms = min((item[2] for item in items), default=0)
        left_s = (deadline_ms - time.time() * 1000) / 1000
        inbox = self.inbox
        try:
            # Only a channel is needed (admission pushes the message): a pooled
            # connection, waited for no longer than the deadline allows.
            with (
                within(max(left_s, 0.0) + SLACK_S),
                self._pool.acquire(block=True, timeout=left()) as connection,
            ):
                admit = self._admit_on(connection)
                for body, request_id, item_deadline_ms, operation, ops in items:
                    headers = item_headers(caller, item_deadline_ms, operation, ops)
                    message = task_message(body, request_id, queue, headers, self._reply_to)
                    if inbox is not None:
                        lapses_in_s = (item_deadline_ms - time.time() * 1000) / 1000
                        inbox.expect(request_id, lapses_in_s + self._grace_s)
                    try:
                        epoch = admit(queue, message)
                    except AdmissionRefused as refused_here:
                        # Raised once the connection is back in its pool,
                        # outside the block that holds it.
                        refusal = refused_here
                        break
                    sent += 1
        except _PUBLISH_ERRORS:
            # Whatever went out before the failure, its caller hears only the
            # failure: none of its answers is waited for.
            if inbox is not None:
                for item in items:
                    inbox.forget(item[1])
            raise broker_failure(deadline_ms) from None
        if refusal is not None:
            if inbox is not None:
                for item in items[sent:]:
                    inbox.forget(item[1])
            refusal.sent, refusal.epoch = sent, epoch
            raise refusal
        return epoch

    def _admit_on(self, connection: Any) -> Callable[[str, dict[str, Any]], str]:
        """How a message is admitted and published on ``connection``."""
        channel = connection.default_channel
        if not self._amqp:
            return channel.admit  # type: ignore[no-any-return]
        publisher = self._publishers.get(channel)
        if publisher is None:
            publisher = AmqpPublisher(channel, self.results.client, *self._amqp_lanes)
            self._publishers[channel] = publisher

        def admit(queue: str, message: dict[str, Any]) -> str:
            return publisher.admit(queue, message, left() or 0.0)

        return admit

    @property
    def replies(self) -> Inbox:
        """The reply channel, for a transport that has one."""
        if self.inbox is None:
            raise InternalError(
                "this transport has no reply channel (it was made without a caller)"
            )
        return self.inbox

    def ended_for(self, epoch: str) -> float | None:
        """How long ago this client first saw that the broker's epoch is no
        longer ``epoch`` (None: not seen); asks nothing of the broker."""
        return self.epochs.ended_for(epoch)

    def look_at_epoch(self, epoch: str, deadline_ms: int) -> None:
        """Ask the broker for its epoch (within ``deadline_ms``, Unix ms), if
        a look is due; a broker that cannot say tells nothing."""
        left_s = self.epochs.may_ask(epoch, deadline_ms)
        if not left_s or self._amqp:
            return
        try:
            with (
                within(left_s),
                self._pool.acquire(block=True, timeout=left()) as connection,
            ):
                self.epochs.saw(epoch, str(connection.default_channel.epoch()))
        except (BrokerError, redis.RedisError, LimitExceeded, OSError):
            return

    def close(self) -> None:
        if self.inbox is not None:
            self.inbox.close()
        self.results.close()
        self._pool.force_close_all()
        self._connection.release()
        self._app.close()
