"""The worker side of one request: signed envelope bytes in, encoded answer out.

Nothing here knows about Celery. :meth:`RequestHandler.handle` never raises:
every failure becomes a status code, and internal details stay in the log
(never the payload, never a key, never SQL text) while the caller sees a
short message.

The order is the contract: authenticate and authorise (:mod:`dataservice.auth`,
no I/O), drop a late request, pass the caller's shared limits
(:mod:`dataservice.gate`), and only then take a database permit.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from dataservice import codec
from dataservice.auth import Authenticator, Reason, Rejected
from dataservice.config import Config, LaneConfig, LaneName, OperationClass
from dataservice.durations import RecentDurations
from dataservice.errors import InvalidArgument, NotFound, RequestError, error_for
from dataservice.gate import Gate, Slot
from dataservice.metrics import (
    DEPENDENCY_FAILURES,
    REJECTIONS,
    REQUESTS,
    TIMEOUTS,
    Dependency,
    Stage,
)
from dataservice.permits import LanePermits, PermitUnavailable
from dataservice.proto import pb
from dataservice.status import StatusCode
from dataservice.store import (
    Budget,
    DeleteRaced,
    Idempotency,
    IdempotencyConflict,
    RecordStore,
    RevisionMismatch,
    StoredRecord,
)
from dataservice.store.connections import (
    MIN_STATEMENT_MS,
    ConnectRateLimited,
    StatementTimeout,
)

log = logging.getLogger(__name__)

_ROUTINE_REFUSALS = frozenset({Reason.RATE_LIMITED, Reason.CONCURRENCY_LIMITED})
RETRY_POOL_BUSY_MS = 50
RETRY_DB_UNAVAILABLE_MS = 250
# Per-record framing inside a ListRecordsResponse, on top of id and payload.
_RECORD_OVERHEAD = 32
# The envelope, status and cursor around a list page.
_PAGE_OVERHEAD = 512


@dataclass(frozen=True, slots=True)
class Reply:
    """An encoded ``ResponseEnvelope``, for whom, and until when (Unix ms) it is
    of use. ``caller`` is empty when the message named nobody to answer."""

    caller: str
    body: bytes
    expires_at_ms: int
    code: StatusCode
    # The caller's in-flight slot, held until the answer is stored: give it
    # back with the answer (ResultStore) or with RequestHandler.release.
    slot: Slot | None = None


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
        lane: LaneName,
        store: RecordStore,
        permits: LanePermits,
        authenticator: Authenticator,
        gate: Gate,
        clock: Callable[[], int] = _now_ms,
    ) -> None:
        self.config = config
        self.lane_name = lane
        self.lane: LaneConfig = config.lanes[lane]
        self.store = store
        self.permits = permits
        self.authenticator = authenticator
        self.gate = gate
        self.durations = RecentDurations()
        self._clock = clock
        self._capped = lane is LaneName.INTERACTIVE

    def internal_error(self, caller: str, task_id: str, deadline_ms: int | None) -> Reply:
        now = self._clock()
        longest = now + self.lane.max_deadline_ms
        expires = min(max(deadline_ms or now, now), longest) + self.config.results.grace_ms
        error = error_for(StatusCode.INTERNAL, "internal error")
        return self._error(caller, task_id, error, expires)

    def handle(self, task_id: str, body: object, deadline_ms: int | None = None) -> Reply | None:
        """Answer one request; None when its caller has already given up."""
        now = self._clock()
        grace = self.config.results.grace_ms
        # Until the envelope is verified, the message's deadline header bounds
        # how long an error answer is worth keeping; the header is not signed,
        # so never beyond the lane's longest deadline.
        longest = now + self.lane.max_deadline_ms
        fallback = min(max(deadline_ms or longest, now), longest) + grace
        try:
            envelope = self.authenticator.open(task_id, body, now)
        except Rejected as rejected:
            return self._rejected(task_id, rejected, fallback)
        caller = envelope.caller
        remaining = envelope.deadline_unix_ms - now
        if remaining <= 0:
            TIMEOUTS.labels(self.lane_name.value, Stage.QUEUE.value).inc()
            log.info("dropped request %s: deadline passed %d ms ago", task_id, -remaining)
            return None
        # Absolute: time spent serving the request does not extend the answer's life.
        ttl = envelope.deadline_unix_ms + grace
        try:
            request = self.authenticator.authorise(envelope)
        except Rejected as rejected:
            return self._rejected(task_id, rejected, ttl)
        try:
            slot = self.gate.enter(
                request.policy,
                caller,
                task_id,
                envelope.deadline_unix_ms,
                now,
                capped=self._capped,
            )
        except Rejected as rejected:
            if rejected.reason is Reason.REPLAYED:
                # The id belongs to the first delivery, which answers under it; an
                # answer here could reach its caller first (a redelivery, say).
                REJECTIONS.labels(self.lane_name.value, rejected.reason.value).inc()
                log.info("dropped request %s: replayed", task_id)
                return None
            return self._rejected(task_id, rejected, ttl)
        try:
            reply = self._serve(task_id, envelope, request.operation, ttl)
        except Exception as exc:
            # A bug, not the request's fault: answer rather than leave the caller waiting.
            log.error("unexpected %s on %s", type(exc).__name__, task_id, exc_info=True)
            reply = self._error(
                caller, task_id, error_for(StatusCode.INTERNAL, "internal error"), ttl
            )
        except BaseException:
            self.gate.leave(slot)
            raise
        REQUESTS.labels(self.lane_name.value, request.operation, reply.code.name).inc()
        return dataclasses.replace(reply, slot=slot)

    def release(self, reply: Reply | None, *, released_in_redis: bool = False) -> None:
        """Give back the in-flight slot a reply holds (its Redis part, unless
        that went back with the answer)."""
        if reply is not None and reply.slot is not None:
            self.gate.leave(reply.slot, released_in_redis=released_in_redis)

    def _rejected(self, task_id: str, rejected: Rejected, expires_at_ms: int) -> Reply:
        REJECTIONS.labels(self.lane_name.value, rejected.reason.value).inc()
        # Limits refuse by the hundred under a flood; the counter tells the story.
        level = logging.DEBUG if rejected.reason in _ROUTINE_REFUSALS else logging.INFO
        log.log(level, "rejected request %s: %s", task_id, rejected.reason.value)
        return self._error(
            rejected.caller,
            task_id,
            rejected.error,
            expires_at_ms,
            rejected.retry_after_ms,
            rejected.reason.value,
        )

    def _serve(self, task_id: str, envelope: pb.RequestEnvelope, operation: str, ttl: int) -> Reply:
        caller = envelope.caller
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
            if error.code is StatusCode.DEADLINE_EXCEEDED:
                stage = (
                    Stage.STATEMENT if isinstance(exc, StatementTimeout) else Stage.BEFORE_DATABASE
                )
                TIMEOUTS.labels(self.lane_name.value, stage.value).inc()
            return self._error(caller, task_id, error, ttl, retry_after_ms)
        except DBAPIError as exc:
            errno = exc.orig.args[0] if exc.orig is not None and exc.orig.args else None
            log.warning("database error %s on %s: %s", errno, task_id, type(exc.orig).__name__)
            DEPENDENCY_FAILURES.labels(self.lane_name.value, Dependency.DATABASE.value).inc()
            mutation = operation in codec.MUTATIONS
            error, retry_after_ms = _database_error(errno, exc.connection_invalidated, mutation)
            return self._error(caller, task_id, error, ttl, retry_after_ms)
        except SQLAlchemyError as exc:
            log.error("store error on %s: %s", task_id, type(exc).__name__)
            DEPENDENCY_FAILURES.labels(self.lane_name.value, Dependency.DATABASE.value).inc()
            error = error_for(StatusCode.INTERNAL, "internal error")
            return self._error(caller, task_id, error, ttl)
        response.request_id = task_id
        response.status.code = pb.STATUS_CODE_OK
        return Reply(caller, response.SerializeToString(), ttl, StatusCode.OK)

    def _error(
        self,
        caller: str,
        task_id: str,
        error: RequestError,
        expires_at_ms: int,
        retry_after_ms: int = 0,
        reason: str = "",
    ) -> Reply:
        envelope = codec.error_response(task_id, error.code, error.message, retry_after_ms, reason)
        return Reply(caller, envelope.SerializeToString(), expires_at_ms, error.code)

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
            try:
                outcome = self.store.write(
                    write.scope,
                    write.object_id,
                    write.payload,
                    budget,
                    idempotency=_idempotency(envelope, operation),
                    expected_revision=write.expected_revision,
                )
            except (RevisionMismatch, IdempotencyConflict) as exc:
                raise _conflict(exc) from None
            return pb.ResponseEnvelope(
                write=pb.WriteRecordResponse(
                    object_id=write.object_id, revision=outcome.revision, created=outcome.created
                )
            )
        if operation == "delete":
            delete = envelope.delete
            try:
                revision = self.store.delete(
                    delete.scope,
                    delete.object_id,
                    budget,
                    idempotency=_idempotency(envelope, operation),
                    expected_revision=delete.expected_revision,
                )
            except DeleteRaced:
                raise error_for(
                    StatusCode.CONFLICT, "the record changed while it was being deleted"
                ) from None
            except (RevisionMismatch, IdempotencyConflict) as exc:
                raise _conflict(exc) from None
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


def _idempotency(envelope: pb.RequestEnvelope, operation: str) -> Idempotency:
    """The key a mutation's outcome is recorded under, and what it was asked:
    the operation's own fields, so a retry matches whatever else changed."""
    request = getattr(envelope, operation)
    fingerprint = hashlib.sha256(
        operation.encode() + b"\0" + request.SerializeToString(deterministic=True)
    ).digest()
    return Idempotency(envelope.caller, envelope.idempotency_key, fingerprint)


def _conflict(exc: RevisionMismatch | IdempotencyConflict) -> RequestError:
    if isinstance(exc, IdempotencyConflict):
        return error_for(
            StatusCode.CONFLICT, "the idempotency key was already used for a different request"
        )
    if exc.current is None:
        return error_for(StatusCode.CONFLICT, "the record does not exist at the expected revision")
    return error_for(StatusCode.CONFLICT, f"the record is at revision {exc.current}")


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
