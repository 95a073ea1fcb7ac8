"""The worker side of one request: envelope bytes in, encoded answer out.

Nothing here knows about Celery. :meth:`RequestHandler.handle` never raises:
every failure becomes a status code, and internal details stay in the log
(never the payload, never SQL text) while the caller sees a short message.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from dataservice import codec
from dataservice.config import Config, LaneConfig, OperationClass
from dataservice.durations import RecentDurations
from dataservice.errors import InvalidArgument, NotFound, RequestError, error_for
from dataservice.permits import LanePermits, PermitUnavailable
from dataservice.proto import pb
from dataservice.status import StatusCode
from dataservice.store.connections import (
    MIN_STATEMENT_MS,
    ConnectRateLimited,
    StatementTimeout,
)
from dataservice.store.records import (
    Budget,
    DeleteRaced,
    RecordStore,
    StoredRecord,
)

log = logging.getLogger(__name__)

# A caller's clock may run ahead of ours; deadlines further out than the lane
# maximum plus this are absurd rather than skewed.
CLOCK_SKEW_MS = 5_000
RETRY_POOL_BUSY_MS = 50
RETRY_DB_UNAVAILABLE_MS = 250
# Per-record framing inside a ListRecordsResponse, on top of id and payload.
_RECORD_OVERHEAD = 32
# The envelope, status and cursor around a list page.
_PAGE_OVERHEAD = 512


@dataclass(frozen=True, slots=True)
class Reply:
    """An encoded ``ResponseEnvelope`` and until when (Unix ms) its caller can use it."""

    body: bytes
    expires_at_ms: int
    code: StatusCode


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _record(stored: StoredRecord) -> pb.Record:
    return pb.Record(
        object_id=stored.object_id,
        revision=stored.revision,
        payload=stored.payload,
        updated_at_unix_ms=int(stored.updated_at.timestamp() * 1000),
    )


class RequestHandler:
    def __init__(
        self,
        config: Config,
        lane: LaneConfig,
        store: RecordStore,
        permits: LanePermits,
        clock: Callable[[], int] = _now_ms,
    ) -> None:
        self.config = config
        self.lane = lane
        self.store = store
        self.permits = permits
        self.durations = RecentDurations()
        self._clock = clock

    def internal_error(self, task_id: str, deadline_ms: int | None) -> Reply:
        now = self._clock()
        expires = max(deadline_ms or now, now) + self.config.results.grace_ms
        return self._error(task_id, error_for(StatusCode.INTERNAL, "internal error"), expires)

    def handle(self, task_id: str, body: object, deadline_ms: int | None = None) -> Reply | None:
        """Answer one request; None when its caller has already given up."""
        now = self._clock()
        grace = self.config.results.grace_ms
        # Until the envelope is decoded, the message's deadline header (or the
        # lane maximum) bounds how long an error answer is worth keeping.
        fallback = max(deadline_ms or now + self.lane.max_deadline_ms, now) + grace
        try:
            envelope = codec.decode_request(body, self.config.limits)
            if envelope.request_id != task_id:
                raise InvalidArgument("request_id does not match the message id")
        except InvalidArgument as exc:
            log.info("rejected request %s: %s", task_id, exc.message)
            return self._error(task_id, exc, fallback)
        remaining = envelope.deadline_unix_ms - now
        if remaining <= 0:
            log.info("dropped request %s: deadline passed %d ms ago", task_id, -remaining)
            return None
        # Absolute: time spent serving the request does not extend the answer's life.
        ttl = envelope.deadline_unix_ms + grace
        if remaining > self.lane.max_deadline_ms + CLOCK_SKEW_MS:
            error: RequestError = InvalidArgument(
                f"deadline is {remaining} ms away; this lane allows {self.lane.max_deadline_ms} ms"
            )
            return self._error(task_id, error, now + grace)
        try:
            response = self._with_permit(envelope)
        except (
            RequestError,
            PermitUnavailable,
            PoolTimeout,
            StatementTimeout,
            ConnectRateLimited,
        ) as exc:
            error, retry_after_ms = _refusal(exc)
            return self._error(task_id, error, ttl, retry_after_ms)
        except DBAPIError as exc:
            errno = exc.orig.args[0] if exc.orig is not None and exc.orig.args else None
            log.warning("database error %s on %s: %s", errno, task_id, type(exc.orig).__name__)
            mutation = envelope.WhichOneof("operation") in codec.MUTATIONS
            error, retry_after_ms = _database_error(errno, exc.connection_invalidated, mutation)
            return self._error(task_id, error, ttl, retry_after_ms)
        except SQLAlchemyError as exc:
            log.error("store error on %s: %s", task_id, type(exc).__name__)
            return self._error(task_id, error_for(StatusCode.INTERNAL, "internal error"), ttl)
        response.request_id = task_id
        response.status.code = pb.STATUS_CODE_OK
        return Reply(response.SerializeToString(), ttl, StatusCode.OK)

    def _error(
        self, task_id: str, error: RequestError, expires_at_ms: int, retry_after_ms: int = 0
    ) -> Reply:
        envelope = codec.error_response(task_id, error.code, error.message, retry_after_ms)
        return Reply(envelope.SerializeToString(), expires_at_ms, error.code)

    def _with_permit(self, envelope: pb.RequestEnvelope) -> pb.ResponseEnvelope:
        """Run the operation under a permit, with the time the request has left.

        The permit wait is bounded by the pool wait and by the deadline, less
        what the operation class has recently needed in the database (its p90,
        at least ``MIN_STATEMENT_MS``); a request that cannot have that much is
        answered DEADLINE_EXCEEDED before any SQL. Each statement's timeout is
        what is left when it is sent.
        """
        operation = envelope.WhichOneof("operation")
        if operation is None:  # the codec rejects this; kept for the type checker
            raise InvalidArgument("unknown or missing operation")
        op_class = OPERATION_CLASSES[operation]
        # What the operation usually needs, so that a request that would only
        # run into its statement timeout does not take the database's time.
        needed = max(MIN_STATEMENT_MS, self.durations.p90(op_class))
        left = envelope.deadline_unix_ms - self._clock() - needed
        wait_ms = min(self.config.database.pool_timeout_ms, left)
        if wait_ms <= 0:
            raise error_for(StatusCode.DEADLINE_EXCEEDED, "too little time left to run")
        with self.permits.acquire(op_class, wait_ms / 1000) as permit:
            started = time.monotonic()
            if envelope.deadline_unix_ms - self._clock() < needed:
                raise error_for(StatusCode.DEADLINE_EXCEEDED, "too little time left to run")
            # Each statement's timeout is what is left when it is sent.
            response = self._dispatch(
                envelope, operation, Budget(permit, envelope.deadline_unix_ms)
            )
            self.durations.record(op_class, (time.monotonic() - started) * 1000)
            return response

    def _dispatch(
        self, envelope: pb.RequestEnvelope, operation: str, budget: Budget
    ) -> pb.ResponseEnvelope:
        if operation == "read":
            read = envelope.read
            stored = self.store.read(read.scope, read.object_id, budget)
            if stored is None:
                raise NotFound("no such record")
            return pb.ResponseEnvelope(read=pb.ReadRecordResponse(record=_record(stored)))
        if operation == "write":
            write = envelope.write
            outcome = self.store.write(write.scope, write.object_id, write.payload, budget)
            return pb.ResponseEnvelope(
                write=pb.WriteRecordResponse(
                    object_id=write.object_id, revision=outcome.revision, created=outcome.created
                )
            )
        if operation == "delete":
            delete = envelope.delete
            try:
                revision = self.store.delete(delete.scope, delete.object_id, budget)
            except DeleteRaced:
                raise error_for(
                    StatusCode.CONFLICT, "the record changed while it was being deleted"
                ) from None
            if revision is None:
                raise NotFound("no such record")
            return pb.ResponseEnvelope(
                delete=pb.DeleteRecordResponse(object_id=delete.object_id, revision=revision)
            )
        return pb.ResponseEnvelope(list=self._list(envelope.list, budget))

    def _list(self, request: pb.ListRecordsRequest, budget: Budget) -> pb.ListRecordsResponse:
        limits = self.config.limits
        size = codec.page_size(request, limits)
        after = codec.decode_cursor(request.cursor, request.scope) if request.cursor else ""
        # One extra row tells whether another page follows.
        rows = self.store.list(request.scope, after, size + 1, budget)
        response = pb.ListRecordsResponse()
        room = limits.max_response_bytes - _PAGE_OVERHEAD
        for stored in rows[:size]:
            cost = len(stored.payload) + len(stored.object_id) + _RECORD_OVERHEAD
            if response.records and cost > room:
                break
            room -= cost
            response.records.append(_record(stored))
        if len(response.records) < len(rows):
            response.next_cursor = codec.encode_cursor(
                request.scope, response.records[-1].object_id
            )
        return response


OPERATION_CLASSES = {
    "read": OperationClass.POINT_READ,
    "write": OperationClass.POINT_WRITE,
    # Its statements run one after another, so one permit covers them.
    "delete": OperationClass.POINT_WRITE,
    "list": OperationClass.BOUNDED_LIST,
}


def _refusal(
    exc: RequestError | PermitUnavailable | PoolTimeout | StatementTimeout | ConnectRateLimited,
) -> tuple[RequestError, int]:
    """The caller's error, and its retry-after in ms, for a refusal or a timeout."""
    if isinstance(exc, RequestError):
        return exc, 0
    if isinstance(exc, PermitUnavailable | PoolTimeout):
        busy = error_for(StatusCode.RESOURCE_EXHAUSTED, "the service is at its database budget")
        return busy, RETRY_POOL_BUSY_MS
    if isinstance(exc, StatementTimeout):
        return error_for(StatusCode.DEADLINE_EXCEEDED, "the statement ran out of time"), 0
    ramp = error_for(StatusCode.UNAVAILABLE, "the service is reconnecting to the database")
    return ramp, max(1, int(exc.retry_after * 1000))


