"""Every error the service raises, under one root.

::

    DataServiceError
    ├── ConfigError                 bad queues.yml or environment (names the key)
    │   └── InvalidControl          a rollout control given a value it cannot take
    ├── ResultNotReady              Handle.result(timeout) ran out before the deadline
    ├── RequestError                the service answered with a non-OK status
    │   ├── InvalidArgument         INVALID_ARGUMENT: malformed or out-of-bounds input
    │   ├── Unauthenticated         UNAUTHENTICATED
    │   ├── PermissionDenied        PERMISSION_DENIED
    │   ├── NotFound                NOT_FOUND
    │   ├── Conflict                CONFLICT
    │   ├── DeadlineExceeded        DEADLINE_EXCEEDED: the answer did not come in time
    │   ├── InternalError           INTERNAL
    │   └── RetryableError          safe to retry after ``retry_after`` seconds
    │       ├── ResourceExhausted   RESOURCE_EXHAUSTED: overloaded or rate limited
    │       └── Unavailable         UNAVAILABLE: a dependency is down
    │           └── RequestLost     the broker's Redis restarted empty after admitting it
    ├── ServiceSetupError           a local dependency could not be started or reached
    │   └── BinlogSetupError        the database cannot feed the change stream (names each setting)
    ├── CallerInterfaceError        a caller program broke the conformance interface (tools)
    ├── CacheDetour                 internal: a read takes another way than the cache planned
    │   ├── CacheDown               the breaker is open or a cache command failed
    │   ├── FollowerTimedOut        a coalesced read's own deadline came before the leader's
    │   └── LeaderFailed            the read it waited for failed; it may try itself
    ├── LeaseLost                   internal: this change consumer is no longer the active one
    │   └── StaleToken              its fencing token was refused by the invalidation script
    └── Refusal                     internal: why a request was not served (dataservice.refusals)
        ├── Rejected                a check before any work (auth, allowlist, limits)
        ├── AdmissionRefused        a lane queue's bounds or the caller's pace, at publish
        ├── PermitUnavailable       no database permit within the request's wait
        ├── ConnectRateLimited      the connect ramp has no room yet
        │   └── ConnectionsInDoubt  a connection let go of is not yet confirmed gone
        ├── TooLittleTime           less time left than the operation needs
        ├── StatementTimeout        a statement ran out of its time
        ├── DatabaseBusy            the pool or the server had no connection to spare
        ├── DatabaseUnavailable     unreachable, rolled back, or lost mid-statement
        ├── DatabaseFailure         any other database error
        ├── RecordMissing           no such record
        ├── CoalescedWaitExpired    a cache follower's deadline came before its leader's record
        ├── ResponseFull            a read_many's answer had no room left for a record
        ├── RevisionMismatch        a conditional change found another revision
        ├── IdempotencyConflict     a used key, a different request
        ├── DeleteRaced             the record kept changing under a delete
        └── GroupRaced              concurrent writers kept changing a group's records

Retryable errors sit on their own branch so callers catch one class. A
``RequestError`` never carries SQL text or other internals: its message is
what the service chose to tell the caller. A ``Refusal`` never reaches a
caller as such: ``dataservice.handler.failures`` turns it into an answer (and
the client turns an admission refusal into ``ResourceExhausted``).
"""

from __future__ import annotations

from typing import ClassVar

from dataservice.enums import StatusCode


class DataServiceError(Exception):
    """Root of every error raised by dataservice."""


class ConfigError(DataServiceError):
    """The configuration is invalid; the message names the offending key."""


class InvalidControl(ConfigError):
    """A rollout control (``dataservice cache``) was given a value it cannot
    take; the message names the control. Nothing was changed."""


class ResultNotReady(DataServiceError, TimeoutError):
    """No answer yet within the caller's wait; the request's deadline has not passed."""


class ServiceSetupError(DataServiceError):
    """A local service (Redis, MariaDB) could not be started or reached."""


