"""Admission for asyncio publishers: calls of the admission script from many
coroutines, sent by one task in pipelines, on admission's Redis (the
broker's, or on RabbitMQ the result backend's)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import redis
from redis.asyncio import BlockingConnectionPool as AsyncBlockingPool
from redis.asyncio import Redis as AsyncRedis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff

from dataservice.broker.base import CONNECT_TIMEOUT_S
from dataservice.limits.admission import ADMIT, admitted
from dataservice.limits.pacing import Pacing
from dataservice.redis import endpoints
from dataservice.redis.bounded import QUIET
from dataservice.redis.packing import async_packed_connection_class
from dataservice.redis.scripts import run_pipelined_async
from dataservice.redis.tasks import stop_task

# Admission's connections: its publishing task's, and one for everything else
# (the broker's epoch, a withdrawal).
ASYNC_PUBLISH_CONNECTIONS = 2
# Admission calls sent in one pipeline, at most.
PIPELINE = 128


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


class AsyncBooks:
    """Admission's Redis for one event loop: its client (made on first use,
    inside the loop it then belongs to) and the queue of admission calls."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._client: AsyncRedis | None = None
        self.calls = AdmitQueue(self.client)

    def client(self) -> AsyncRedis:
        if self._client is None:
            pool = endpoints.async_pool(
                self._url,
                AsyncBlockingPool,
                async_packed_connection_class(self._url),
                max_connections=ASYNC_PUBLISH_CONNECTIONS,
                # Waits for a connection end with the publish's own bound.
                timeout=None,
                socket_timeout=CONNECT_TIMEOUT_S + 3,
                socket_connect_timeout=CONNECT_TIMEOUT_S,
                **QUIET,
            )
            self._client = AsyncRedis(connection_pool=pool, retry=AsyncRetry(NoBackoff(), 0))
        return self._client

    async def admit(
        self,
        keys: list[str],
        args: list[Any],
        pacing: Pacing | None = None,
        message: dict[str, Any] | None = None,
    ) -> str:
        """The epoch admission answered with, or its refusal raised (a lease
        it took for ``message``'s caller goes to ``pacing``)."""
        return admitted(await self.calls.call(keys, args), pacing, message)

    async def aclose(self) -> None:
        await self.calls.aclose()
        if self._client is not None:
            await self._client.aclose()
            await self._client.connection_pool.disconnect()
