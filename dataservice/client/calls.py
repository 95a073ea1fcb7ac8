"""The client's calls, written once for both clients.

Each public call is a *plan*: a generator that does no I/O. It yields the
steps it needs done (publish these messages, wait for this answer, pause
this long) and is sent back what each step gave, or has its error thrown
into it. Everything else (signing, deadlines, retries, the throttle,
``read_many``'s rounds, what a refusal means) happens in the plan itself.

A :class:`Client` runs a plan's steps by blocking; an
:class:`~dataservice.AsyncClient` awaits them. That is the only difference
between the two: the methods below, decorated with :class:`call`, are the
public API of both, typed for each (a ``Client``'s ``read`` returns a
``Record``; an ``AsyncClient``'s returns a coroutine of one).

A cancelled await is thrown into the plan like any error: its ``finally``
blocks run (an attempt's answer is let go), and the cancellation goes on.
"""

from __future__ import annotations

import asyncio
import builtins
import inspect
import time
from collections.abc import Callable, Coroutine, Generator, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Concatenate, Generic, ParamSpec, Self, TypeVar, overload

from dataservice.client.base import BaseClient, expect, signing_key
from dataservice.client.handle import HandleBase
from dataservice.client.publisher import Outgoing, Publisher, mutation_key
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.enums import LaneName, ReadMode
from dataservice.errors import RequestError, ResourceExhausted, RetryableError
from dataservice.limits.admission import AdmissionRefused
from dataservice.plans import Driver
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

P = ParamSpec("P")
R = TypeVar("R")
# A client's handle type: Handle, or AsyncHandle.
H = TypeVar("H", bound=HandleBase[Any])


# The steps ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Publish:
    """Publish ``out``'s messages; gives the broker's epoch they went out in,
    or raises :class:`AdmissionRefused` (or the transport's errors)."""

    out: Outgoing
    caller: str

    def run(self, transport: Any) -> str:
        return transport.publish_many(  # type: ignore[no-any-return]
            self.out.items, lane=self.out.lane, caller=self.caller
        )

    async def arun(self, transport: Any) -> str:
        return await transport.publish_many(  # type: ignore[no-any-return]
            self.out.items, lane=self.out.lane, caller=self.caller
        )


@dataclass(frozen=True, slots=True)
class Answer:
    """Wait for a handle's answer; gives its result, or raises its error."""

    handle: Any

    def run(self, _: Any) -> Result:
        return self.handle.result()  # type: ignore[no-any-return]

    async def arun(self, _: Any) -> Result:
        return await self.handle.result()  # type: ignore[no-any-return]


@dataclass(frozen=True, slots=True)
class Pause:
    """Wait ``seconds``; gives nothing."""

    seconds: float

    def run(self, _: Any) -> None:
        time.sleep(self.seconds)

    async def arun(self, _: Any) -> None:
        await asyncio.sleep(self.seconds)


Step = Publish | Answer | Pause
Plan = Generator[Step, Any, R]


# The public calls -------------------------------------------------------------


class call(Generic[P, R]):  # a decorator, named as one
    """A public call written once as a plan: on a :class:`Blocking` client it
    returns the plan's result; on an :class:`Awaited` one, a coroutine of it."""

    def __init__(self, plan: Callable[Concatenate[Any, P], Plan[R]]) -> None:
        self._plan = plan
        self.__doc__ = plan.__doc__
        self.__name__ = plan.__name__
        self.__qualname__ = plan.__qualname__
        # What help() and inspect show: the call's own parameters, not the
        # plan's (its self, its generator type).
        signature = inspect.signature(plan)
        self.__signature__ = signature.replace(
            parameters=builtins.list(signature.parameters.values())[1:]
        )

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> Self: ...

    @overload
    def __get__(self, obj: Blocking[Any], owner: type | None = None) -> Callable[P, R]: ...

    @overload
    def __get__(
        self, obj: Awaited[Any], owner: type | None = None
    ) -> Callable[P, Coroutine[Any, Any, R]]: ...

    def __get__(self, obj: Calls[Any] | None, owner: type | None = None) -> Any:
        if obj is None:
            return self
        bound = obj._bind(self._plan)
        bound.__doc__, bound.__signature__ = self.__doc__, self.__signature__  # type: ignore[attr-defined]
        # Made once per client: later lookups find it on the instance.
        obj.__dict__[self.__name__] = bound
        return bound


