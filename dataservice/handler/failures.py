"""Every internal failure, mapped to what its caller is told: one table.

Two steps, httpx's ``map_exceptions`` being the model:

1. :func:`database_errors` turns the database driver's exceptions into the
   service's own :class:`~dataservice.refusals.Refusal` kinds, by MySQL error
   number, according to whether a retry is safe.
2. :func:`verdict` looks a refusal up in ``_TABLE``: its status code or
   reason, the message the caller reads, its retry-after, and which counter
   it feeds.

Every retryable refusal (``RESOURCE_EXHAUSTED``, ``UNAVAILABLE``) is answered
through a :class:`~dataservice.refusals.Reason`, whose code ``REASON_CODES``
gives: a caller told to come back is always told why, and the rejection
counter never counts one without a reason (a test holds every row to it).

A refusal the table does not know is a bug; it is answered ``INTERNAL``.
``docs/protocol.md`` ("Status codes", and the refusal tables of "The workers'
checks") describes the same table, and a test keeps the two in step.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType

from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from dataservice.enums import StatusCode
from dataservice.limits.admission import AdmissionRefused
from dataservice.limits.permits import PermitUnavailable
from dataservice.observe.metrics import Dependency, TimeoutStage
from dataservice.refusals import LIMIT_MESSAGES, Reason, Refusal, Rejected
from dataservice.store import DeleteRaced, GroupRaced, IdempotencyConflict, RevisionMismatch
from dataservice.store.connections import ConnectRateLimited, StatementTimeout

log = logging.getLogger(__name__)

RETRY_POOL_BUSY_MS = 50
RETRY_DB_UNAVAILABLE_MS = 250
RETRY_COALESCED_MS = 50


class TooLittleTime(Refusal):
    """Less time is left than the operation needs in the database."""


class DatabaseBusy(Refusal):
    """The pool or the server had no connection to spare."""


class DatabaseUnavailable(Refusal):
    """The database could not be reached, rolled the statement back, or the
    connection was lost mid-statement: nothing is known to be applied that a
    retry under the same idempotency key would apply again."""


class DatabaseFailure(Refusal):
    """Any other database error: retrying cannot help."""


class RecordMissing(Refusal):
    """No such record."""


class ResponseFull(Refusal):
    """One read of a read_many: the answer had no room left for its record."""

    reason: Reason

    def __init__(self) -> None:
        super().__init__(LIMIT_MESSAGES[Reason.RESPONSE_FULL], reason=Reason.RESPONSE_FULL)


class CoalescedWaitExpired(Refusal):
    """A coalescing follower's deadline came before its leader's record: it
    never reads the database on its own (``docs/cache.md``)."""


# MySQL/MariaDB error numbers, by what they mean for the caller.
_CANNOT_CONNECT = frozenset({2002, 2003, 2005, 1053, 1927, 4031})  # nothing was sent
_TOO_MANY_CONNECTIONS = frozenset({1040, 1203})
_ROLLED_BACK = frozenset({1205, 1213})  # lock wait timeout, deadlock: nothing applied
# Lost mid-statement. A read is safe to repeat; so is a mutation, since each
# carries an idempotency key and its change commits with its outcome: a retry
# finds the outcome if the first attempt committed, and applies it if not.
_LOST_MID_STATEMENT = frozenset({2006, 2013, 2055})


def database_error(exc: DBAPIError) -> Refusal:
    """The refusal a driver error amounts to. Its message names the error
    number and the driver's exception type, never the statement."""
    errno = exc.orig.args[0] if exc.orig is not None and exc.orig.args else None
    detail = f"database error {errno} ({type(exc.orig).__name__})"
    if errno in _TOO_MANY_CONNECTIONS:
        return DatabaseBusy(detail)
    if (
        errno in _CANNOT_CONNECT
        or errno in _ROLLED_BACK
        or errno in _LOST_MID_STATEMENT
        or exc.connection_invalidated
    ):
        return DatabaseUnavailable(detail)
    return DatabaseFailure(detail)


class database_errors:
    """Raise the driver's and the pool's exceptions as refusals. A class
    rather than a generator: every database operation runs inside one."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            return
        if isinstance(exc, PoolTimeout):
            raise PermitUnavailable("no pooled connection in time") from None
        if isinstance(exc, DBAPIError):
            raise database_error(exc) from None
        if isinstance(exc, SQLAlchemyError):
            raise DatabaseFailure(f"store error ({type(exc).__name__})") from None


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the caller is told about a refusal, and what it is counted as."""

    code: StatusCode
    message: str
    retry_after_ms: int = 0
    reason: Reason | None = None
    # The timeout counter's stage, or the failed dependency's counter.
    stage: TimeoutStage | None = None
    dependency: Dependency | None = None


def _revision(exc: Refusal) -> str:
    current = exc.current if isinstance(exc, RevisionMismatch) else None
    if current is None:
        return "the record does not exist at the expected revision"
    return f"the record is at revision {current}"


