"""The caller's API: awaited calls on the interactive lane, handles on the batch lane.

Every request is signed with the caller's key (:mod:`dataservice.auth`).
Interactive calls retry a retryable answer (``RESOURCE_EXHAUSTED``,
``UNAVAILABLE``) within their one deadline: at most
``client.retry.max_attempts`` attempts, each wait the answer's retry-after
plus a random share of an exponentially growing cap ("full jitter"), so
callers refused together do not come back together. Every attempt is a new
message with a new request id; a write or delete keeps its idempotency key
across attempts (the client always sets one), so a retry never applies a
change twice.
"""

from __future__ import annotations

import builtins
import random
import threading
import time
import uuid
from collections.abc import Iterable, Mapping
from typing import TypeVar

from google.protobuf.message import DecodeError

from dataservice import codec
from dataservice.auth import Reason, sign
from dataservice.callers import CallerKey, load_keyring
from dataservice.config import CallerPolicy, Config, LaneName, Settings
from dataservice.errors import (
    DeadlineExceeded,
    InternalError,
    InvalidArgument,
    ResourceExhausted,
    ResultNotReady,
    RetryableError,
    error_for,
)
from dataservice.proto import pb
from dataservice.status import ReadMode, StatusCode
from dataservice.transport import Refused, Transport
from dataservice.types import (
    DeleteOp,
    DeleteResult,
    ListOp,
    Operation,
    Page,
    ReadOp,
    Record,
    Result,
    WriteOp,
    WriteResult,
    from_unix_ms,
)

R = TypeVar("R", Record, WriteResult, DeleteResult, Page)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _record(message: pb.Record) -> Record:
    return Record(
        object_id=message.object_id,
        revision=message.revision,
        payload=message.payload,
        updated_at=from_unix_ms(message.updated_at_unix_ms),
    )


def decode_response(body: bytes, request_id: str) -> Result:
    """The result in an encoded ``ResponseEnvelope``, or its typed error."""
    response = pb.ResponseEnvelope()
    try:
        response.ParseFromString(body)
    except DecodeError:
        raise InternalError(
            "the service sent an unreadable answer", request_id=request_id
        ) from None
    code = response.status.code
    if code != pb.STATUS_CODE_OK:
        status = StatusCode(code) if code in StatusCode._value2member_map_ else StatusCode.INTERNAL
        raise error_for(
            status,
            response.status.message,
            request_id=request_id,
            retry_after=response.status.retry_after_ms / 1000,
            reason=response.status.reason,
        )
    kind = response.WhichOneof("result")
    if kind == "read":
        return _record(response.read.record)
    if kind == "write":
        w = response.write
        return WriteResult(object_id=w.object_id, revision=w.revision, created=w.created)
    if kind == "delete":
        return DeleteResult(object_id=response.delete.object_id, revision=response.delete.revision)
    if kind == "list":
        page = response.list
        return Page(
            records=tuple(_record(r) for r in page.records), next_cursor=page.next_cursor or None
        )
    raise InternalError("the service sent an answer without a result", request_id=request_id)


