"""The caller's API: awaited calls on the interactive lane, handles on the batch lane.

Every request is signed with the caller's key (:mod:`dataservice.auth`).
Interactive calls retry a retryable answer (``RESOURCE_EXHAUSTED``,
``UNAVAILABLE``) within their one deadline: at most
``client.retry.max_attempts`` attempts, each wait the answer's retry-after
plus a random share of an exponentially growing cap ("full jitter"), so
callers refused together do not come back together. Every attempt is a new
message with a new request id; a write or delete keeps its idempotency key
across attempts (the client always sets one), so a retry never applies a
change twice. A lane too full to serve the call in time (``queue_full``,
``queue_bytes``, ``queue_too_long``) is not retried: the caller hears at once.
The client's throttle (:mod:`.throttle`) may refuse a call before it is
sent (``throttled``), and decides whether a refused one may try again.
"""

from __future__ import annotations

import builtins
import random
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TypeVar

from dataservice.callers import CallerKey, load_keyring
from dataservice.client.handle import Handle, gather, now_ms
from dataservice.client.publisher import Publisher, mutation_key
from dataservice.client.transport import Transport
from dataservice.config import Config
from dataservice.enums import LaneName, ReadMode
from dataservice.errors import (
    DataServiceError,
    InternalError,
    InvalidArgument,
    RequestError,
    ResourceExhausted,
    RetryableError,
)
from dataservice.identifiers import CALLER_RE
from dataservice.refusals import Reason
from dataservice.settings import Settings
from dataservice.types import (
    DeleteOp,
    DeleteResult,
    ListOp,
    Operation,
    Page,
    ReadMany,
    ReadManyOp,
    ReadOp,
    Record,
    Result,
    WriteOp,
    WriteResult,
)

R = TypeVar("R", Record, WriteResult, DeleteResult, Page, ReadMany)

# Refusals a call does not retry itself: the lane cannot serve it within its
# deadline now (a later attempt would have less time still), or this
# client's throttle says the service is refusing most of what it is sent.
# The caller hears at once, with the retry-after, and decides. (With the
# throttle off, the client retries them as it did before it had one.)
FINAL_REFUSALS = frozenset(
    {Reason.QUEUE_FULL, Reason.QUEUE_BYTES, Reason.QUEUE_TOO_LONG, Reason.THROTTLED}
)


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
        key = load_keyring(settings.callers_file).signing_key(caller) if key is None else key
        if key.caller != caller:
            raise InvalidArgument("the signing key belongs to another caller")
        self.caller = caller
        self.config = config
        transport = Transport(settings, config, caller=caller)
        self._publisher = Publisher(caller, key, transport, config)

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
        self._publisher.transport.close()

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

    def read_many(
        self,
        scope: str,
        ids: Iterable[str | tuple[str, str]],
        *,
        mode: ReadMode = ReadMode.ALLOW_CACHED,
        timeout: float | None = None,
    ) -> builtins.list[Record | RequestError]:
        """Each id's record, or the error reading it alone would have raised
        (``NotFound``, ``PermissionDenied``, ...), in the order given.

        An id is an object id in ``scope``, or a ``(scope, object_id)`` pair.
        Up to ``lanes.interactive.max_ops_per_message`` reads go in one message
        (the cache answers its hits in one round trip, the database its misses
        a ``SELECT`` per permit); more are sent in further messages, one after
        another. A record the answer had no room for (``response_full``) is
        asked for again; a read answered retryably is retried as :meth:`read`
        retries, all within the one deadline. Errors of the whole call (a
        refused publish, the deadline) are raised as :meth:`read` raises them.
        """
        reads = [
            ReadOp(scope, one, mode) if isinstance(one, str) else ReadOp(one[0], one[1], mode)
            for one in ids
        ]
        deadline = self._publisher.deadline(LaneName.INTERACTIVE, timeout)
        most = self.config.lanes.interactive.max_ops_per_message
        results: builtins.list[Record | RequestError | None] = [None] * len(reads)
        todo = builtins.list(range(len(reads)))
        attempt = 1
        retry = self.config.client.retry
        while todo:
            again: builtins.list[int] = []
            wait_s = 0.0
            for start in range(0, len(todo), most):
                chunk = todo[start : start + most]
                operation = ReadManyOp(tuple(reads[i] for i in chunk))
                answer = _expect(self._call(operation, None, deadline), ReadMany)
                for i, one in zip(chunk, answer.results, strict=True):
                    results[i] = one
                    if not isinstance(one, RetryableError):
                        continue
                    if one.reason == Reason.RESPONSE_FULL:
                        again.append(i)
                    elif attempt < retry.max_attempts and one.reason not in FINAL_REFUSALS:
                        again.append(i)
                        wait_s = max(wait_s, one.retry_after)
            todo, attempt = again, attempt + 1
            if todo and wait_s:
                if now_ms() + wait_s * 1000 >= deadline:
                    break
                time.sleep(wait_s)
        return [one for one in results if one is not None]

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
        deadline = self._publisher.deadline(LaneName.BATCH, timeout)
        return self._publisher.send_batch(builtins.list(operations), deadline)

    def results(self, handles: Sequence[Handle]) -> builtins.list[Result | DataServiceError]:
        """Every handle's answer, or the error it raises, in their order, as
        :meth:`Handle.result` would give each; collected in one round trip
        per few hundred answers (a batch's answers come together)."""
        return gather(handles)

    # Internals --------------------------------------------------------------

    def _call(
        self, operation: Operation, timeout: float | None, deadline: int | None = None
    ) -> Result:
        """One interactive call: attempts until an answer, a final error or the deadline."""
        if deadline is None:
            deadline = self._publisher.deadline(LaneName.INTERACTIVE, timeout)
        key = mutation_key(operation)
        retry = self.config.client.retry
        attempt = 1
        while True:
            try:
                return self._attempt(operation, deadline, key)
            except RetryableError as exc:
                throttle = self._publisher.throttle
                final = throttle.config.enabled and exc.reason in FINAL_REFUSALS
                if final or attempt >= retry.max_attempts:
                    raise
                if not throttle.may_retry(LaneName.INTERACTIVE, exc.reason):
                    raise
                cap_ms = min(retry.backoff_max_ms, retry.backoff_base_ms << (attempt - 1))
                delay_ms = exc.retry_after * 1000 + random.uniform(0, cap_ms)
                if now_ms() + delay_ms >= deadline:
                    raise
                time.sleep(delay_ms / 1000)
                attempt += 1

    def _attempt(self, operation: Operation, deadline: int, key: str) -> Result:
        try:
            return self._publisher.send(operation, deadline, key).result()
        except ResourceExhausted as exc:
            self._publisher.held_back(exc)
            raise
