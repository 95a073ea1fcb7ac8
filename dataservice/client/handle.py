"""A submitted request, and the wait for its answer."""

from __future__ import annotations

import time

from dataservice.client.transport import Transport
from dataservice.codec import decode_response
from dataservice.errors import DeadlineExceeded, RequestLost, ResultNotReady
from dataservice.types import Result

# How long a wait goes between looks at the broker's epoch: an answer that
# comes sooner costs no look at all.
EPOCH_CHECK_S = 1.0
# Once the epoch has changed, how long an answer may still come: a worker that
# held the request when Redis restarted puts it back in the new queue (kombu
# restores what it had prefetched) or answers it.
LOST_AFTER_S = 5.0


def now_ms() -> int:
    return time.time_ns() // 1_000_000


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

    def done(self) -> bool:
        """True once the answer has arrived (it may still be an error)."""
        return self._result is not None or self._transport.results.ready(
            self.caller, self.request_id
        )

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
                self._result = decode_response(body, self.request_id)
                return self._result
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

    def _lost(self) -> RequestLost:
        return RequestLost(
            "the broker's Redis restarted empty after admitting this request, and no "
            "answer came after it: the request, or its answer, was lost"
            + ("; send it again under the same idempotency key" if self.idempotency_key else ""),
            request_id=self.request_id,
        )
