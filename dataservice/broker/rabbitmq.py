"""RabbitMQ as the broker (``amqp://``, ``amqps://``): the lanes' queues and
how a request is published to one.

Each lane is a durable quorum queue (replicated by Raft; a publisher confirm
comes once a quorum holds the message), declared by whoever reaches it first,
worker or client, with the same arguments:

- ``x-max-length`` and ``x-max-length-bytes`` at the lane's admission bounds,
  with ``x-overflow: reject-publish``: RabbitMQ refuses (nacks) a publish that
  finds the queue full. A backstop: the service's own admission refuses first.
- No queue-wide TTL: each message expires at its request's deadline
  (``expiration``), so what nobody waits for any more is not delivered.

Admission stays the service's: ``admit.lua`` runs on the Redis that keeps its
books (:attr:`Settings.admission_url <dataservice.config.settings.Settings>`, the
result backend's), in its *elsewhere* mode: it checks the same bounds, the
deadline and the caller's pace, and records the request as held, but pushes
nothing. Then the message is published and confirmed. A publish RabbitMQ
refuses, or that does not go through, is taken back out of the books
(``withdraw.lua``), so they count only what the queue took. Every answer
gives its request's bytes back on the same Redis (``answer.lua``).
"""

from __future__ import annotations

import asyncio
import base64
import ssl
import threading
import time
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit
from weakref import WeakKeyDictionary

import aio_pika
import aio_pika.abc
import aiormq
import amqp
import amqp.exceptions
import kombu.exceptions
import redis
from kombu.connection import Connection
from kombu.entity import Exchange, Queue

from dataservice.broker.base import (
    CONNECT_TIMEOUT_S,
    Admit,
    AsyncPublisher,
    Broker,
    Peek,
    Request,
)
from dataservice.broker.message import request_message
from dataservice.broker.pipelined import AsyncBooks
from dataservice.config.model import Config, LaneConfig
from dataservice.config.settings import Settings
from dataservice.limits.admission import (
    ADMIT,
    DEADLINE_HEADER,
    SIZE_HEADER,
    AdmissionRefused,
    LaneAdmission,
    admit_call,
    admitted,
    caller_of,
    caller_pacing,
    envelope_size,
    lane_admission_bounds,
    withdraw,
    withdraw_async,
)
from dataservice.limits.pacing import Pacing
from dataservice.plans import Driver
from dataservice.refusals import Reason

# What a call on AMQP may raise besides a refusal: the broker gone, the
# channel closed, a socket timeout (an OSError), a connection kombu could
# not make (its OperationalError).
AMQP_ERRORS: tuple[type[BaseException], ...] = (
    amqp.exceptions.AMQPError,
    OSError,
    kombu.exceptions.OperationalError,
)
# The same, for the asyncio publisher.
ASYNC_AMQP_ERRORS: tuple[type[BaseException], ...] = (
    aiormq.exceptions.AMQPError,
    aio_pika.exceptions.AMQPException,
    OSError,
)

# What a publish RabbitMQ refused (the queue at its bound) suggests waiting:
# the service's own admission refuses before the queue is full, so this is a
# rare case of its books and the queue disagreeing (a Redis that restarted).
RETRY_QUEUE_FULL_MS = 200


def lane_queue_arguments(lane: LaneConfig) -> dict[str, Any]:
    """The arguments a lane's queue is declared with (immutable once declared:
    RabbitMQ refuses a declaration with others, ``PRECONDITION_FAILED``)."""
    return {
        "x-queue-type": "quorum",
        "x-max-length": lane.admission.max_messages,
        "x-max-length-bytes": lane.admission.max_bytes,
        "x-overflow": "reject-publish",
    }


def lane_queues(config: Config) -> list[Queue]:
    """The lanes' queues, each bound to a direct exchange of its own name."""
    return [
        Queue(
            lane.queue,
            Exchange(lane.queue, type="direct"),
            routing_key=lane.queue,
            durable=True,
            queue_arguments=lane_queue_arguments(lane),
        )
        for lane in (config.lanes.interactive, config.lanes.batch)
    ]


def broker_settings(settings: Settings, config: Config) -> dict[str, Any]:
    """The Celery settings of a RabbitMQ broker
    (:func:`dataservice.broker.celery.celery_settings`)."""
    return {
        "broker_url": settings.broker_url,
        "broker_transport": None,
        # amqps://: the server's certificate must verify against the system CAs.
        "broker_use_ssl": {"cert_reqs": ssl.CERT_REQUIRED}
        if settings.broker_url.startswith("amqps://")
        else False,
        "broker_connection_retry_on_startup": True,
        # Every publish waits for the broker's confirm: a quorum of the
        # queue's replicas holds it, or it was refused (reject-publish).
        "broker_transport_options": {"confirm_publish": True},
        "task_queues": lane_queues(config),
    }


