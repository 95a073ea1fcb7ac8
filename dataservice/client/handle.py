"""A submitted request, and the wait for its answer."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Sequence

from dataservice.client.transport import Transport
from dataservice.codec import decode_response
from dataservice.errors import DataServiceError, DeadlineExceeded, RequestLost, ResultNotReady
from dataservice.types import Result

# How long a wait goes between looks at the broker's epoch: an answer that
# comes sooner costs no look at all.
EPOCH_CHECK_S = 1.0
# Once the epoch has changed, how long an answer may still come: a worker that
# held the request when Redis restarted puts it back in the new queue (kombu
# restores what it had prefetched) or answers it.
LOST_AFTER_S = 5.0
# The oldest answers gather takes at once after one of them came: a few
# batch messages' worth.
GATHER_WINDOW = 512


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def gather(handles: Sequence[Handle]) -> list[Result | DataServiceError]:
    """Every handle's answer, or the error it raises, in their order: what
    :meth:`Handle.result` gives each, collected a round trip per hundreds of
    answers rather than one each (a batch's answers arrive together).

    Waits until every answer is in or each handle's own deadline has passed;
    a handle still without one is then asked as :meth:`Handle.result` would
    be (so it is told ``DeadlineExceeded`` or ``RequestLost`` as it would).
    """
    pending: dict[tuple[int, str], dict[str, Handle]] = {}
    for handle in handles:
        if handle._result is None and handle._error is None:
            key = (id(handle._transport), handle.caller)
            pending.setdefault(key, {})[handle.request_id] = handle
    for group in pending.values():
        _collect(group)
    out: list[Result | DataServiceError] = []
    for handle in handles:
        try:
            out.append(handle.result())
        except DataServiceError as exc:
            out.append(exc)
    return out


def _collect(waiting: dict[str, Handle]) -> None:
    """Settle what comes in for ``waiting`` (one transport, one caller, in the
    order they were sent) until it is all in or the latest deadline among
    them has passed.

    Answers come roughly in the order sent, a batch message's all at once:
    wait for the first of the oldest few, then take the window of the oldest
    that came with it in one round trip. A wait that sees none of the oldest
    come sweeps them all once, so that one never answered (dropped late)
    holds nobody else up for longer than a wait.
    """
    first = next(iter(waiting.values()))
    transport, caller = first._transport, first.caller
    results = transport.results
    until_ms = max(handle.deadline_ms for handle in waiting.values())
    while waiting and (left_ms := until_ms - now_ms()) > 0:
        ids = list(waiting)
        came = results.wait_any(caller, ids, min(left_ms / 1000, EPOCH_CHECK_S))
        if came is not None:
            taken = {came[0]: came[1], **results.take_many(caller, ids[:GATHER_WINDOW])}
        else:
            taken = results.take_many(caller, ids)
            if not taken and _lost(transport, waiting.values(), until_ms):
                return
        for request_id, body in taken.items():
            handle = waiting.pop(request_id)
            with contextlib.suppress(DataServiceError):
                handle._settle(body)
        # Handles past their own deadline are left to Handle.result.
        now = now_ms()
        for request_id in [i for i, h in waiting.items() if h.deadline_ms <= now]:
            del waiting[request_id]


def _lost(transport: Transport, waiting: Iterable[Handle], until_ms: int) -> bool:
    """After a quiet wait: whether the broker restarted empty after admitting
    every handle still waiting, longer than ``LOST_AFTER_S`` ago (each is then
    told so by :meth:`Handle.result`)."""
    epochs = {handle.epoch for handle in waiting}
    for epoch in epochs - {""}:
        transport.look_at_epoch(epoch, until_ms)
    return "" not in epochs and all(
        (ended := transport.ended_for(epoch)) is not None and ended >= LOST_AFTER_S
        for epoch in epochs
    )


class Handle:
    """A submitted request. Await it with :meth:`result`, or drop it: an answer
    nobody collects expires with its deadline.

    ``epoch`` is the broker's epoch the request was admitted in: a Redis that
    restarts empty (it keeps nothing on disk) loses its queue and takes a new
    epoch, and a handle that sees it raises :class:`RequestLost` instead of
    waiting out its deadline. ``idempotency_key`` is the key a write or delete
    went out under ('' for reads and lists): sent again under it, it is
    applied once."""

    __slots__ = (
        "_error",
        "_result",
        "_transport",
        "caller",
        "deadline_ms",
        "epoch",
        "idempotency_key",
        "request_id",
    )

    def __init__(
        self,
        transport: Transport,
        caller: str,
        request_id: str,
        deadline_ms: int,
        epoch: str = "",
        idempotency_key: str = "",
    ) -> None:
        self._transport = transport
        self.caller = caller
        self.request_id = request_id
        self.deadline_ms = deadline_ms
        self.epoch = epoch
        self.idempotency_key = idempotency_key
        self._result: Result | None = None
        # An answer that was an error, kept once taken: asking again raises it again.
        self._error: DataServiceError | None = None

    def done(self) -> bool:
        """True once the answer has arrived (it may still be an error)."""
        if self._result is not None or self._error is not None:
            return True
        return self._transport.results.ready(self.caller, self.request_id)

    def result(self, timeout: float | None = None) -> Result:
        """Wait for the answer, at most until the deadline (or ``timeout`` seconds).

        Raises the answer's typed error, :class:`RequestLost` when the broker
        restarted empty after admitting the request and no answer came in the
        ``LOST_AFTER_S`` after that was seen (or before the deadline),
        :class:`DeadlineExceeded` when no answer came before the deadline, or
        :class:`ResultNotReady` when ``timeout`` ran out first (the request may
        still complete: call again). ``Unavailable`` means the result backend
        did not answer; the request may still complete: call again.
        """
        if self._result is not None:
            return self._result
        if self._error is not None:
            raise self._error
        remaining = (self.deadline_ms - now_ms()) / 1000
        until = time.monotonic() + (remaining if timeout is None else min(timeout, remaining))
        while True:
            left = max(0.0, until - time.monotonic())
            ended = self._transport.ended_for(self.epoch) if self.epoch else None
            # Past the grace, only an answer already there is taken.
            hopeless = ended is not None and ended >= LOST_AFTER_S
            body = self._transport.results.wait(
                self.caller,
                self.request_id,
                0.0 if hopeless else min(left, EPOCH_CHECK_S),
                patience_s=left,
            )
            if body is not None:
                return self._settle(body)
            if hopeless:
                raise self._lost()
            if time.monotonic() >= until:
                break
            if self.epoch:
                self._transport.look_at_epoch(self.epoch, self.deadline_ms)
        if self.epoch and self._transport.ended_for(self.epoch) is not None:
            raise self._lost()
        if timeout is not None and timeout < remaining:
            raise ResultNotReady(f"no answer to {self.request_id} within {timeout} s")
        raise DeadlineExceeded("no answer before the deadline", request_id=self.request_id)

    def _settle(self, body: bytes) -> Result:
        """Keep the answer (or its error) and return (or raise) it."""
        try:
            self._result = decode_response(body, self.request_id)
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
