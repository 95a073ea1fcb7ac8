"""The operations: one object each, knowing its operation class and how to run.

Each takes the verified envelope and returns the answer's result part, or
raises a :class:`~dataservice.refusals.Refusal`. Reads find their record
through a :class:`RecordSource`: the database itself (:class:`DatabaseSource`)
or the cache in front of it (:class:`dataservice.cache.CachedSource`).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Mapping, Sequence
from typing import ClassVar, Protocol, TypeVar

from google.protobuf.message import Message

from dataservice.codec import decode_cursor, encode_cursor, page_size, record_to_pb
from dataservice.config.model import Limits
from dataservice.enums import OperationClass, ReadMode
from dataservice.handler.database import Database
from dataservice.handler.failures import RecordMissing
from dataservice.handler.readmany import ReadMany
from dataservice.handler.source import Found, RecordSource
from dataservice.proto import pb
from dataservice.refusals import Refusal
from dataservice.security.auth import Authorised
from dataservice.store import Idempotency, RecordStore

T = TypeVar("T")
# Per-record framing inside a ListRecordsResponse, on top of id and payload.
_RECORD_OVERHEAD = 32
# The envelope, status and cursor around a list page.
_PAGE_OVERHEAD = 512


class Operation(Protocol):
    op_class: ClassVar[OperationClass]

    def run(self, request: Authorised) -> pb.ResponseEnvelope:
        """The answer's result for a verified, authorised request."""
        ...


class DatabaseSource:
    """Every read from the database, under a point-read permit."""

    def __init__(self, database: Database, store: RecordStore, keys_per_select: int = 100) -> None:
        self._database = database
        self._store = store
        self._keys_per_select = keys_per_select

    def read(
        self,
        scope: str,
        object_id: str,
        mode: ReadMode,
        deadline_ms: int,
        request_id: str,
        issued_ms: int | None = None,
    ) -> pb.Record | None:
        record = self._database.run(
            Read.op_class, deadline_ms, lambda bounds: self._store.read(scope, object_id, bounds)
        )
        return record_to_pb(record) if record is not None else None

    def read_many(
        self,
        keys: Sequence[tuple[str, str]],
        mode: ReadMode,
        deadline_ms: int,
        request_id: str,
        issued_ms: int | None = None,
    ) -> Found:
        return read_in_bulk(self._database, self._store, keys, deadline_ms, self._keys_per_select)

    def changed(self, scope: str, object_id: str, revision: int, *, deleted: bool) -> None:
        """Nothing to forget: every read is the database's."""

    def changed_many(self, changes: Sequence[tuple[str, str, int, bool]]) -> None:
        """Nothing to forget."""


def read_in_bulk(
    database: Database,
    store: RecordStore,
    keys: Sequence[tuple[str, str]],
    deadline_ms: int,
    keys_per_select: int,
) -> Found:
    """``keys`` from the database: one ``SELECT ... IN`` of at most
    ``keys_per_select`` keys per point-read permit, one after another (one
    permit is one active statement). A chunk that fails fails its keys only."""
    found: Found = {}
    for start in range(0, len(keys), keys_per_select):
        chunk = keys[start : start + keys_per_select]
        try:
            rows = database.run(
                OperationClass.POINT_READ,
                deadline_ms,
                functools.partial(store.read_many, chunk),
            )
        except Refusal as refusal:
            found.update((key, refusal) for key in chunk)
            continue
        for key in chunk:
            row = rows.get(key)
            found[key] = record_to_pb(row) if row is not None else None
    return found


class Read:
    op_class: ClassVar[OperationClass] = OperationClass.POINT_READ

    def __init__(self, source: RecordSource) -> None:
        self._source = source

    def run(self, request: Authorised) -> pb.ResponseEnvelope:
        envelope = request.envelope
        read = envelope.read
        record = self._source.read(
            read.scope,
            read.object_id,
            ReadMode(read.mode),
            envelope.deadline_unix_ms,
            envelope.request_id,
            envelope.issued_at_unix_ms,
        )
        if record is None:
            raise RecordMissing
        # One copy of the record into the answer; nested constructors copy it twice.
        response = pb.ResponseEnvelope()
        response.read.record.CopyFrom(record)
        return response


def idempotency(envelope: pb.RequestEnvelope) -> Idempotency:
    """The key a mutation's outcome is recorded under, and what it was asked:
    the operation's own fields, so a retry matches whatever else changed."""
    operation = envelope.WhichOneof("operation") or ""
    return keyed(envelope.caller, envelope.idempotency_key, operation, getattr(envelope, operation))


def keyed(caller: str, key: str, operation: str, request: Message) -> Idempotency:
    """:func:`idempotency` of one operation (alone or in a batch: the same
    request has the same fingerprint either way)."""
    fingerprint = hashlib.sha256(
        operation.encode() + b"\0" + request.SerializeToString(deterministic=True)
    ).digest()
    return Idempotency(caller, key, fingerprint)


class _Mutation:
    """A write or delete: one keyed transaction under a point-write permit (the
    delete's statements run one after another, so one permit covers them)."""

    op_class: ClassVar[OperationClass] = OperationClass.POINT_WRITE

    def __init__(self, database: Database, store: RecordStore, source: RecordSource) -> None:
        self._database = database
        self._store = store
        # Told of each committed change, so that reads stop seeing the old record.
        self._source = source

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
    def run(self, request: Authorised) -> pb.ResponseEnvelope:
        envelope = request.envelope
        w = envelope.write
        outcome = self._apply(envelope, w, self._store.write, w.payload)
        self._source.changed(w.scope, w.object_id, outcome.revision, deleted=False)
        result = pb.WriteRecordResponse(
            object_id=w.object_id, revision=outcome.revision, created=outcome.created
        )
        return pb.ResponseEnvelope(write=result)


class Delete(_Mutation):
    def run(self, request: Authorised) -> pb.ResponseEnvelope:
        envelope = request.envelope
        d = envelope.delete
        revision = self._apply(envelope, d, self._store.delete)
        if revision is None:
            raise RecordMissing
        self._source.changed(d.scope, d.object_id, revision, deleted=True)
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

    def run(self, request: Authorised) -> pb.ResponseEnvelope:
        envelope = request.envelope
        listing = envelope.list
        size = page_size(listing, self._limits)
        after = decode_cursor(listing.cursor, listing.scope) if listing.cursor else ""
        # One extra row tells whether another page follows.
        rows = self._database.run(
            self.op_class,
            envelope.deadline_unix_ms,
            lambda bounds: self._store.list(listing.scope, after, size + 1, bounds),
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
            page.next_cursor = encode_cursor(listing.scope, page.records[-1].object_id)
        return pb.ResponseEnvelope(list=page)


def operations(
    database: Database, store: RecordStore, limits: Limits, source: RecordSource | None = None
) -> Mapping[str, Operation]:
    """Each operation by its name in the envelope's ``operation`` oneof; reads
    through ``source``, by default straight from the database."""
    source = source or DatabaseSource(database, store)
    return {
        "read": Read(source),
        "write": Write(database, store, source),
        "delete": Delete(database, store, source),
        "list": List(database, store, limits),
        "read_many": ReadMany(source, limits),
    }
