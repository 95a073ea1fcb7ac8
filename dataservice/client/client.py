"""The caller's API, synchronous: awaited calls on the interactive lane,
handles on the batch lane. Its threads share one reply channel (one reader
thread, one connection) and one broker connection, however many call at once.

Every request is signed with the caller's key (:mod:`dataservice.security.auth`); how
calls retry is :mod:`.base`'s, shared with :class:`~.async_client.AsyncClient`.
"""

from __future__ import annotations

import builtins
import functools
import time
from collections.abc import Iterable, Mapping, Sequence

from dataservice.client.base import BaseClient, expect, signing_key
from dataservice.client.handle import Handle, gather
from dataservice.client.publisher import Outgoing, Publisher, mutation_key
from dataservice.client.transport import Transport
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.enums import LaneName, ReadMode
from dataservice.errors import DataServiceError, RequestError, ResourceExhausted, RetryableError
from dataservice.limits.admission import AdmissionRefused
from dataservice.security.callers import CallerKey
from dataservice.types import (
    DeleteOp,
    DeleteResult,
    ListOp,
    Operation,
    Page,
    ReadMany,
    ReadOp,
    Record,
    Result,
    WriteOp,
    WriteResult,
)


class Client(BaseClient):
    """A caller of the data service.

    ``read``, ``write``, ``delete`` and ``list`` run on the interactive lane and
    wait for the answer; ``timeout`` (seconds) becomes the request's deadline,
    capped at the lane's maximum. ``submit`` and ``submit_many`` enqueue on the
    batch lane and return :class:`Handle` objects. Safe to share between threads.
    """

    def __init__(
        self, caller: str, settings: Settings, config: Config, *, key: CallerKey | None = None
    ) -> None:
        """``key`` signs the requests; by default, the caller's first key in the
        callers file (``DATASERVICE_CALLERS_FILE``)."""
        key = signing_key(caller, settings, key)
        self.caller = caller
        self.config = config
        self._transport = Transport(settings, config, caller=caller)
        self._publisher = Publisher(caller, key, config, self._transport.replies.channel)
        self._make = functools.partial(Handle, self._transport, caller)

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
        return expect(self._call(ReadOp(scope, object_id, mode), timeout), Record)

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
        plan = self._read_many_plan(scope, ids, mode)
        deadline = self._publisher.deadline(LaneName.INTERACTIVE, timeout)
        while True:
            for chunk, operation in plan.messages():
                plan.took(chunk, expect(self._call(operation, None, deadline), ReadMany))
            wait_s = plan.next_round(deadline)
            if wait_s is None:
                return plan.results()
            time.sleep(wait_s)

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
        return expect(self._call(operation, timeout), WriteResult)

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
        return expect(self._call(operation, timeout), DeleteResult)

    def list(
        self,
        scope: str,
        *,
        page_size: int = 0,
        cursor: str | None = None,
        timeout: float | None = None,
    ) -> Page:
        return expect(self._call(ListOp(scope, page_size, cursor), timeout), Page)

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
        return self._send(self._publisher.many(builtins.list(operations), deadline))

    def results(self, handles: Sequence[Handle]) -> builtins.list[Result | DataServiceError]:
        """Every handle's answer, or the error it raises, in their order, as
        :meth:`Handle.result` would give each."""
        return gather(handles)

    # Internals --------------------------------------------------------------

    def _call(
        self, operation: Operation, timeout: float | None, deadline: int | None = None
    ) -> Result:
        """One interactive call: attempts until an answer, a final error or the deadline."""
        if deadline is None:
            deadline = self._publisher.deadline(LaneName.INTERACTIVE, timeout)
        key = mutation_key(operation)
        attempt = 1
        while True:
            try:
                return self._attempt(operation, deadline, key)
            except RetryableError as exc:
                delay_ms = self._retry_in_ms(exc, attempt, deadline)
                if delay_ms is None:
                    raise
                time.sleep(delay_ms / 1000)
                attempt += 1

    def _attempt(self, operation: Operation, deadline: int, key: str) -> Result:
        try:
            (handle,) = self._send(self._publisher.one(operation, deadline, key))
        except ResourceExhausted as exc:
            self._publisher.held_back(exc)
            raise
        try:
            return handle.result()
        except ResourceExhausted as exc:
            self._publisher.held_back(exc)
            raise
        finally:
            # Nobody else waits for this attempt's answer: once its call has
            # it or gave up, a late one is dropped on arrival.
            self._transport.replies.forget(handle.request_id)

    def _send(self, out: Outgoing) -> builtins.list[Handle]:
        try:
            epoch = self._transport.publish_many(out.items, lane=out.lane, caller=self.caller)
        except AdmissionRefused as refusal:
            made = self._publisher.handles(out, refusal.epoch, self._make, refusal.sent)
            raise self._publisher.refused(out, refusal, made) from None
        self._publisher.accepted(out)
        return self._publisher.handles(out, epoch, self._make)
