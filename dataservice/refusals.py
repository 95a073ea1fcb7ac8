"""Why a request was not served: the reasons, and the root of internal refusals.

:class:`Reason` names what refused a request: a check before any work, or a
bound on its way to the database that a retry may find free (every refusal
answered ``RESOURCE_EXHAUSTED`` or ``UNAVAILABLE`` has one, so a caller and
the rejection counter always learn why). It is the ``reason`` of an answer's
``Status``, of :class:`RequestError`, and the label of the rejection counter.
The Lua scripts return these same strings.

:class:`Refusal` is the root of every internal refusal or failure on the
request path (kombu's ``OperationalError`` is the model): a permit or pool
that had no room, a statement or a request out of time, a connect ramp, the
gate, admission, a revision or idempotency conflict, a database that failed.
Code that serves a request catches this one class, and
:mod:`dataservice.handler.failures` maps each kind to the status code and
retry-after its caller sees. A refusal's message is for the log, and the
table chooses what the caller reads, except for :class:`Rejected`, whose
message was written for the caller by the check that refused.
"""

from __future__ import annotations

from enum import StrEnum

from dataservice.errors import DataServiceError


class Reason(StrEnum):
    """The check that refused a request before any work."""

    # The workers' checks, in the order they run (docs/protocol.md).
    MALFORMED = "malformed"
    UNSIGNED = "unsigned"
    UNKNOWN_KEY = "unknown_key"
    BAD_SIGNATURE = "bad_signature"
    WRONG_CALLER = "wrong_caller"
    CLOCK_SKEW = "clock_skew"
    UNKNOWN_CALLER = "unknown_caller"
    OPERATION_DENIED = "operation_denied"
    LANE_DENIED = "lane_denied"
    SCOPE_DENIED = "scope_denied"
    REPLAYED = "replayed"
    RATE_LIMITED = "rate_limited"
    CONCURRENCY_LIMITED = "concurrency_limited"
    LIMITS_UNAVAILABLE = "limits_unavailable"
    # Admission, at publish (admit.lua); an over-rate publish is RATE_LIMITED.
    QUEUE_FULL = "queue_full"
    QUEUE_BYTES = "queue_bytes"
    QUEUE_TOO_LONG = "queue_too_long"
    # The client's own throttle: the service was refusing most of what this
    # process sent (dataservice/client/throttle.py); nothing was sent.
    THROTTLED = "throttled"
    # One read of a read_many whose record did not fit in the answer
    # (limits.max_response_bytes): asked again, it comes in the next one.
    RESPONSE_FULL = "response_full"
    # On the way to the database, after every check (dataservice.handler.failures).
    NO_PERMIT = "no_permit"
    RECONNECTING = "reconnecting"
    DATABASE_BUSY = "database_busy"
    DATABASE_UNAVAILABLE = "database_unavailable"
    COALESCING = "coalescing"
    RECORDS_CHANGING = "records_changing"


# What admission at publish may answer (``dataservice/limits/admit.lua``).
ADMISSION_REASONS = (
    Reason.QUEUE_FULL,
    Reason.QUEUE_BYTES,
    Reason.QUEUE_TOO_LONG,
    Reason.RATE_LIMITED,
)

# What a caller reads when a limit refuses it, wherever the limit is applied
# (the workers' gate, admission at publish, the client's own pacing).
LIMIT_MESSAGES = {
    Reason.REPLAYED: "request id already used",
    Reason.RATE_LIMITED: "the caller is over its rate",
    Reason.CONCURRENCY_LIMITED: "the caller has too many interactive requests in flight",
    Reason.LIMITS_UNAVAILABLE: "the service cannot check for replays right now",
    Reason.QUEUE_FULL: "the lane queue is full",
    Reason.QUEUE_BYTES: "the lane queue holds too many bytes",
    Reason.QUEUE_TOO_LONG: "the lane queue is too long to serve the request before its deadline",
    Reason.THROTTLED: "the service is refusing most requests on this lane; not sent",
    Reason.RESPONSE_FULL: "the answer had no room left for this record; ask for it again",
}


class Refusal(DataServiceError):
    """Internal: the service refused or failed to do what a request asked.

    ``retry_after_ms`` is set where the refusing code knows when to come back
    (a rate, a connect ramp, a queue's drain); ``reason`` where a check before
    any work refused; ``caller`` is whom to answer when that is known.
    """

    def __init__(
        self,
        message: str = "",
        *,
        reason: Reason | None = None,
        retry_after_ms: int = 0,
        caller: str = "",
    ) -> None:
        self.message = message or (type(self).__doc__ or type(self).__name__).split("\n")[0]
        super().__init__(self.message)
        self.reason = reason
        self.retry_after_ms = retry_after_ms
        self.caller = caller


class Rejected(Refusal):
    """Refused by a check before the cache or the database saw the request."""

    reason: Reason

    def __init__(
        self, reason: Reason, message: str, *, caller: str = "", retry_after_ms: int = 0
    ) -> None:
        super().__init__(message, reason=reason, retry_after_ms=retry_after_ms, caller=caller)

    def __str__(self) -> str:
        return f"{self.reason.value}: {self.message}"
