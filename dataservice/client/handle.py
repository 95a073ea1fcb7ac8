"""A submitted request, and the wait for its answer.

Every answer comes on the client's reply channel (:class:`~.inbox.Inbox`).
A request that went out alone is answered under its own id. The operations
of a batch message are answered together, under the message's id (one
``BatchResponse``): their handles share a :class:`Carrier`, and whichever of
them is asked first takes the message's answer for all of them.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from dataservice.client.async_transport import AsyncTransport
from dataservice.client.transport import Transport
from dataservice.codec import parse_response, result_of
from dataservice.errors import DataServiceError, DeadlineExceeded, RequestLost, ResultNotReady
from dataservice.plans import Driver
from dataservice.proto import pb
from dataservice.types import Result

T = TypeVar("T", Transport, AsyncTransport)

# How long a wait goes between looks at the broker's epoch: an answer that
# comes sooner costs no look at all.
EPOCH_CHECK_S = 1.0
# Once the epoch has changed, how long an answer may still come: a worker that
# held the request when Redis restarted puts it back in the new queue (kombu
# restores what it had prefetched) or answers it.
LOST_AFTER_S = 5.0


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class Carrier:
    """One batch message's answer, shared by the handles of its operations:
    taken once, by whichever of them asks first (or by :func:`gather`)."""

    __slots__ = ("_alock", "_answers", "_lock", "_whole", "deadline_ms", "message_id")

    def __init__(self, message_id: str, deadline_ms: int) -> None:
        self.message_id = message_id
        self.deadline_ms = deadline_ms
        # Held by the handle taking the answer: a thread's, or a coroutine's
        # (made on first use, on the loop that uses it).
        self._lock = threading.Lock()
        self._alock: asyncio.Lock | None = None
        # The message's answer: each operation's, or one for all of them.
        self._answers: dict[str, pb.ResponseEnvelope] | None = None
        self._whole: pb.ResponseEnvelope | None = None

    @property
    def settled(self) -> bool:
        return self._answers is not None or self._whole is not None

    def settle(self, body: bytes) -> None:
        try:
            response = parse_response(body, self.message_id)
        except DataServiceError as exc:
            response = pb.ResponseEnvelope(
                status=pb.Status(code=pb.STATUS_CODE_INTERNAL, message=str(exc))
            )
        if response.status.code == pb.STATUS_CODE_OK and response.HasField("batch"):
            self._answers = {answer.request_id: answer for answer in response.batch.answers}
        elif response.status.code == pb.STATUS_CODE_OK:
            self._whole = pb.ResponseEnvelope(
                status=pb.Status(
                    code=pb.STATUS_CODE_INTERNAL, message="the service sent no batch answer"
                )
            )
        else:
            self._whole = response

    @property
    def alock(self) -> asyncio.Lock:
        if self._alock is None:
            self._alock = asyncio.Lock()
        return self._alock

    def answer_for(self, request_id: str) -> pb.ResponseEnvelope | None:
        """Once settled: the operation's answer, the whole message's refusal,
        or None (the operation was dropped, its deadline passed)."""
        if self._whole is not None:
            return self._whole
        return None if self._answers is None else self._answers.get(request_id)


class HandleBase(Generic[T]):
    """A submitted request: what both clients' handles keep and how they
    read an answer (see :class:`Handle`)."""

    __slots__ = (
        "_carrier",
        "_error",
        "_result",
        "_transport",
        "caller",
        "deadline_ms",
        "epoch",
        "idempotency_key",
        "request_id",
    )
    _transport: T

    def __init__(
        self,
        transport: T,
        caller: str,
        request_id: str,
        deadline_ms: int,
        epoch: str = "",
        idempotency_key: str = "",
        carrier: Carrier | None = None,
    ) -> None:
        self._transport = transport
        self.caller = caller
        self.request_id = request_id
        self.deadline_ms = deadline_ms
        self.epoch = epoch
        self.idempotency_key = idempotency_key
        # The batch message it went out in, if it went out in one.
        self._carrier = carrier
        self._result: Result | None = None
        # An answer that was an error, kept once taken: asking again raises it again.
        self._error: DataServiceError | None = None

    @property
    def _waits_on(self) -> str:
        """The id its answer comes under: its own, or its batch message's."""
        return self._carrier.message_id if self._carrier is not None else self.request_id

    def done(self) -> bool:
        """True once the answer has arrived (it may still be an error)."""
        if self._result is not None or self._error is not None:
            return True
        if self._carrier is not None and self._carrier.settled:
            return True
        return self._transport.replies.ready(self._waits_on)

    def _kept(self) -> Result | None:
        """The answer already taken (raised again if it was an error)."""
        if self._error is not None:
            raise self._error
        return self._result

    def _gave_up(self, wait_id: str, timeout: float | None, remaining: float) -> DataServiceError:
        """The error of a wait that ended without an answer; the slot goes
        unless the caller may still ask again (``ResultNotReady``)."""
        lost = bool(self.epoch) and self._transport.ended_for(self.epoch) is not None
        error = self._lost() if lost else self._not_in(timeout, remaining)
        if not isinstance(error, ResultNotReady):
            self._transport.replies.forget(wait_id)
        return error

    def _not_in(self, timeout: float | None, remaining: float) -> DataServiceError:
        if timeout is not None and timeout < remaining:
            return ResultNotReady(f"no answer to {self.request_id} within {timeout} s")
        return DeadlineExceeded("no answer before the deadline", request_id=self.request_id)

    def _settle(self, body: bytes) -> Result:
        """Keep the answer (or its error) and return (or raise) it."""
        try:
            response = parse_response(body, self.request_id)
        except DataServiceError as exc:
            self._error = exc
            raise
        return self._take(response)

    def _take(self, response: pb.ResponseEnvelope | None) -> Result:
        if response is None:
            # The worker dropped it: its deadline had passed when it was reached.
            self._error = DeadlineExceeded(
                "dropped: its deadline passed before it was served", request_id=self.request_id
            )
            raise self._error
        try:
            self._result = result_of(response, self.request_id)
        except DataServiceError as exc:
            self._error = exc
            raise
        return self._result

    def _lost(self) -> RequestLost:
        return RequestLost(
            "the broker's Redis restarted empty after admitting this request, and no "
            "answer came after it: the request, or its answer, was lost"
            + ("; send it again under the same idempotency key" if self.idempotency_key else ""),
            request_id=self.request_id,
        )

    def _answer(self, timeout: float | None) -> Generator[Any, Any, Result]:
        """The plan of :meth:`Handle.result` (and of the asyncio one's)."""
        kept = self._kept()
        if kept is not None:
            return kept
        carrier = self._carrier
        if carrier is None:
            body = yield from self._awaiting(self.request_id, self.deadline_ms, timeout)
            return self._settle(body)
        if not carrier.settled:
            remaining = max(0.0, (carrier.deadline_ms - now_ms()) / 1000)
            wait_s = remaining if timeout is None else min(timeout, remaining)
            # A sibling may be taking the message's answer: wait for it, as long.
            release = yield _Take(carrier, wait_s)
            if release is None:
                raise self._not_in(timeout, remaining)
            try:
                if not carrier.settled:
                    wait_id, deadline_ms = carrier.message_id, carrier.deadline_ms
                    carrier.settle((yield from self._awaiting(wait_id, deadline_ms, timeout)))
            finally:
                release()
        return self._take(carrier.answer_for(self.request_id))

    def _awaiting(
        self, wait_id: str, deadline_ms: int, timeout: float | None
    ) -> Generator[Any, Any, bytes]:
        """The body that comes under ``wait_id``, within the deadline (and
        ``timeout``). Its slot on the reply channel goes once the wait ends
        for good (an answer, the deadline, a lost request)."""
        replies = self._transport.replies
        remaining = (deadline_ms - now_ms()) / 1000
        until = time.monotonic() + (remaining if timeout is None else min(timeout, remaining))
        while replies.expecting(wait_id):
            left = max(0.0, until - time.monotonic())
            ended = self._transport.ended_for(self.epoch) if self.epoch else None
            # Past the grace, only an answer already there is taken.
            hopeless = ended is not None and ended >= LOST_AFTER_S
            body = yield _Wait(wait_id, 0.0 if hopeless else min(left, EPOCH_CHECK_S))
            if body is not None:
                return body  # type: ignore[no-any-return]
            if hopeless:
                replies.forget(wait_id)
                raise self._lost()
            if time.monotonic() >= until:
                break
            if self.epoch:
                yield _LookAtEpoch(self.epoch, deadline_ms)
        raise self._gave_up(wait_id, timeout, remaining)


