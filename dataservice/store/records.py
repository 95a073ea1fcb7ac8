"""Bounded statements on records.

Each operation is one primary-key statement (or one key-range scan with a
LIMIT), run in autocommit: no statement can touch an unbounded number of rows
and no lock outlives its statement.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Engine, bindparam, func, select
from sqlalchemy.dialects.mysql import insert

from dataservice.store.schema import records

_MAX_DELETE_ATTEMPTS = 3


@dataclass(frozen=True, slots=True)
class StoredRecord:
    object_id: str
    revision: int
    payload: bytes
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class WriteOutcome:
    revision: int
    created: bool


class DeleteRaced(Exception):
    """The record kept changing while it was being deleted."""


# Statements are built once with bound parameters: SQLAlchemy then reuses the
# compiled form instead of rebuilding a cache key on every call.
_COLUMNS = (records.c.object_id, records.c.revision, records.c.payload, records.c.updated_at)
_KEY = (records.c.scope == bindparam("scope"), records.c.object_id == bindparam("object_id"))
_READ = select(*_COLUMNS).where(*_KEY)
_REVISION = select(records.c.revision).where(*_KEY)
_DELETE = records.delete().where(*_KEY, records.c.revision == bindparam("revision"))
_LIST = (
    select(*_COLUMNS)
    .where(records.c.scope == bindparam("scope"), records.c.object_id > bindparam("after"))
    .order_by(records.c.object_id)
    .limit(bindparam("limit"))
)
_NOW = func.utc_timestamp(6)
_UPSERT = insert(records).values(
    scope=bindparam("scope"),
    object_id=bindparam("object_id"),
    revision=1,
    payload=bindparam("payload"),
    created_at=_NOW,
    updated_at=_NOW,
)
# LAST_INSERT_ID(expr) hands the new revision back through the client protocol,
# so an upsert and its revision cost one round trip.
_UPSERT = _UPSERT.on_duplicate_key_update(
    revision=func.last_insert_id(records.c.revision + 1),
    payload=_UPSERT.inserted.payload,
    updated_at=_NOW,
)


class RecordStore:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def read(self, scope: str, object_id: str) -> StoredRecord | None:
        with self.engine.connect() as conn:
            row = conn.execute(_READ, {"scope": scope, "object_id": object_id}).first()
        return None if row is None else StoredRecord(*row)

    def write(self, scope: str, object_id: str, payload: bytes) -> WriteOutcome:
        params = {"scope": scope, "object_id": object_id, "payload": payload}
        with self.engine.connect() as conn:
            result = conn.execute(_UPSERT, params)
        # rowcount is 1 for an insert and 2 for an update (MySQL's convention).
        if result.rowcount == 1:
            return WriteOutcome(revision=1, created=True)
        return WriteOutcome(revision=int(result.lastrowid), created=False)

    def delete(self, scope: str, object_id: str) -> int | None:
        """Delete and return the deleted revision, or None if there was no record.

        Optimistic: the delete names the revision just read, so a concurrent
        write makes it match nothing and the loop reads again; no lock is held
        between the two statements.
        """
        key = {"scope": scope, "object_id": object_id}
        with self.engine.connect() as conn:
            for _ in range(_MAX_DELETE_ATTEMPTS):
                revision = conn.execute(_REVISION, key).scalar()
                if revision is None:
                    return None
                if conn.execute(_DELETE, {**key, "revision": revision}).rowcount == 1:
                    return int(revision)
        raise DeleteRaced(object_id)

    def list(self, scope: str, after: str, limit: int) -> list[StoredRecord]:
        """Up to ``limit`` records of ``scope`` with ids after ``after``, in id order."""
        params = {"scope": scope, "after": after, "limit": limit}
        with self.engine.connect() as conn:
            return [StoredRecord(*row) for row in conn.execute(_LIST, params)]