class BinlogSetupError(ServiceSetupError):
    """The database server cannot feed the change stream: its binlog settings
    or the consumer's grants. ``problems`` holds one line per missing setting,
    each naming the server setting or grant that fixes it."""

    def __init__(self, message: str, problems: tuple[str, ...]) -> None:
        super().__init__(message)
        self.problems = problems


class CacheDetour(DataServiceError):
    """Internal to the cache (:mod:`dataservice.cache`): a read goes another
    way than planned. Never seen by a caller."""


class LeaseLost(DataServiceError):
    """Internal to the change consumer (:mod:`dataservice.changes`): another
    consumer holds the lease now; this one stands by."""


class StaleToken(LeaseLost):
    """The invalidation script refused this consumer's fencing token."""


class RequestError(DataServiceError):
    """The service answered a request with a non-OK status."""

    code: ClassVar[StatusCode] = StatusCode.INTERNAL

    def __init__(self, message: str, *, request_id: str = "", reason: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.request_id = request_id
        # Why the service refused it ("rate_limited", "no_permit", ...): every
        # retryable answer the service gives names one; "" otherwise.
        self.reason = reason

    def __str__(self) -> str:
        return f"{self.code.name}: {self.message}"


class InvalidArgument(RequestError):
    code = StatusCode.INVALID_ARGUMENT


class Unauthenticated(RequestError):
    code = StatusCode.UNAUTHENTICATED


class PermissionDenied(RequestError):
    code = StatusCode.PERMISSION_DENIED


class NotFound(RequestError):
    code = StatusCode.NOT_FOUND


class Conflict(RequestError):
    code = StatusCode.CONFLICT


class DeadlineExceeded(RequestError):
    code = StatusCode.DEADLINE_EXCEEDED


class InternalError(RequestError):
    code = StatusCode.INTERNAL


class RetryableError(RequestError):
    """A transient refusal: retrying after ``retry_after`` seconds may succeed."""

    def __init__(
        self, message: str, *, request_id: str = "", retry_after: float = 0.0, reason: str = ""
    ) -> None:
        super().__init__(message, request_id=request_id, reason=reason)
        self.retry_after = retry_after


class ResourceExhausted(RetryableError):
    """Overloaded or rate limited. From ``submit_many``, ``accepted`` holds the
    handles of the operations enqueued before the refusal (the rest were not)."""

    code = StatusCode.RESOURCE_EXHAUSTED

    def __init__(
        self,
        message: str,
        *,
        request_id: str = "",
        retry_after: float = 0.0,
        reason: str = "",
        accepted: tuple[object, ...] = (),
    ) -> None:
        super().__init__(message, request_id=request_id, retry_after=retry_after, reason=reason)
        self.accepted = accepted


class Unavailable(RetryableError):
    code = StatusCode.UNAVAILABLE


class RequestLost(Unavailable):
    """The broker's Redis restarted empty (it keeps nothing on disk) after this
    request was admitted, and no answer came after it: the request was lost
    with the queue, or its answer with the result backend. A read can simply
    be sent again. A write or delete may or may not have been applied: send it
    again under the same idempotency key (the handle's ``idempotency_key``),
    which the database remembers, and it is applied once."""


_BY_CODE: dict[StatusCode, type[RequestError]] = {
    cls.code: cls
    for cls in (
        InvalidArgument,
        Unauthenticated,
        PermissionDenied,
        NotFound,
        Conflict,
        DeadlineExceeded,
        InternalError,
        ResourceExhausted,
        Unavailable,
    )
}


def error_for(
    code: StatusCode,
    message: str,
    *,
    request_id: str = "",
    retry_after: float = 0.0,
    reason: str = "",
) -> RequestError:
    """The typed exception for a non-OK status code from the wire."""
    cls = _BY_CODE.get(code, InternalError)
    if issubclass(cls, RetryableError):
        return cls(message, request_id=request_id, retry_after=retry_after, reason=reason)
    return cls(message, request_id=request_id, reason=reason)