class Calls(BaseClient, Generic[H]):
    """A caller of the data service: its calls as plans (see the module)."""

    def __init__(
        self,
        caller: str,
        settings: Settings,
        config: Config,
        key: CallerKey | None,
        transport: Callable[..., Any],
        handle: Callable[..., H],
    ) -> None:
        # With cells, the caller's own cell's URLs (dataservice.config.cells).
        settings = settings.for_caller(caller, config)
        key = signing_key(caller, settings, key)
        self.caller = caller
        self.config = config
        self._transport = transport(settings, config, caller=caller)
        self._publisher = Publisher(caller, key, config, self._transport.replies.channel)
        self._handle = handle

    @classmethod
    def from_env(cls, caller: str, environ: Mapping[str, str] | None = None) -> Self:
        """A client configured from ``DATASERVICE_*`` variables and ``queues.yml``."""
        settings = Settings.from_env(environ)
        return cls(caller, settings, settings.load())  # type: ignore[call-arg]

    @property
    def reply_channel(self) -> str:
        """The reply channel every answer to this client comes on
        (``ds:reply:<caller>:<channel>``, docs/protocol.md, "Reply channels")."""
        return str(self._transport.replies.channel)

    def _bind(self, plan: Callable[..., Plan[Any]]) -> Callable[..., Any]:
        raise NotImplementedError

    # Interactive lane -------------------------------------------------------

    @call
    def read(
        self,
        scope: str,
        object_id: str,
        *,
        mode: ReadMode = ReadMode.ALLOW_CACHED,
        timeout: float | None = None,
    ) -> Plan[Record]:
        """The record ``object_id`` in ``scope``. ``timeout`` (seconds) becomes
        the request's deadline, capped at the lane's maximum."""
        return expect((yield from self._call(ReadOp(scope, object_id, mode), timeout)), Record)

    @call
    def read_many(
        self,
        scope: str,
        ids: Iterable[str | tuple[str, str]],
        *,
        mode: ReadMode = ReadMode.ALLOW_CACHED,
        timeout: float | None = None,
    ) -> Plan[builtins.list[Record | RequestError]]:
        """Each id's record, or the error reading it alone would have raised
        (``NotFound``, ``PermissionDenied``, ...), in the order given.

        An id is an object id in ``scope``, or a ``(scope, object_id)`` pair.
        Up to ``lanes.interactive.max_ops_per_message`` reads go in one message
        (the cache answers its hits in one round trip, the database its misses
        a ``SELECT`` per permit); more are sent in further messages, one after
        another. A record the answer had no room for (``response_full``) is
        asked for again; a read answered retryably is retried as :meth:`read`
        retries, all within the one deadline. Errors of the whole call (a
        refused publish, the deadline) are raised as :meth:`read` raises them.
        """
        plan = self._read_many_plan(scope, ids, mode)
        deadline = self._publisher.deadline(LaneName.INTERACTIVE, timeout)
        while True:
            for chunk, operation in plan.messages():
                answer = yield from self._call(operation, None, deadline)
                plan.took(chunk, expect(answer, ReadMany))
            wait_s = plan.next_round(deadline)
            if wait_s is None:
                return plan.results()
            yield Pause(wait_s)

    @call
    def write(
        self,
        scope: str,
        object_id: str,
        payload: bytes,
        *,
        idempotency_key: str | None = None,
        expected_revision: int = 0,
        timeout: float | None = None,
    ) -> Plan[WriteResult]:
        """Write ``payload`` as the record's new revision (only over
        ``expected_revision`` when it is not 0). Sent again under the same
        ``idempotency_key``, it is applied once."""
        operation = WriteOp(scope, object_id, payload, idempotency_key, expected_revision)
        return expect((yield from self._call(operation, timeout)), WriteResult)

    @call
    def delete(
        self,
        scope: str,
        object_id: str,
        *,
        idempotency_key: str | None = None,
        expected_revision: int = 0,
        timeout: float | None = None,
    ) -> Plan[DeleteResult]:
        """Delete the record (only at ``expected_revision`` when it is not 0)."""
        operation = DeleteOp(scope, object_id, idempotency_key, expected_revision)
        return expect((yield from self._call(operation, timeout)), DeleteResult)

    @call
    def list(
        self,
        scope: str,
        *,
        page_size: int = 0,
        cursor: str | None = None,
        timeout: float | None = None,
    ) -> Plan[Page]:
        """One page of ``scope``'s records, from ``cursor``."""
        return expect((yield from self._call(ListOp(scope, page_size, cursor), timeout)), Page)

    # Batch lane -------------------------------------------------------------

    @call
    def submit(self, operation: Operation, *, timeout: float | None = None) -> Plan[H]:
        """Enqueue one operation on the batch lane; its handle."""
        return (yield from self._submit([operation], timeout))[0]

    @call
    def submit_many(
        self, operations: Iterable[Operation], *, timeout: float | None = None
    ) -> Plan[builtins.list[H]]:
        """Enqueue every operation on the batch lane in one broker session.

        All are validated before any is sent: one bad operation enqueues none.
        """
        return (yield from self._submit(operations, timeout))

    # Internals --------------------------------------------------------------

    def _submit(
        self, operations: Iterable[Operation], timeout: float | None
    ) -> Plan[builtins.list[H]]:
        deadline = self._publisher.deadline(LaneName.BATCH, timeout)
        return (yield from self._send(self._publisher.many(builtins.list(operations), deadline)))

    def _call(
        self, operation: Operation, timeout: float | None, deadline: int | None = None
    ) -> Plan[Result]:
        """One interactive call: attempts until an answer, a final error or the deadline."""
        if deadline is None:
            deadline = self._publisher.deadline(LaneName.INTERACTIVE, timeout)
        key = mutation_key(operation)
        attempt = 1
        while True:
            try:
                return (yield from self._attempt(operation, deadline, key))
            except RetryableError as exc:
                delay_ms = self._retry_in_ms(exc, attempt, deadline)
                if delay_ms is None:
                    raise
                yield Pause(delay_ms / 1000)
                attempt += 1

    def _attempt(self, operation: Operation, deadline: int, key: str) -> Plan[Result]:
        try:
            (handle,) = yield from self._send(self._publisher.one(operation, deadline, key))
        except ResourceExhausted as exc:
            self._publisher.held_back(exc)
            raise
        try:
            return (yield Answer(handle))  # type: ignore[no-any-return]
        except ResourceExhausted as exc:
            self._publisher.held_back(exc)
            raise
        finally:
            # Nobody else waits for this attempt's answer: once its call has
            # it, gave up or was cancelled, a late one is dropped on arrival.
            self._transport.replies.forget(handle.request_id)

    def _send(self, out: Outgoing) -> Plan[builtins.list[H]]:
        try:
            epoch = yield Publish(out, self.caller)
        except AdmissionRefused as refusal:
            made = self._publisher.handles(out, refusal.epoch, self._made, refusal.sent)
            raise self._publisher.refused(out, refusal, made) from None
        self._publisher.accepted(out)
        return self._publisher.handles(out, epoch, self._made)

    def _made(self, request_id: str, deadline_ms: int, epoch: str, key: str, carrier: Any) -> H:
        return self._handle(
            self._transport, self.caller, request_id, deadline_ms, epoch, key, carrier
        )


class Blocking(Calls[H]):
    """Calls that block until done."""

    def _bind(self, plan: Callable[..., Plan[Any]]) -> Callable[..., Any]:
        transport = self._transport

        def blocking(*args: Any, **kwargs: Any) -> Any:
            return Driver(plan(self, *args, **kwargs)).run(transport)

        return blocking


class Awaited(Calls[H]):
    """Calls that are awaited."""

    def _bind(self, plan: Callable[..., Plan[Any]]) -> Callable[..., Any]:
        transport = self._transport

        async def awaited(*args: Any, **kwargs: Any) -> Any:
            return await Driver(plan(self, *args, **kwargs)).arun(transport)

        return awaited
