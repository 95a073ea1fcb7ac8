"""The asyncio client's side of the wire: the same messages through the same
admission script as :mod:`.transport`, on asyncio connections, published by
one task per client (:class:`AdmitQueue`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from typing import Any

import redis
from amqp.exceptions import MessageNacked
from kombu.common import oid_from
from kombu.utils.json import dumps
from redis.asyncio import BlockingConnectionPool as AsyncBlockingPool
from redis.asyncio import Redis as AsyncRedis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff

from dataservice.broker.glue import CONNECT_TIMEOUT_S
from dataservice.broker.rabbitmq import (
    ASYNC_AMQP_ERRORS,
    RETRY_QUEUE_FULL_MS,
    AsyncAmqpPublisher,
)
from dataservice.client.inbox import AsyncInbox, stop_task
from dataservice.client.message import task_message
from dataservice.client.transport import Epochs, broker_failure, item_headers
from dataservice.config.model import Config
from dataservice.config.settings import AMQP_SCHEMES, Settings
from dataservice.enums import LaneName
from dataservice.errors import InvalidArgument
from dataservice.limits.admission import (
    ADMIT,
    SIZE_HEADER,
    AdmissionRefused,
    LaneAdmission,
    admit_call,
    admitted,
    caller_pacing,
    envelope_size,
    lane_admission_bounds,
    withdraw_async,
)
from dataservice.redis.bounded import QUIET, SLACK_S
from dataservice.redis.keys import EPOCH_KEY
from dataservice.redis.packing import async_packed_connection_class
from dataservice.redis.scripts import run_pipelined_async
from dataservice.refusals import Reason

# The client's broker connections: its publishing task's, and one for the
# broker's epoch.
ASYNC_PUBLISH_CONNECTIONS = 2
# Admission calls sent in one pipeline, at most.
PIPELINE = 128
# A publish that failed for want of a broker (or of the Redis admission runs on).
_PUBLISH_ERRORS: tuple[type[BaseException], ...] = (
    redis.RedisError,
    OSError,
    TimeoutError,
    asyncio.CancelledError,
    *ASYNC_AMQP_ERRORS,
)


class AdmitQueue:
    """Admission calls from many coroutines, sent by one task in pipelines.

    A caller hands in its call and awaits the answer; the task sends whatever
    gathered during its last round trip in one pipeline (at most
    :data:`PIPELINE`), so a hundred concurrent publishes cost a few round
    trips, not a hundred. Only the task touches its connection: a caller that
    is cancelled or times out stops waiting, and its call, if not sent yet,
    is never sent; if sent, its answer finds nobody. Made and used inside one
    event loop."""

    def __init__(self, connect: Callable[[], AsyncRedis]) -> None:
        self._connect = connect
        self._pending: list[tuple[list[str], list[Any], asyncio.Future[Any]]] = []
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        #: Round trips made so far (each one command or one pipeline).
        self.round_trips = 0

    async def call(self, keys: list[str], args: list[Any]) -> Any:
        """:data:`ADMIT`'s answer to ``keys`` and ``args`` (or its error)."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[Any] = loop.create_future()
        self._pending.append((keys, args, answer))
        if self._wake is None:
            self._wake = asyncio.Event()
        if self._task is None:
            self._task = loop.create_task(self._send(self._wake), name="admit-queue")
        self._wake.set()
        return await answer

    async def _send(self, wake: asyncio.Event) -> None:
        client = self._connect()
        while True:
            await wake.wait()
            wake.clear()
            while self._pending:
                batch = self._pending[:PIPELINE]
                del self._pending[:PIPELINE]
                # A caller that gave up before its call went: it never goes.
                live = [one for one in batch if not one[2].done()]
                if not live:
                    continue
                self.round_trips += 1
                try:
                    if len(live) == 1:
                        # Alone: the command itself, without a pipeline's making.
                        results = [await ADMIT.run_async(client, live[0][0], live[0][1])]
                    else:
                        calls = [(ADMIT, keys, args) for keys, args, _ in live]
                        results = await run_pipelined_async(client, calls)
                except (redis.RedisError, OSError) as exc:
                    results = [exc] * len(live)
                for (_, _, answer), result in zip(live, results, strict=True):
                    if answer.done():
                        continue
                    if isinstance(result, BaseException):
                        answer.set_exception(result)
                    else:
                        answer.set_result(result)

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await stop_task(task, CONNECT_TIMEOUT_S + 4, "publisher")
        for _, _, answer in self._pending:
            answer.cancel()
        self._pending.clear()


