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
import time
import uuid
from collections.abc import Iterable, Mapping
from typing import TypeVar

from dataservice.auth import sign
from dataservice.callers import CallerKey, load_keyring
from dataservice.client.handle import Handle, now_ms
from dataservice.client.pacer import PACER
from dataservice.client.transport import Transport, refused
from dataservice.codec import request_envelope
from dataservice.config import Config
from dataservice.enums import LaneName, ReadMode
from dataservice.errors import (
    InternalError,
    InvalidArgument,
    ResourceExhausted,
    RetryableError,
)
from dataservice.identifiers import CALLER_RE
from dataservice.limits.admission import AdmissionRefused
from dataservice.proto import pb
from dataservice.refusals import Reason
from dataservice.settings import Settings
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
)

R = TypeVar("R", Record, WriteResult, DeleteResult, Page)


def _expect(result: Result, kind: type[R]) -> R:
    if not isinstance(result, kind):
        raise InternalError(f"the service answered with a {type(result).__name__}")
    return result


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
        if not CALLER_RE.fullmatch(caller):
            raise InvalidArgument(f"caller name is malformed (allowed: {CALLER_RE.pattern})")
        self._key = load_keyring(settings.callers_file).signing_key(caller) if key is None else key
        if self._key.caller != caller:
            raise InvalidArgument("the signing key belongs to another caller")
        self.caller = caller
        self.config = config
        policy = config.callers.get(caller)
        self._rate = None if policy is None else policy.rate
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
        PACER.take(self.caller, None)
        handles = [
            Handle(self._transport, self.caller, env.request_id, deadline) for env in prepared
        ]
        try:
            self._transport.publish_many(
                ((self._sign(env), env.request_id, deadline) for env in prepared),
                lane=LaneName.BATCH,
                caller=self.caller,
            )
        except AdmissionRefused as refusal:
            error = refused(refusal, accepted=tuple(handles[: refusal.sent]))
            if error.reason == Reason.RATE_LIMITED:
                PACER.refused(self.caller, error.retry_after)
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
                if now_ms() + delay_ms >= deadline:
                    raise
                time.sleep(delay_ms / 1000)
                attempt += 1

    def _attempt(self, operation: Operation, deadline: int, idempotency_key: str) -> Result:
        PACER.take(self.caller, self._rate)
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
            except AdmissionRefused as refusal:
                raise refused(refusal) from None
            return Handle(self._transport, self.caller, envelope.request_id, deadline).result()
        except ResourceExhausted as exc:
            if exc.reason == Reason.RATE_LIMITED:
                PACER.refused(self.caller, exc.retry_after)
            raise

    def _sign(self, envelope: pb.RequestEnvelope) -> bytes:
        return sign(envelope.SerializeToString(), self._key)

    def _envelope(
        self, operation: Operation, deadline_ms: int, idempotency_key: str
    ) -> pb.RequestEnvelope:
        return request_envelope(
            self.caller,
            operation,
            request_id=uuid.uuid4().hex,
            deadline_ms=deadline_ms,
            issued_at_ms=now_ms(),
            idempotency_key=idempotency_key,
            limits=self.config.limits,
        )

    def _deadline(self, lane: LaneName, timeout: float | None) -> int:
        lane_config = self.config.lanes[lane]
        if timeout is None:
            budget_ms = lane_config.default_deadline_ms
        elif timeout < 0.001:
            raise InvalidArgument("timeout must be at least 1 ms")
        else:
            budget_ms = min(int(timeout * 1000), lane_config.max_deadline_ms)
        return now_ms() + budget_ms


def _idempotency_key(operation: Operation) -> str:
    """The key a mutation keeps across its attempts; reads and lists have none."""
    if isinstance(operation, WriteOp | DeleteOp):
        return operation.idempotency_key or uuid.uuid4().hex
    return ""