# The steps of a handle's wait, run against its transport (blocking or awaited).


@dataclass(frozen=True, slots=True)
class _Wait:
    """Wait on the reply channel; gives the body, or None."""

    wait_id: str
    seconds: float

    def run(self, transport: Transport) -> bytes | None:
        return transport.replies.wait(self.wait_id, self.seconds)

    async def arun(self, transport: AsyncTransport) -> bytes | None:
        return await transport.replies.wait(self.wait_id, self.seconds)


@dataclass(frozen=True, slots=True)
class _LookAtEpoch:
    epoch: str
    deadline_ms: int

    def run(self, transport: Transport) -> None:
        transport.look_at_epoch(self.epoch, self.deadline_ms)

    async def arun(self, transport: AsyncTransport) -> None:
        await transport.look_at_epoch(self.epoch, self.deadline_ms)


@dataclass(frozen=True, slots=True)
class _Take:
    """Take a batch message's carrier; gives how to let it go, or None when
    ``seconds`` passed first."""

    carrier: Carrier
    seconds: float

    def run(self, _: Transport) -> Callable[[], None] | None:
        lock = self.carrier._lock
        return lock.release if lock.acquire(timeout=self.seconds) else None

    async def arun(self, _: AsyncTransport) -> Callable[[], None] | None:
        lock = self.carrier.alock
        try:
            async with asyncio.timeout(self.seconds):
                await lock.acquire()
        except TimeoutError:
            return None
        return lock.release


