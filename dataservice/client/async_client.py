"""The caller's API for asyncio services: :class:`Client`'s calls, awaited.

The same signing, deadlines, retries, throttle, idempotency and errors as
:class:`~dataservice.Client` (:mod:`.base` and :mod:`.publisher` hold them,
for both); only the waiting differs. A process's calls share one reply
channel read by one task, and at most two publishing connections, however
many are in flight: a few thousand awaiting coroutines cost a few thousand
events, not connections or threads.

An ``AsyncClient`` belongs to the event loop that first uses it. Close it
with ``await client.aclose()`` or ``async with``.
"""

from __future__ import annotations

import asyncio
import builtins
import functools
from collections.abc import Iterable, Mapping, Sequence

from dataservice.client.async_transport import AsyncTransport
from dataservice.client.base import BaseClient, expect, signing_key
from dataservice.client.handle import AsyncHandle, gather_async
from dataservice.client.publisher import Outgoing, Publisher, mutation_key
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.enums import LaneName, ReadMode
from dataservice.errors import DataServiceError, RequestError, ResourceExhausted, RetryableError
from dataservice.limits.admission import AdmissionRefused
from dataservice.security.callers import CallerKey
from dataservice.types import (
    DeleteOp,
    DeleteResult,
    ListOp,
    Operation,
    Page,
    ReadMany,
    ReadOp,
    Record,
    Result,
    WriteOp,
    WriteResult,
)


class AsyncClient(BaseClient):
    """A caller of the data service, for asyncio.

    As :class:`~dataservice.Client`: ``read``, ``read_many``, ``write``,
    ``delete`` and ``list`` run on the interactive lane and are awaited;
    ``submit`` and ``submit_many`` enqueue on the batch lane and return
    :class:`AsyncHandle` objects whose ``result`` is awaited. Cancelling a
    call stops its wait and nothing else.
    """

    def __init__(
        self, caller: str, settings: Settings, config: Config, *, key: CallerKey | None = None
    ) -> None:
        """``key`` signs the requests; by default, the caller's first key in the
        callers file (``DATASERVICE_CALLERS_FILE``). Connects nothing until
        the first call."""
        key = signing_key(caller, settings, key)
        self.caller = caller
        self.config = config
        self._transport = AsyncTransport(settings, config, caller=caller)
        self._publisher = Publisher(caller, key, config, self._transport.replies.channel)
        self._make = functools.partial(AsyncHandle, self._transport, caller)

    @classmethod
    def from_env(cls, caller: str, environ: Mapping[str, str] | None = None) -> AsyncClient:
        """A client configured from ``DATASERVICE_*`` variables and ``queues.yml``."""
        settings = Settings.from_env(environ)
        return cls(caller, settings, settings.load())

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._transport.aclose()

    # Interactive lane -------------------------------------------------------

    async def read(
        self,
        scope: str,
        object_id: str,
        *,
        mode: ReadMode = ReadMode.ALLOW_CACHED,
        timeout: float | None = None,
    ) -> Record:
        return expect(await self._call(ReadOp(scope, object_id, mode), timeout), Record)

    async def read_many(
        self,
        scope: str,
        ids: Iterable[str | tuple[str, str]],
        *,
        mode: ReadMode = ReadMode.ALLOW_CACHED,
        timeout: float | None = None,
    ) -> builtins.list[Record | RequestError]:
        """As :meth:`Client.read_many <dataservice.Client.read_many>`."""
        plan = self._read_many_plan(scope, ids, mode)
        deadline = self._publisher.deadline(LaneName.INTERACTIVE, timeout)
        while True:
            for chunk, operation in plan.messages():
                plan.took(chunk, expect(await self._call(operation, None, deadline), ReadMany))
            wait_s = plan.next_round(deadline)
            if wait_s is None:
                return plan.results()
            await asyncio.sleep(wait_s)

    async def write(
        self,
        scope: str,
        object_id: str,
        payload: bytes,
        *,
        idempotency_key: str | None = None,
        expected_revision: int = 0,
        timeout: float | None = None,
    ) -> WriteResult:
        operation = WriteOp(scope, object_id, payload, idempotency_key, expected_revision)
        return expect(await self._call(operation, timeout), WriteResult)

    async def delete(
        self,
        scope: str,
        object_id: str,
        *,
        idempotency_key: str | None = None,
        expected_revision: int = 0,
        timeout: float | None = None,
    ) -> DeleteResult:
        operation = DeleteOp(scope, object_id, idempotency_key, expected_revision)
        return expect(await self._call(operation, timeout), DeleteResult)

    async def list(
        self,
        scope: str,
        *,
        page_size: int = 0,
        cursor: str | None = None,
        timeout: float | None = None,
    ) -> Page:
        return expect(await self._call(ListOp(scope, page_size, cursor), timeout), Page)

    # Batch lane -------------------------------------------------------------

    async def submit(self, operation: Operation, *, timeout: float | None = None) -> AsyncHandle:
        return (await self.submit_many([operation], timeout=timeout))[0]

    async def submit_many(
        self, operations: Iterable[Operation], *, timeout: float | None = None
    ) -> builtins.list[AsyncHandle]:
        """As :meth:`Client.submit_many <dataservice.Client.submit_many>`."""
        deadline = self._publisher.deadline(LaneName.BATCH, timeout)
        return await self._send(self._publisher.many(builtins.list(operations), deadline))

    async def results(
        self, handles: Sequence[AsyncHandle]
    ) -> builtins.list[Result | DataServiceError]:
        """Every handle's answer, or the error it raises, in their order."""
        return await gather_async(handles)

    # Internals --------------------------------------------------------------

    async def _call(
        self, operation: Operation, timeout: float | None, deadline: int | None = None
    ) -> Result:
        if deadline is None:
            deadline = self._publisher.deadline(LaneName.INTERACTIVE, timeout)
        key = mutation_key(operation)
        attempt = 1
        while True:
            try:
                return await self._attempt(operation, deadline, key)
            except RetryableError as exc:
                delay_ms = self._retry_in_ms(exc, attempt, deadline)
                if delay_ms is None:
                    raise
                await asyncio.sleep(delay_ms / 1000)
                attempt += 1

    async def _attempt(self, operation: Operation, deadline: int, key: str) -> Result:
        try:
            (handle,) = await self._send(self._publisher.one(operation, deadline, key))
        except ResourceExhausted as exc:
            self._publisher.held_back(exc)
            raise
        try:
            return await handle.result()
        except ResourceExhausted as exc:
            self._publisher.held_back(exc)
            raise
        finally:
            # Nobody else waits for this attempt's answer: once its call has
            # it, gave up or was cancelled, a late one is dropped on arrival.
            self._transport.replies.forget(handle.request_id)

    async def _send(self, out: Outgoing) -> builtins.list[AsyncHandle]:
        try:
            epoch = await self._transport.publish_many(out.items, lane=out.lane, caller=self.caller)
        except AdmissionRefused as refusal:
            made = self._publisher.handles(out, refusal.epoch, self._make, refusal.sent)
            raise self._publisher.refused(out, refusal, made) from None
        self._publisher.accepted(out)
        return self._publisher.handles(out, epoch, self._make)
