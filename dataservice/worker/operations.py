"""The operations: one object each, knowing its operation class and how to run.

Each takes the verified envelope and returns the answer's result part, or
raises a :class:`~dataservice.refusals.Refusal`. Reads find their record
through a :class:`RecordSource`: the seam where the cache goes (cache get,
then coalesce, then the database under a permit, then fill); today the source
is the database itself.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from typing import ClassVar, Protocol, TypeVar

from dataservice.codec import decode_cursor, encode_cursor, page_size, record_to_pb
from dataservice.config import Limits
from dataservice.enums import OperationClass, ReadMode
from dataservice.proto import pb
from dataservice.store import Idempotency, RecordStore
from dataservice.types import Record
from dataservice.worker.database import Database
from dataservice.worker.failures import RecordMissing

T = TypeVar("T")
# Per-record framing inside a ListRecordsResponse, on top of id and payload.
_RECORD_OVERHEAD = 32
# The envelope, status and cursor around a list page.
_PAGE_OVERHEAD = 512


class Operation(Protocol):
    op_class: ClassVar[OperationClass]

    def run(self, envelope: pb.RequestEnvelope) -> pb.ResponseEnvelope:
        """The answer's result for a verified, authorised envelope."""
        ...


class RecordSource(Protocol):
    """Where a read finds a record, within the request's deadline."""

    def read(
        self, scope: str, object_id: str, mode: ReadMode, deadline_ms: int
    ) -> Record | None: ...


class DatabaseSource:
    """Every read from the database, under a point-read permit."""

    def __init__(self, database: Database, store: RecordStore) -> None:
        self._database = database
        self._store = store

    def read(self, scope: str, object_id: str, mode: ReadMode, deadline_ms: int) -> Record | None:
        return self._database.run(
            Read.op_class, deadline_ms, lambda bounds: self._store.read(scope, object_id, bounds)
        )


class Read:
    op_class: ClassVar[OperationClass] = OperationClass.POINT_READ

    def __init__(self, source: RecordSource) -> None:
        self._source = source

    def run(self, envelope: pb.RequestEnvelope) -> pb.ResponseEnvelope:
        request = envelope.read
        mode = ReadMode(request.mode)
        record = self._source.read(
            request.scope, request.object_id, mode, envelope.deadline_unix_ms
        )
        if record is None:
            raise RecordMissing
        return pb.ResponseEnvelope(read=pb.ReadRecordResponse(record=record_to_pb(record)))


def idempotency(envelope: pb.RequestEnvelope) -> Idempotency:
    """The key a mutation's outcome is recorded under, and what it was asked:
    the operation's own fields, so a retry matches whatever else changed."""
    operation = envelope.WhichOneof("operation") or ""
    request = getattr(envelope, operation)
    fingerprint = hashlib.sha256(
        operation.encode() + b"\0" + request.SerializeToString(deterministic=True)
    ).digest()
    return Idempotency(envelope.caller, envelope.idempotency_key, fingerprint)


class _Mutation:
    """A write or delete: one keyed transaction under a point-write permit (the
    delete's statements run one after another, so one permit covers them)."""

    op_class: ClassVar[OperationClass] = OperationClass.POINT_WRITE

    def __init__(self, database: Database, store: RecordStore) -> None:
        self._database = database
        self._store = store

    def _apply(
        self,
        envelope: pb.RequestEnvelope,
        request: pb.WriteRecordRequest | pb.DeleteRecordRequest,
        change: Callable[..., T],
        *values: object,
    ) -> T:
        """``change(scope, object_id, *values, bounds, idempotency=, expected_revision=)``."""
        key = idempotency(envelope)
        return self._database.run(
            self.op_class,
            envelope.deadline_unix_ms,
            lambda bounds: change(
                request.scope,
                request.object_id,
                *values,
                bounds,
                idempotency=key,
                expected_revision=request.expected_revision,
            ),
        )


class Write(_Mutation):
    def run(self, envelope: pb.RequestEnvelope) -> pb.ResponseEnvelope:
        w = envelope.write
        outcome = self._apply(envelope, w, self._store.write, w.payload)
        result = pb.WriteRecordResponse(
            object_id=w.object_id, revision=outcome.revision, created=outcome.created
        )
        return pb.ResponseEnvelope(write=result)


class Delete(_Mutation):
    def run(self, envelope: pb.RequestEnvelope) -> pb.ResponseEnvelope:
        d = envelope.delete
        revision = self._apply(envelope, d, self._store.delete)
        if revision is None:
            raise RecordMissing
        return pb.ResponseEnvelope(
            delete=pb.DeleteRecordResponse(object_id=d.object_id, revision=revision)
        )


class List:
    """One page of a scope, bounded in records and in bytes."""

    op_class: ClassVar[OperationClass] = OperationClass.BOUNDED_LIST

    def __init__(self, database: Database, store: RecordStore, limits: Limits) -> None:
        self._database = database
        self._store = store
        self._limits = limits

    def run(self, envelope: pb.RequestEnvelope) -> pb.ResponseEnvelope:
        request = envelope.list
        size = page_size(request, self._limits)
        after = decode_cursor(request.cursor, request.scope) if request.cursor else ""
        # One extra row tells whether another page follows.
        rows = self._database.run(
            self.op_class,
            envelope.deadline_unix_ms,
            lambda bounds: self._store.list(request.scope, after, size + 1, bounds),
        )
        page = pb.ListRecordsResponse()
        room = self._limits.max_response_bytes - _PAGE_OVERHEAD
        for record in rows[:size]:
            cost = len(record.payload) + len(record.object_id) + _RECORD_OVERHEAD
            if page.records and cost > room:
                break
            room -= cost
            page.records.append(record_to_pb(record))
        if len(page.records) < len(rows):
            page.next_cursor = encode_cursor(request.scope, page.records[-1].object_id)
        return pb.ResponseEnvelope(list=page)


def operations(database: Database, store: RecordStore, limits: Limits) -> Mapping[str, Operation]:
    """Each operation by its name in the envelope's ``operation`` oneof."""
    return {
        "read": Read(DatabaseSource(database, store)),
        "write": Write(database, store),
        "delete": Delete(database, store),
        "list": List(database, store, limits),
    }