# Refusal kind -> how it is answered: a status code (for a refusal that names
# no reason: never a retryable one), a Reason (answered with REASON_CODES'
# code), or None (the refusal's own reason, set by the check that refused);
# what the caller reads (None: the refusal's own message, written for the
# caller); and the retry-after (None: the refusal's own, from the rate, ramp
# or queue).
_Row = tuple[StatusCode | Reason | None, str | Callable[[Refusal], str] | None, int | None]
_TABLE: dict[type[Refusal], _Row] = {
    Rejected: (None, None, None),
    AdmissionRefused: (None, None, None),
    PermitUnavailable: (
        Reason.NO_PERMIT,
        "the service is at its database budget",
        RETRY_POOL_BUSY_MS,
    ),
    DatabaseBusy: (
        Reason.DATABASE_BUSY,
        "the database has no connection to spare",
        RETRY_DB_UNAVAILABLE_MS,
    ),
    ConnectRateLimited: (
        Reason.RECONNECTING,
        "the service is reconnecting to the database",
        None,
    ),
    DatabaseUnavailable: (
        Reason.DATABASE_UNAVAILABLE,
        "the database is unavailable",
        RETRY_DB_UNAVAILABLE_MS,
    ),
    TooLittleTime: (StatusCode.DEADLINE_EXCEEDED, "too little time left to run", 0),
    CoalescedWaitExpired: (
        Reason.COALESCING,
        "the record is being read for another request",
        RETRY_COALESCED_MS,
    ),
    StatementTimeout: (StatusCode.DEADLINE_EXCEEDED, "the statement ran out of time", 0),
    RecordMissing: (StatusCode.NOT_FOUND, "no such record", 0),
    RevisionMismatch: (StatusCode.CONFLICT, _revision, 0),
    IdempotencyConflict: (
        StatusCode.CONFLICT,
        "the idempotency key was already used for a different request",
        0,
    ),
    DeleteRaced: (StatusCode.CONFLICT, "the record changed while it was being deleted", 0),
    # Nothing applied: sent again under the same keys, the batch goes through.
    GroupRaced: (
        Reason.RECORDS_CHANGING,
        "the records changed while they were being written",
        RETRY_DB_UNAVAILABLE_MS,
    ),
    DatabaseFailure: (StatusCode.INTERNAL, "internal error", 0),
    ResponseFull: (None, None, 0),
}

# A check's reason -> the code its refusal is answered with.
REASON_CODES: dict[Reason, StatusCode] = {
    Reason.MALFORMED: StatusCode.INVALID_ARGUMENT,
    Reason.UNSIGNED: StatusCode.UNAUTHENTICATED,
    Reason.UNKNOWN_KEY: StatusCode.UNAUTHENTICATED,
    Reason.BAD_SIGNATURE: StatusCode.UNAUTHENTICATED,
    Reason.WRONG_CALLER: StatusCode.UNAUTHENTICATED,
    Reason.CLOCK_SKEW: StatusCode.UNAUTHENTICATED,
    Reason.UNKNOWN_CALLER: StatusCode.PERMISSION_DENIED,
    Reason.OPERATION_DENIED: StatusCode.PERMISSION_DENIED,
    Reason.LANE_DENIED: StatusCode.PERMISSION_DENIED,
    Reason.SCOPE_DENIED: StatusCode.PERMISSION_DENIED,
    # Never answered: the first delivery answers under the request id.
    Reason.REPLAYED: StatusCode.UNAUTHENTICATED,
    Reason.RATE_LIMITED: StatusCode.RESOURCE_EXHAUSTED,
    Reason.CONCURRENCY_LIMITED: StatusCode.RESOURCE_EXHAUSTED,
    Reason.LIMITS_UNAVAILABLE: StatusCode.UNAVAILABLE,
    Reason.QUEUE_FULL: StatusCode.RESOURCE_EXHAUSTED,
    Reason.QUEUE_BYTES: StatusCode.RESOURCE_EXHAUSTED,
    Reason.QUEUE_TOO_LONG: StatusCode.RESOURCE_EXHAUSTED,
    # The client's own (never sent): the code a caller sees is the same.
    Reason.THROTTLED: StatusCode.RESOURCE_EXHAUSTED,
    Reason.RESPONSE_FULL: StatusCode.RESOURCE_EXHAUSTED,
    # On the way to the database (_TABLE).
    Reason.NO_PERMIT: StatusCode.RESOURCE_EXHAUSTED,
    Reason.DATABASE_BUSY: StatusCode.RESOURCE_EXHAUSTED,
    Reason.RECONNECTING: StatusCode.UNAVAILABLE,
    Reason.DATABASE_UNAVAILABLE: StatusCode.UNAVAILABLE,
    Reason.COALESCING: StatusCode.UNAVAILABLE,
    Reason.RECORDS_CHANGING: StatusCode.UNAVAILABLE,
}

_STAGES: dict[type[Refusal], TimeoutStage] = {
    TooLittleTime: TimeoutStage.BEFORE_DATABASE,
    StatementTimeout: TimeoutStage.STATEMENT,
    CoalescedWaitExpired: TimeoutStage.COALESCING,
}
_DEPENDENCIES = (DatabaseBusy, DatabaseUnavailable, DatabaseFailure)

INTERNAL = Verdict(StatusCode.INTERNAL, "internal error")


def verdict(exc: Refusal) -> Verdict:
    """What the caller of a refused request is told."""
    kind = next((k for k in type(exc).__mro__ if k in _TABLE), None)
    if kind is None:
        log.error("no verdict for %s", type(exc).__name__)
        return INTERNAL
    answer, message, retry_after_ms = _TABLE[kind]
    reason = answer if isinstance(answer, Reason) else exc.reason
    if isinstance(answer, StatusCode):
        code = answer
    else:
        code = REASON_CODES[reason] if reason is not None else StatusCode.INTERNAL
    if message is None:
        message = exc.message
    elif callable(message):
        message = message(exc)
    return Verdict(
        code,
        message,
        exc.retry_after_ms if retry_after_ms is None else retry_after_ms,
        reason,
        _STAGES.get(kind),
        Dependency.DATABASE if kind in _DEPENDENCIES else None,
    )
