"""The statements on ``records``, built once with bound parameters, and the
changes that mutations make with them (each returns what it did, as the
idempotency record stores it)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, bindparam, func, select
from sqlalchemy.dialects.mysql import insert

from dataservice.store.idempotency import Outcome, Recorded
from dataservice.store.schema import records

# Statements are built once with bound parameters: SQLAlchemy then reuses the
# compiled form instead of rebuilding a cache key on every call.
COLUMNS = (records.c.object_id, records.c.revision, records.c.payload, records.c.updated_at)
KEY = (records.c.scope == bindparam("scope"), records.c.object_id == bindparam("object_id"))
READ = select(*COLUMNS).where(*KEY)
REVISION = select(records.c.revision).where(*KEY)
# Inside a transaction a plain read would come from its snapshot; a locking
# read sees the latest revision and keeps it until the outcome is recorded.
REVISION_LOCKED = REVISION.with_for_update()
DELETE = records.delete().where(*KEY, records.c.revision == bindparam("revision"))
DELETE_KEY = records.delete().where(*KEY)
# MariaDB: the deleted revision comes back with the DELETE, saving a round trip.
DELETE_RETURNING = DELETE_KEY.returning(records.c.revision)
LIST = (
    select(*COLUMNS)
    .where(records.c.scope == bindparam("scope"), records.c.object_id > bindparam("after"))
    .order_by(records.c.object_id)
    .limit(bindparam("limit"))
)
NOW = func.utc_timestamp(6)
UPSERT = insert(records).values(
    scope=bindparam("scope"),
    object_id=bindparam("object_id"),
    revision=1,
    payload=bindparam("payload"),
    created_at=NOW,
    updated_at=NOW,
)
# LAST_INSERT_ID(expr) hands the new revision back through the client protocol,
# so an upsert and its revision cost one round trip.
UPSERT = UPSERT.on_duplicate_key_update(
    revision=func.last_insert_id(records.c.revision + 1),
    payload=UPSERT.inserted.payload,
    updated_at=NOW,
)
# Conditional: the record must exist at the expected revision, so the new one
# is known without asking the server. Parameters of an UPDATE named like a
# column would be taken as values to SET, hence the prefix.
UPDATE_IF = (
    records.update()
    .where(
        records.c.scope == bindparam("if_scope"),
        records.c.object_id == bindparam("if_object_id"),
        records.c.revision == bindparam("if_revision"),
    )
    .values(revision=records.c.revision + 1, payload=bindparam("if_payload"), updated_at=NOW)
)


def current_revision(conn: Connection, key: dict[str, Any], locked: bool) -> int | None:
    revision = conn.execute(REVISION_LOCKED if locked else REVISION, key).scalar()
    return None if revision is None else int(revision)


def write_change(conn: Connection, params: dict[str, Any], expected: int, locked: bool) -> Recorded:
    if not expected:
        result = conn.execute(UPSERT, params)
        # rowcount is 1 for an insert and 2 for an update (MySQL's convention).
        if result.rowcount == 1:
            return Recorded(Outcome.OK, 1, created=True)
        return Recorded(Outcome.OK, int(result.lastrowid))
    conditional = {f"if_{name}": value for name, value in params.items()}
    if conn.execute(UPDATE_IF, {**conditional, "if_revision": expected}).rowcount == 1:
        return Recorded(Outcome.OK, expected + 1)
    key = {"scope": params["scope"], "object_id": params["object_id"]}
    return Recorded(Outcome.REVISION_MISMATCH, current_revision(conn, key, locked))


def delete_change(conn: Connection, key: dict[str, Any], expected: int, locked: bool) -> Recorded:
    if expected:
        if conn.execute(DELETE, {**key, "revision": expected}).rowcount == 1:
            return Recorded(Outcome.OK, expected)
        return Recorded(Outcome.REVISION_MISMATCH, current_revision(conn, key, locked))
    # Unconditional deletes without a key take the optimistic path instead.
    if conn.dialect.delete_returning:
        revision = conn.execute(DELETE_RETURNING, key).scalar()
    else:
        revision = current_revision(conn, key, locked=True)
        if revision is not None:
            conn.execute(DELETE_KEY, key)
    if revision is None:
        return Recorded(Outcome.NOT_FOUND, None)
    return Recorded(Outcome.OK, int(revision))