class AsyncTransport:
    """The wire of :class:`~dataservice.AsyncClient`: the same messages through
    the same admission script, on asyncio connections.

    kombu has no asyncio producer, so the client does what the sync
    transport's broker channel does for a lane's message, and nothing more:
    it builds the message kombu's Redis transport would store
    (:func:`~.message.task_message`, kept equal to Celery's by a test), adds
    its size header and runs ``admit.lua`` with the arguments the channel
    gives it (:func:`~dataservice.limits.admission.admit_call`). The script's
    push is atomic, so a publish cancelled midway either queued the message
    or did not; its slot on the reply channel goes either way. A test keeps
    what both transports queue identical.

    One task publishes (:class:`AdmitQueue`), on one connection, however many
    coroutines do; the broker's epoch is read on a second, and the reply
    channel's reader holds a third.

    On RabbitMQ the script runs on the result backend's Redis and pushes
    nothing; the admitted message is then published with aio-pika and its
    confirm awaited (:class:`~dataservice.broker.rabbitmq.AsyncAmqpPublisher`).
    """

    def __init__(self, settings: Settings, config: Config, *, caller: str) -> None:
        if not settings.broker_url.startswith(("redis://", "rediss://", *AMQP_SCHEMES)):
            raise InvalidArgument("AsyncClient needs a redis://, rediss:// or amqp:// broker URL")
        self.config = config
        self.inbox = AsyncInbox(settings.result_backend_url, caller)
        # The Redis admission runs on: the broker's, or on RabbitMQ the result
        # backend's, and then the message is published to RabbitMQ, confirmed.
        self._broker_url = settings.admission_url
        self._amqp = (
            AsyncAmqpPublisher(settings.broker_url, config, CONNECT_TIMEOUT_S)
            if settings.broker_is_amqp
            else None
        )
        self._broker: AsyncRedis | None = None
        self._admission = lane_admission_bounds(config)
        self._pacing = caller_pacing(config)
        self._grace_s = config.results.grace_ms / 1000
        self._reply_to = oid_from(self, threads=False)
        self._admit = AdmitQueue(self._client)
        self.epochs = Epochs()

    @property
    def replies(self) -> AsyncInbox:
        return self.inbox

    def _client(self) -> AsyncRedis:
        # Made on first use, inside the event loop it then belongs to.
        if self._broker is None:
            pool = AsyncBlockingPool.from_url(
                self._broker_url,
                max_connections=ASYNC_PUBLISH_CONNECTIONS,
                connection_class=async_packed_connection_class(self._broker_url),
                # Waits for a connection end with the publish's own bound.
                timeout=None,
                socket_timeout=CONNECT_TIMEOUT_S + 3,
                socket_connect_timeout=CONNECT_TIMEOUT_S,
                **QUIET,
            )
            self._broker = AsyncRedis(connection_pool=pool, retry=AsyncRetry(NoBackoff(), 0))
        return self._broker

    async def publish_many(
        self,
        items: Iterable[tuple[bytes, str, int, str, int]],
        *,
        lane: LaneName,
        caller: str = "",
    ) -> str:
        """As :meth:`.transport.Transport.publish_many`."""
        sent = 0
        epoch = ""
        refusal = None
        queue = self.config.lanes[lane].queue
        admission = self._admission[queue]
        items = list(items)
        deadline_ms = min((item[2] for item in items), default=0)
        left_s = (deadline_ms - time.time() * 1000) / 1000
        try:
            async with asyncio.timeout(max(left_s, 0.0) + SLACK_S):
                for body, request_id, item_deadline_ms, operation, ops in items:
                    headers = item_headers(caller, item_deadline_ms, operation, ops)
                    message = task_message(body, request_id, queue, headers, self._reply_to)
                    message["headers"][SIZE_HEADER] = envelope_size(message)
                    elsewhere = self._amqp is not None
                    encoded = "" if elsewhere else dumps(message)
                    keys, args = admit_call(
                        queue, admission, encoded, message, self._pacing, elsewhere=elsewhere
                    )
                    lapses_in_s = (item_deadline_ms - time.time() * 1000) / 1000
                    self.inbox.expect(request_id, lapses_in_s + self._grace_s)
                    try:
                        epoch = admitted(await self._admit.call(keys, args))
                        if self._amqp is not None:
                            await self._published(queue, admission, message)
                    except AdmissionRefused as refused_here:
                        refusal = refused_here
                        break
                    sent += 1
        except _PUBLISH_ERRORS as exc:
            for item in items:
                self.inbox.forget(item[1])
            if isinstance(exc, asyncio.CancelledError):
                raise
            raise broker_failure(deadline_ms) from None
        if refusal is not None:
            for item in items[sent:]:
                self.inbox.forget(item[1])
            refusal.sent, refusal.epoch = sent, epoch
            raise refusal
        return epoch

    async def _published(
        self, queue: str, admission: LaneAdmission, message: dict[str, Any]
    ) -> None:
        """Publish an admitted message to RabbitMQ, confirmed; one it refuses,
        or that does not go, leaves admission's books (``withdraw.lua``)."""
        assert self._amqp is not None
        try:
            await self._amqp.publish(queue, message)
        except MessageNacked:
            await withdraw_async(self._client(), admission, message, Reason.QUEUE_FULL)
            raise AdmissionRefused(Reason.QUEUE_FULL, RETRY_QUEUE_FULL_MS) from None
        except ASYNC_AMQP_ERRORS:
            # It may have reached the queue even so; the books then count it
            # a little short until its answer.
            await withdraw_async(self._client(), admission, message, None)
            raise

    def ended_for(self, epoch: str) -> float | None:
        return self.epochs.ended_for(epoch)

    async def look_at_epoch(self, epoch: str, deadline_ms: int) -> None:
        """As :meth:`.transport.Transport.look_at_epoch`."""
        left_s = self.epochs.may_ask(epoch, deadline_ms)
        if not left_s or self._amqp is not None:
            return
        try:
            async with asyncio.timeout(left_s):
                value = await self._client().get(EPOCH_KEY)
        except (redis.RedisError, OSError, TimeoutError):
            return
        self.epochs.saw(epoch, value.decode() if isinstance(value, bytes) else "")

    async def aclose(self) -> None:
        await self._admit.aclose()
        if self._amqp is not None:
            await self._amqp.aclose()
        await self.inbox.aclose()
        if self._broker is not None:
            await self._broker.aclose()
            await self._broker.connection_pool.disconnect()