@dataclass(frozen=True, slots=True)
class _Result:
    """A handle's answer; gives it, or raises its error."""

    handle: Handle | AsyncHandle

    def run(self, _: object) -> Result:
        return self.handle.result()  # type: ignore[return-value]

    async def arun(self, _: object) -> Result:
        return await self.handle.result()  # type: ignore[misc,no-any-return]


class Handle(HandleBase[Transport]):
    """A submitted request. Wait for it with :meth:`result`, or drop it: an
    answer nobody collects is let go at its deadline plus the grace.

    ``epoch`` is the broker's epoch the request was admitted in: a Redis that
    restarts empty (it keeps nothing on disk) loses its queue and takes a new
    epoch, and a handle that sees it raises :class:`RequestLost` instead of
    waiting out its deadline. ``idempotency_key`` is the key a write or delete
    went out under ('' for reads and lists): sent again under it, it is
    applied once."""

    __slots__ = ()

    def result(self, timeout: float | None = None) -> Result:
        """Wait for the answer, at most until the deadline (or ``timeout`` seconds).

        Raises the answer's typed error, :class:`RequestLost` when the broker
        restarted empty after admitting the request and no answer came in the
        ``LOST_AFTER_S`` after that was seen (or before the deadline),
        :class:`DeadlineExceeded` when no answer came before the deadline (or
        the request was dropped for it), or :class:`ResultNotReady` when
        ``timeout`` ran out first (the request may still complete: call again).
        ``Unavailable`` means the client's reply channel could not be read; the
        request may still complete: call again.
        """
        return Driver(self._answer(timeout)).run(self._transport)


class AsyncHandle(HandleBase[AsyncTransport]):
    """A request submitted by :class:`~dataservice.AsyncClient`: as
    :class:`Handle`, its :meth:`result` awaited. A cancelled await changes
    nothing: the answer can still be awaited, and is let go at the deadline
    plus the grace if nobody does."""

    __slots__ = ()

    async def result(self, timeout: float | None = None) -> Result:
        """As :meth:`Handle.result`."""
        return await Driver(self._answer(timeout)).arun(self._transport)


def gather(handles: Sequence[Handle]) -> list[Result | DataServiceError]:
    """Every handle's answer, or the error it raises, in their order: what
    :meth:`Handle.result` gives each.

    The answers arrive on the reply channel together, whoever waits: taking
    them one handle after another waits, in all, until every answer is in or
    each handle's own deadline has passed (so a handle still without one is
    told ``DeadlineExceeded`` or ``RequestLost`` as it would be alone).
    """
    return Driver(_gathered(handles)).run(None)


async def gather_async(handles: Sequence[AsyncHandle]) -> list[Result | DataServiceError]:
    """As :func:`gather`, for :class:`AsyncHandle`\\ s."""
    return await Driver(_gathered(handles)).arun(None)


def _gathered(
    handles: Sequence[Handle] | Sequence[AsyncHandle],
) -> Generator[_Result, Any, list[Result | DataServiceError]]:
    out: list[Result | DataServiceError] = []
    for handle in handles:
        try:
            out.append((yield _Result(handle)))
        except DataServiceError as exc:
            out.append(exc)
    return out
