"""A submitted request, and the wait for its answer."""

from __future__ import annotations

import time

from dataservice.client.transport import Transport
from dataservice.codec import decode_response
from dataservice.errors import DeadlineExceeded, ResultNotReady
from dataservice.types import Result


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class Handle:
    """A submitted request. Await it with :meth:`result`, or drop it: an answer
    nobody collects expires with its deadline."""

    __slots__ = ("_result", "_transport", "caller", "deadline_ms", "request_id")

    def __init__(
        self, transport: Transport, caller: str, request_id: str, deadline_ms: int
    ) -> None:
        self._transport = transport
        self.caller = caller
        self.request_id = request_id
        self.deadline_ms = deadline_ms
        self._result: Result | None = None

    def done(self) -> bool:
        """True once the answer has arrived (it may still be an error)."""
        return self._result is not None or self._transport.results.ready(
            self.caller, self.request_id
        )

    def result(self, timeout: float | None = None) -> Result:
        """Wait for the answer, at most until the deadline (or ``timeout`` seconds).

        Raises the answer's typed error, :class:`DeadlineExceeded` when no answer
        came before the deadline, or :class:`ResultNotReady` when ``timeout``
        ran out first (the request may still complete: call again).
        """
        if self._result is not None:
            return self._result
        remaining = (self.deadline_ms - now_ms()) / 1000
        wait = remaining if timeout is None else min(timeout, remaining)
        body = self._transport.results.wait(self.caller, self.request_id, wait)
        if body is None:
            if timeout is not None and timeout < remaining:
                raise ResultNotReady(f"no answer to {self.request_id} within {timeout} s")
            raise DeadlineExceeded("no answer before the deadline", request_id=self.request_id)
        self._result = decode_response(body, self.request_id)
        return self._result