# MySQL/MariaDB error numbers, by what they mean for the caller.
_CANNOT_CONNECT = frozenset({2002, 2003, 2005, 1053, 1927, 4031})  # nothing was sent
_TOO_MANY_CONNECTIONS = frozenset({1040, 1203})
_ROLLED_BACK = frozenset({1205, 1213})  # lock wait timeout, deadlock: nothing applied
_LOST_MID_STATEMENT = frozenset({2006, 2013, 2055})


def _database_error(
    errno: object, connection_lost: bool, mutation: bool
) -> tuple[RequestError, int]:
    """The caller's error for a database failure: retryable only when retrying is safe."""
    if errno in _TOO_MANY_CONNECTIONS:
        busy = error_for(StatusCode.RESOURCE_EXHAUSTED, "the database has no connection to spare")
        return busy, RETRY_DB_UNAVAILABLE_MS
    if errno in _CANNOT_CONNECT or errno in _ROLLED_BACK:
        return error_for(StatusCode.UNAVAILABLE, "the database is unavailable"), (
            RETRY_DB_UNAVAILABLE_MS
        )
    if connection_lost or errno in _LOST_MID_STATEMENT:
        if mutation:
            # The change may or may not have been applied: not safe to retry blindly.
            lost = "the database connection was lost; the outcome is unknown"
            return error_for(StatusCode.DEADLINE_EXCEEDED, lost), 0
        return error_for(StatusCode.UNAVAILABLE, "the database is unavailable"), (
            RETRY_DB_UNAVAILABLE_MS
        )
    return error_for(StatusCode.INTERNAL, "internal error"), 0