class AmqpDepths:
    """How many messages wait in a queue (ready, not yet delivered), asked of
    RabbitMQ by a passive declaration: exact, where its management statistics
    lag by seconds. Thread-safe; connects on first use."""

    def __init__(self, url: str, timeout_s: float = 2.0) -> None:
        # One attempt to connect: a caller that waits on a broker that does
        # not answer (a scrape, a command) hears so within the timeout.
        self._connection = Connection(
            url, connect_timeout=timeout_s, transport_options={"max_retries": 0}
        )
        self._timeout_s = timeout_s
        self._lock = threading.Lock()

    def depth(self, queue: str) -> int:
        with self._lock:
            channel = self._connection.default_channel
            try:
                with _socket_bound(channel, self._timeout_s):
                    return int(channel.queue_declare(queue, passive=True).message_count)
            except amqp.exceptions.NotFound:
                # Not declared yet: nothing waits. The broker closed the channel.
                self._connection.release()
                self._connection = self._connection.clone()
                return 0

    def close(self) -> None:
        with self._lock:
            self._connection.release()


class AsyncAmqpPublisher:
    """Publishes request messages, confirmed, from any number of coroutines on
    one connection and one channel in confirm mode (aio-pika): confirms come
    back pipelined, so concurrent publishes do not wait for each other. Made
    and used inside one event loop; connects on first use, and again after
    the connection is lost."""

    def __init__(self, url: str, config: Config, connect_timeout_s: float) -> None:
        self._url = url
        self._lanes = {lane.queue: lane for lane in (config.lanes.interactive, config.lanes.batch)}
        self._connect_timeout_s = connect_timeout_s
        self._connection: aio_pika.abc.AbstractConnection | None = None
        self._exchanges: dict[str, aio_pika.abc.AbstractExchange] = {}
        self._lock: asyncio.Lock | None = None

    async def publish(self, queue: str, message: dict[str, Any]) -> None:
        """Publish ``message`` to ``queue`` and wait for its confirm. Raises
        :class:`amqp.exceptions.MessageNacked` when RabbitMQ refuses it, else the
        connection's errors (:data:`ASYNC_AMQP_ERRORS`); the caller bounds the wait."""
        exchange = await self._exchange(queue)
        body, properties = amqp_message(message, time.time_ns() // 1_000_000)
        expiration = properties.pop("expiration", None)
        outgoing = aio_pika.Message(
            body,
            **properties,
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            expiration=int(expiration) / 1000 if expiration else None,
        )
        try:
            await exchange.publish(outgoing, routing_key=queue)
        except aiormq.exceptions.DeliveryError:
            raise amqp.exceptions.MessageNacked() from None

    async def _exchange(self, queue: str) -> aio_pika.abc.AbstractExchange:
        exchange = self._exchanges.get(queue)
        if exchange is not None and self._connection is not None and not self._connection.is_closed:
            return exchange
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._connection is None or self._connection.is_closed:
                self._exchanges.clear()
                self._connection = await aio_pika.connect(
                    self._url, timeout=self._connect_timeout_s
                )
            if queue not in self._exchanges:
                channel = await self._connection.channel(publisher_confirms=True)
                self._exchanges[queue] = await _declare(channel, self._lanes[queue])
            return self._exchanges[queue]

    async def aclose(self) -> None:
        connection, self._connection = self._connection, None
        self._exchanges.clear()
        if connection is not None:
            await connection.close()


async def _declare(
    channel: aio_pika.abc.AbstractChannel, lane: LaneConfig
) -> aio_pika.abc.AbstractExchange:
    """The lane's exchange and queue, as :func:`lane_queues` declares them."""
    exchange = await channel.declare_exchange(
        lane.queue, aio_pika.ExchangeType.DIRECT, durable=True
    )
    queue = await channel.declare_queue(
        lane.queue, durable=True, arguments=lane_queue_arguments(lane)
    )
    await queue.bind(exchange, routing_key=lane.queue)
    return exchange


def unreachable(url: str, timeout_s: float) -> str:
    """Why RabbitMQ at ``url`` does not accept a connection (its AMQP
    handshake, not only TCP): the error's name, and RabbitMQ's own words
    when it refused (``NOT_ALLOWED - vhost ... not found``); '' when it does."""
    connection = Connection(url, connect_timeout=timeout_s)
    try:
        connection.connect()
    except (*AMQP_ERRORS, *connection.connection_errors) as exc:
        said = getattr(exc, "reply_text", "")
        return f"{type(exc).__name__}: {said}" if said else type(exc).__name__
    finally:
        connection.release()
    return ""


def where(url: str) -> str:
    """``RabbitMQ at host:port/vhost``: the URL without its credentials."""
    parsed = urlsplit(url)
    return f"RabbitMQ at {parsed.hostname or 'localhost'}:{parsed.port or 5672}{parsed.path or '/'}"


def delete_lane_queues(url: str, config: Config) -> None:
    """Delete the lanes' queues, and whatever waits in them (a load run's
    fresh start); the next worker or caller declares them again."""
    with Connection(url, connect_timeout=5) as connection:
        channel = connection.default_channel
        for lane in (config.lanes.interactive, config.lanes.batch):
            channel.queue_delete(lane.queue)


def expiration_ms(message: dict[str, Any], now_ms: int) -> int:
    """Milliseconds until the message's deadline (at least 1: 0 would mean
    'deliver now or never', which a consumer busy for a moment would miss)."""
    deadline = message.get("headers", {}).get(DEADLINE_HEADER)
    if not isinstance(deadline, int) or isinstance(deadline, bool):
        return 0
    return max(deadline - now_ms, 1)


def amqp_message(message: dict[str, Any], now_ms: int) -> tuple[bytes, dict[str, Any]]:
    """A message as kombu's Redis transport stores it, as AMQP has it: the
    body's bytes, and its properties (``expiration`` in ms, as a string, when
    it has a deadline)."""
    properties = message.get("properties", {})
    amqp_properties: dict[str, Any] = {
        "content_type": message.get("content-type"),
        "content_encoding": message.get("content-encoding"),
        "headers": message.get("headers"),
        "correlation_id": properties.get("correlation_id"),
        "reply_to": properties.get("reply_to"),
    }
    expiration = expiration_ms(message, now_ms)
    if expiration:
        amqp_properties["expiration"] = str(expiration)
    return base64.b64decode(message["body"]), amqp_properties


@dataclass(frozen=True, slots=True)
class _Do:
    """One call of a publisher's I/O (:class:`AmqpPublisher`,
    :class:`_AsyncPublisher`), by name: blocking or awaited."""

    what: str
    args: tuple[Any, ...]

    def run(self, io: Any) -> Any:
        return getattr(io, self.what)(*self.args)

    async def arun(self, io: Any) -> Any:
        return await getattr(io, self.what)(*self.args)


def _publish_plan(
    queue: str, lane: LaneAdmission, message: dict[str, Any], pacing: Pacing
) -> Generator[_Do, Any, str]:
    """Admit the message on admission's Redis (recorded as held, nothing
    pushed), then publish it, confirmed. A publish RabbitMQ refuses, or that
    does not go, is taken back out of the books. Returns '' (RabbitMQ keeps its
    backlog across restarts: there is no epoch to watch)."""
    message.setdefault("headers", {})[SIZE_HEADER] = envelope_size(message)
    keys, args = admit_call(queue, lane, "", message, pacing, elsewhere=True)
    yield _Do("admit_books", (keys, args, message))
    try:
        yield _Do("publish", (queue, message))
    except amqp.exceptions.MessageNacked:
        yield _Do("withdraw", (lane, message, Reason.QUEUE_FULL))
        raise AdmissionRefused(Reason.QUEUE_FULL, RETRY_QUEUE_FULL_MS) from None
    except Exception:
        # It may have reached the queue even so; the books then count it a
        # little short until its answer, never long. (A cancelled publish
        # leaves its record to lapse after its deadline.)
        yield _Do("withdraw", (lane, message, None))
        raise
    return ""


class AmqpPublisher:
    """Admits and publishes request messages on one AMQP channel in confirm
    mode; not thread-safe (one per pooled connection, as kombu's channels)."""

    def __init__(
        self,
        channel: Any,
        books: redis.Redis,
        admission: dict[str, LaneAdmission],
        pacing: Pacing,
        queues: list[Queue],
    ) -> None:
        self._channel = channel
        self._books = books
        self._admission = admission
        self._pacing = pacing
        self._queues = {queue.name: queue for queue in queues}
        self._declared: set[str] = set()
        self._timeout_s = 0.0

    def admit(self, queue: str, message: dict[str, Any], timeout_s: float) -> str:
        """Admit the message and publish it, confirmed (:func:`_publish_plan`).
        Raises :class:`AdmissionRefused`, ``redis.RedisError`` or kombu's and
        amqp's connection errors."""
        self._timeout_s = timeout_s
        plan = _publish_plan(queue, self._admission[queue], message, self._pacing)
        return Driver(plan).run(self)

    def admit_books(self, keys: list[str], args: list[Any], message: dict[str, Any]) -> str:
        return admitted(ADMIT(self._books, keys, args), self._pacing, caller_of(message))

    def withdraw(self, lane: LaneAdmission, message: dict[str, Any], reason: Reason | None) -> None:
        withdraw(self._books, lane, message, reason)

    def _declare(self, queue: str, timeout_s: float) -> None:
        if queue in self._declared:
            return
        with _socket_bound(self._channel, timeout_s):
            self._queues[queue](self._channel).declare()
        self._declared.add(queue)

    def publish(self, queue: str, message: dict[str, Any]) -> None:
        """Declare the lane's queue (once) and publish ``message``, confirmed."""
        timeout_s = self._timeout_s
        self._declare(queue, timeout_s)
        channel = self._channel
        body, properties = amqp_message(message, time.time_ns() // 1_000_000)
        prepared = channel.prepare_message(
            body,
            content_type=properties.pop("content_type"),
            content_encoding=properties.pop("content_encoding"),
            headers=properties.pop("headers"),
            properties={**properties, "delivery_mode": 2},
        )
        timeout = max(timeout_s, 0.001)
        channel.basic_publish(
            prepared, exchange=queue, routing_key=queue, timeout=timeout, confirm_timeout=timeout
        )


class _AsyncPublisher:
    """:class:`AmqpPublisher` for asyncio: admission's calls pipelined on its
    Redis (:class:`~.pipelined.AsyncBooks`), the message published with
    aio-pika (:class:`AsyncAmqpPublisher`)."""

    def __init__(self, settings: Settings, config: Config) -> None:
        self._books = AsyncBooks(settings.admission_url)
        self._amqp = AsyncAmqpPublisher(settings.broker_url, config, CONNECT_TIMEOUT_S)
        self._admission = lane_admission_bounds(config)
        self._pacing = Pacing(caller_pacing(config))

    async def admit(self, request: Request) -> str:
        message = request_message(request)
        plan = _publish_plan(request.queue, self._admission[request.queue], message, self._pacing)
        return await Driver(plan).arun(self)

    async def admit_books(self, keys: list[str], args: list[Any], message: dict[str, Any]) -> str:
        return await self._books.admit(keys, args, self._pacing, caller_of(message))

    async def publish(self, queue: str, message: dict[str, Any]) -> None:
        await self._amqp.publish(queue, message)

    async def withdraw(
        self, lane: LaneAdmission, message: dict[str, Any], reason: Reason | None
    ) -> None:
        await withdraw_async(self._books.client(), lane, message, reason)

    async def epoch(self) -> str | None:
        return None

    async def aclose(self) -> None:
        await self._books.aclose()
        await self._amqp.aclose()


class RabbitBroker(Broker):
    name = "RabbitMQ"
    has_epoch = False
    # A publish holds its connection until the broker confirms it, a quorum of
    # the queue having written it: about a millisecond, as long as the rest of
    # a call. A few let a client's threads publish side by side.
    publish_connections = 4
    errors = (*AMQP_ERRORS, redis.RedisError, kombu.exceptions.LimitExceeded)
    async_errors = (*ASYNC_AMQP_ERRORS, redis.RedisError, TimeoutError)

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self._publishers: WeakKeyDictionary[Any, AmqpPublisher] = WeakKeyDictionary()

    def where(self) -> str:
        return where(self.url)

    def unreachable(self, timeout_s: float) -> str:
        return unreachable(self.url, timeout_s)

    def celery_settings(self, config: Config) -> dict[str, Any]:
        return broker_settings(self.settings, config)

    def caller_settings(self, conf: Any) -> None:
        return None

    def admitter(self, connection: Any, books: redis.Redis, config: Config) -> Admit:
        channel = connection.default_channel
        publisher = self._publishers.get(channel)
        if publisher is None:
            publisher = AmqpPublisher(
                channel,
                books,
                lane_admission_bounds(config),
                Pacing(caller_pacing(config)),
                lane_queues(config),
            )
            self._publishers[channel] = publisher

        def admit(request: Request, timeout_s: float) -> str:
            return publisher.admit(request.queue, request_message(request), timeout_s)

        return admit

    def async_publisher(self, config: Config) -> AsyncPublisher:
        return _AsyncPublisher(self.settings, config)

    def depths(self, timeout_s: float = 2.0) -> AmqpDepths:
        return AmqpDepths(self.url, timeout_s)

    def peek(self, queue: str, limit: int) -> Peek:
        # RabbitMQ shows a message only by delivering it: even handed back, it
        # would come to a worker marked redelivered, its delivery count raised,
        # and no worker could take it meanwhile. So it is counted, not read.
        depths = self.depths()
        try:
            return Peek(depths.depth(queue), None)
        finally:
            depths.close()


@contextmanager
def _socket_bound(channel: Any, timeout_s: float) -> Iterator[None]:
    """The channel's socket waits at most ``timeout_s`` (a declaration has no
    timeout argument of its own)."""
    with channel.connection.transport.having_timeout(max(timeout_s, 0.001)):
        yield
