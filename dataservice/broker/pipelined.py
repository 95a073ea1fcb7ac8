"""Admission for asyncio publishers: calls of the admission script from many
coroutines, sent by one task in pipelines, on admission's Redis (the
broker's, or on RabbitMQ the result backend's)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis
from redis.asyncio import BlockingConnectionPool as AsyncBlockingPool
from redis.asyncio import Redis as AsyncRedis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff

from dataservice.broker import library
from dataservice.broker.base import CONNECT_TIMEOUT_S
from dataservice.config.model import Config
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
    event loop.

    A call is the admission script's (:data:`ADMIT`: keys and arguments) or
    the publish interface's (``FCALL``'s arguments, :mod:`.library`). A
    server that lacks the script is given it and the script's calls run
    again; one that lacks the library or its configuration has them
    installed from ``config`` (when the user may) and those calls run again."""

    def __init__(self, connect: Callable[[], AsyncRedis], config: Config | None = None) -> None:
        self._connect = connect
        self._config = config
        self._pending: list[tuple[_Call, asyncio.Future[Any]]] = []
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        #: Round trips made so far (each one command or one pipeline).
        self.round_trips = 0

    async def call(self, keys: list[str], args: list[Any]) -> Any:
        """:data:`ADMIT`'s answer to ``keys`` and ``args`` (or its error)."""
        return await self._queued(_Call(keys, args))

    async def publish(self, args: list[Any]) -> Any:
        """The publish interface's answer (``FCALL`` with ``args``), or its error."""
        return await self._queued(_Call(None, args))

    async def _queued(self, call: _Call) -> Any:
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[Any] = loop.create_future()
        self._pending.append((call, answer))
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
                live = [one for one in batch if not one[1].done()]
                if not live:
                    continue
                self.round_trips += 1
                try:
                    results = await self._run(client, [call for call, _ in live])
                except (redis.RedisError, OSError) as exc:
                    results = [exc] * len(live)
                for (_, answer), result in zip(live, results, strict=True):
                    if answer.done():
                        continue
                    if isinstance(result, BaseException):
                        answer.set_exception(result)
                    else:
                        answer.set_result(result)

    async def _run(self, client: AsyncRedis, calls: list[_Call]) -> list[Any]:
        if len(calls) == 1 and calls[0].keys is not None:
            # Alone: the command itself, without a pipeline's making.
            return [await ADMIT.run_async(client, calls[0].keys, calls[0].args)]
        scripts = [(i, call) for i, call in enumerate(calls) if call.keys is not None]
        results: list[Any] = [None] * len(calls)
        if scripts:
            ran = await run_pipelined_async(
                client, [(ADMIT, c.keys or [], c.args) for _, c in scripts]
            )
            for (i, _), result in zip(scripts, ran, strict=True):
                results[i] = result
        publishes = [(i, call) for i, call in enumerate(calls) if call.keys is None]
        if publishes:
            ran = await self._publish(client, [call.args for _, call in publishes])
            for (i, _), result in zip(publishes, ran, strict=True):
                results[i] = result
        return results

    async def _publish(self, client: AsyncRedis, calls: list[list[Any]]) -> list[Any]:
        results = await _fcalls(client, calls)
        missing = [i for i, result in enumerate(results) if library.not_installed(result)]
        if missing:
            if self._config is None:
                raise library.unconfigured()
            try:
                await library.install_async(client, self._config)
            except redis.ResponseError:
                unconfigured = library.unconfigured()
                return [unconfigured if i in missing else r for i, r in enumerate(results)]
            again = await _fcalls(client, [calls[i] for i in missing])
            for i, result in zip(missing, again, strict=True):
                results[i] = result
        return results

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await stop_task(task, CONNECT_TIMEOUT_S + 4, "publisher")
        for _, answer in self._pending:
            answer.cancel()
        self._pending.clear()


@dataclass(frozen=True, slots=True)
class _Call:
    # The admission script's keys; None: a call of the publish interface.
    keys: list[str] | None
    args: list[Any]


async def _fcalls(client: AsyncRedis, calls: list[list[Any]]) -> list[Any]:
    """Each ``FCALL`` in one round trip (alone: without a pipeline); each
    result or error."""
    if len(calls) == 1:
        try:
            return [await client.execute_command("FCALL", *calls[0])]  # type: ignore[no-untyped-call]
        except redis.ResponseError as exc:
            return [exc]
    async with client.pipeline(transaction=False) as pipe:
        for args in calls:
            pipe.execute_command("FCALL", *args)
        return list(await pipe.execute(raise_on_error=False))


class AsyncBooks:
    """Admission's Redis for one event loop: its client (made on first use,
    inside the loop it then belongs to) and the queue of admission calls."""

    def __init__(self, url: str, config: Config | None = None) -> None:
        self._url = url
        self._client: AsyncRedis | None = None
        self.calls = AdmitQueue(self.client, config)

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
        self, keys: list[str], args: list[Any], pacing: Pacing | None = None, caller: object = None
    ) -> str:
        """The epoch admission answered with, or its refusal raised (a lease
        it took for ``caller`` goes to ``pacing``)."""
        return admitted(await self.calls.call(keys, args), pacing, caller)

    async def publish(self, args: list[Any], pacing: Pacing, caller: str) -> str:
        """As :meth:`admit`, through the publish interface (``FCALL``'s arguments)."""
        return admitted(await self.calls.publish(args), pacing, caller)

    async def aclose(self) -> None:
        await self.calls.aclose()
        if self._client is not None:
            await self._client.aclose()
            await self._client.connection_pool.disconnect()
