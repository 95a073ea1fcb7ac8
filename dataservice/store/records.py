"""Bounded statements on records.

Each operation is one primary-key statement (or one key-range scan with a
LIMIT), run in autocommit: no statement can touch an unbounded number of rows
and no lock outlives its statement.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Engine, func, select
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


_READ = select(records.c.object_id, records.c.revision, records.c.payload, records.c.updated_at)


class RecordStore:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def read(self, scope: str, object_id: str) -> StoredRecord | None:
        stmt = _READ.where(records.c.scope == scope, records.c.object_id == object_id)
        with self.engine.connect() as conn:
            row = conn.execute(stmt).first()
        return None if row is None else StoredRecord(*row)

    def write(self, scope: str, object_id: str, payload: bytes) -> WriteOutcome:
        now = func.utc_timestamp(6)
        stmt = insert(records).values(
            scope=scope,
            object_id=object_id,
            revision=1,
            payload=payload,
            created_at=now,
            updated_at=now,
        )
        # LAST_INSERT_ID(expr) hands the new revision back through the client
        # protocol, so an upsert and its revision cost one round trip.
        stmt = stmt.on_duplicate_key_update(
            revision=func.last_insert_id(records.c.revision + 1),
            payload=stmt.inserted.payload,
            updated_at=now,
        )
        with self.engine.connect() as conn:
            result = conn.execute(stmt)
        # rowcount is 1 for an insert and 2 for an update (MySQL's convention).
        if result.rowcount == 1:
            return WriteOutcome(revision=1, created=True)
        return WriteOutcome(revision=int(result.lastrowid), created=False)

    def delete(self, scope: str, object_id: str) -> int | None:
        """Delete and return the deleted revision, or None if there was no record."""
        key = (records.c.scope == scope, records.c.object_id == object_id)
        with self.engine.connect() as conn:
            for _ in range(_MAX_DELETE_ATTEMPTS):
                revision = conn.execute(select(records.c.revision).where(*key)).scalar()
                if revision is None:
                    return None
                deleted = conn.execute(
                    records.delete().where(*key, records.c.revision == revision)
                ).rowcount
                if deleted == 1:
                    return int(revision)
        raise DeleteRaced(object_id)

    def list(self, scope: str, after: str, limit: int) -> list[StoredRecord]:
        """Up to ``limit`` records of ``scope`` with ids after ``after``, in id order."""
        stmt = (
            _READ.where(records.c.scope == scope, records.c.object_id > after)
            .order_by(records.c.object_id)
            .limit(limit)
        )
        with self.engine.connect() as conn:
            return [StoredRecord(*row) for row in conn.execute(stmt)]