class _Pacer:
    """Keeps a caller's requests within its rate in this process, before they are sent.

    Two things, shared by every client of a caller in the process:

    - the caller's own rate and burst from ``queues.yml`` (the same GCRA the
      service applies across all its callers' processes), so one process alone
      never sends more than the service would accept;
    - after the service refused the caller for its rate (several processes
      together were over it), nothing until that refusal's retry-after.

    A request held back is refused here with ``ResourceExhausted`` (reason
    ``rate_limited``), as the service would have, without being sent: a caller
    far above its rate costs the service almost nothing.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tat: dict[str, float] = {}
        self._until: dict[str, float] = {}

    def take(self, caller: str, policy: CallerPolicy | None) -> None:
        now = time.monotonic()
        with self._lock:
            wait = self._until.get(caller, 0.0) - now
            if wait <= 0 and policy is not None:
                interval = 1 / policy.rate_per_s
                tat = max(self._tat.get(caller, now), now)
                wait = tat + interval - policy.burst * interval - now
                if wait <= 0:
                    self._tat[caller] = tat + interval
        if wait > 0:
            raise ResourceExhausted(
                "the caller is over its rate; not sent",
                retry_after=wait,
                reason=Reason.RATE_LIMITED.value,
            )

    def refused(self, caller: str, retry_after: float) -> None:
        until = time.monotonic() + retry_after
        with self._lock:
            if until > self._until.get(caller, 0.0):
                self._until[caller] = until


_PACER = _Pacer()


def _expect(result: Result, kind: type[R]) -> R:
    if not isinstance(result, kind):
        raise InternalError(f"the service answered with a {type(result).__name__}")
    return result


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
        return self._result is not None or self._transport.results.pending(
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
        remaining = (self.deadline_ms - _now_ms()) / 1000
        wait = remaining if timeout is None else min(timeout, remaining)
        body = self._transport.results.wait(self.caller, self.request_id, wait)
        if body is None:
            if timeout is not None and timeout < remaining:
                raise ResultNotReady(f"no answer to {self.request_id} within {timeout} s")
            raise DeadlineExceeded("no answer before the deadline", request_id=self.request_id)
        self._result = decode_response(body, self.request_id)
        return self._result


class Client:
    """A caller of the data service.

    ``read``, ``write``, ``delete`` and ``list`` run on the interactive lane and
    wait for the answer; ``timeout`` (seconds) becomes the request's deadline,
    capped at the lane's maximum. ``submit`` and ``submit_many`` enqueue on the
    batch lane and return :class:`Handle` objects.
    """

    def __init__(
        self, caller: str, settings: Settings, config: Config, *, key: CallerKey | None = None
    ) -> None:
        """``key`` signs the requests; by default, the caller's first key in the
        callers file (``DATASERVICE_CALLERS_FILE``)."""
        if not codec.CALLER_RE.fullmatch(caller):
            raise InvalidArgument(f"caller name is malformed (allowed: {codec.CALLER_RE.pattern})")
        self._key = load_keyring(settings.callers_file).signing_key(caller) if key is None else key
        if self._key.caller != caller:
            raise InvalidArgument("the signing key belongs to another caller")
        self.caller = caller
        self.config = config
        self._policy = config.callers.get(caller)
        self._transport = Transport(settings, config)

    @classmethod
    def from_env(cls, caller: str, environ: Mapping[str, str] | None = None) -> Client:
        """A client configured from ``DATASERVICE_*`` variables and ``queues.yml``."""
        settings = Settings.from_env(environ)
        return cls(caller, settings, settings.load())

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._transport.close()

    # Interactive lane -------------------------------------------------------

    def read(
        self,
        scope: str,
        object_id: str,
        *,
        mode: ReadMode = ReadMode.ALLOW_CACHED,
        timeout: float | None = None,
    ) -> Record:
        return _expect(self._call(ReadOp(scope, object_id, mode), timeout), Record)

    def write(
        self,
        scope: str,
        object_id: str,
        payload: bytes,
        *,
        idempotency_key: str | None = None,
        expected_revision: int = 0,
        timeout: float | None = None,
    ) -> WriteResult:
        operation = WriteOp(scope, object_id, payload, idempotency_key, expected_revision)
        return _expect(self._call(operation, timeout), WriteResult)

    def delete(
        self,
        scope: str,
        object_id: str,
        *,
        idempotency_key: str | None = None,
        expected_revision: int = 0,
        timeout: float | None = None,
    ) -> DeleteResult:
        operation = DeleteOp(scope, object_id, idempotency_key, expected_revision)
        return _expect(self._call(operation, timeout), DeleteResult)

    def list(
        self,
        scope: str,
        *,
        page_size: int = 0,
        cursor: str | None = None,
        timeout: float | None = None,
    ) -> Page:
        return _expect(self._call(ListOp(scope, page_size, cursor), timeout), Page)

    # Batch lane -------------------------------------------------------------

    def submit(self, operation: Operation, *, timeout: float | None = None) -> Handle:
        return self.submit_many([operation], timeout=timeout)[0]

    def submit_many(
        self, operations: Iterable[Operation], *, timeout: float | None = None
    ) -> builtins.list[Handle]:
        """Enqueue every operation on the batch lane in one broker session.

        All are validated before any is sent: one bad operation enqueues none.
        """
        deadline = self._deadline(LaneName.BATCH, timeout)
        prepared = [self._envelope(op, deadline, _idempotency_key(op)) for op in operations]
        # Admission paces a batch at publish (and says how many it took); here
        # only a standing rate refusal holds it back.
        _PACER.take(self.caller, None)
        handles = [
            Handle(self._transport, self.caller, env.request_id, deadline) for env in prepared
        ]
        try:
            self._transport.publish_many(
                ((self._sign(env), env.request_id, deadline) for env in prepared),
                lane=LaneName.BATCH,
                caller=self.caller,
            )
        except Refused as refused:
            error = refused.error(accepted=tuple(handles[: refused.sent]))
            if error.reason == Reason.RATE_LIMITED.value:
                _PACER.refused(self.caller, error.retry_after)
            raise error from None
        return handles

    # Internals --------------------------------------------------------------

    def _call(self, operation: Operation, timeout: float | None) -> Result:
        deadline = self._deadline(LaneName.INTERACTIVE, timeout)
        key = _idempotency_key(operation)
        retry = self.config.client.retry
        attempt = 1
        while True:
            try:
                return self._attempt(operation, deadline, key)
            except RetryableError as exc:
                if attempt >= retry.max_attempts:
                    raise
                cap_ms = min(retry.backoff_max_ms, retry.backoff_base_ms << (attempt - 1))
                delay_ms = exc.retry_after * 1000 + random.uniform(0, cap_ms)
                if _now_ms() + delay_ms >= deadline:
                    raise
                time.sleep(delay_ms / 1000)
                attempt += 1

    def _attempt(self, operation: Operation, deadline: int, idempotency_key: str) -> Result:
        _PACER.take(self.caller, self._policy)
        envelope = self._envelope(operation, deadline, idempotency_key)
        try:
            try:
                self._transport.publish(
                    self._sign(envelope),
                    request_id=envelope.request_id,
                    lane=LaneName.INTERACTIVE,
                    deadline_ms=deadline,
                    caller=self.caller,
                )
            except Refused as refused:
                raise refused.error() from None
            return Handle(self._transport, self.caller, envelope.request_id, deadline).result()
        except ResourceExhausted as exc:
            if exc.reason == Reason.RATE_LIMITED.value:
                _PACER.refused(self.caller, exc.retry_after)
            raise

    def _sign(self, envelope: pb.RequestEnvelope) -> bytes:
        return sign(envelope.SerializeToString(), self._key)

    def _deadline(self, lane: LaneName, timeout: float | None) -> int:
        lane_config = self.config.lanes[lane]
        if timeout is None:
            budget_ms = lane_config.default_deadline_ms
        elif timeout < 0.001:
            raise InvalidArgument("timeout must be at least 1 ms")
        else:
            budget_ms = min(int(timeout * 1000), lane_config.max_deadline_ms)
        return _now_ms() + budget_ms

    def _envelope(
        self, operation: Operation, deadline_ms: int, idempotency_key: str
    ) -> pb.RequestEnvelope:
        envelope = pb.RequestEnvelope(
            caller=self.caller,
            request_id=uuid.uuid4().hex,
            deadline_unix_ms=deadline_ms,
            issued_at_unix_ms=_now_ms(),
            idempotency_key=idempotency_key,
        )
        if isinstance(operation, ReadOp):
            envelope.read.CopyFrom(
                pb.ReadRecordRequest(
                    scope=operation.scope,
                    object_id=operation.object_id,
                    mode=int(operation.mode),  # type: ignore[arg-type]
                )
            )
        elif isinstance(operation, WriteOp):
            if operation.expected_revision < 0:
                raise InvalidArgument("expected_revision must not be negative")
            envelope.write.CopyFrom(
                pb.WriteRecordRequest(
                    scope=operation.scope,
                    object_id=operation.object_id,
                    payload=operation.payload,
                    expected_revision=operation.expected_revision,
                )
            )
        elif isinstance(operation, DeleteOp):
            if operation.expected_revision < 0:
                raise InvalidArgument("expected_revision must not be negative")
            envelope.delete.CopyFrom(
                pb.DeleteRecordRequest(
                    scope=operation.scope,
                    object_id=operation.object_id,
                    expected_revision=operation.expected_revision,
                )
            )
        elif isinstance(operation, ListOp):
            if operation.page_size < 0:
                raise InvalidArgument("page_size must not be negative")
            envelope.list.CopyFrom(
                pb.ListRecordsRequest(
                    scope=operation.scope,
                    page_size=operation.page_size,
                    cursor=operation.cursor or "",
                )
            )
        else:
            raise InvalidArgument(f"unknown operation type {type(operation).__name__}")
        # Fail fast, before anything is sent, with the same rules the worker applies.
        codec.validate_request(envelope, self.config.limits)
        return envelope


def _idempotency_key(operation: Operation) -> str:
    """The key a mutation keeps across its attempts; reads and lists have none."""
    if isinstance(operation, WriteOp | DeleteOp):
        return operation.idempotency_key or uuid.uuid4().hex
    return ""
