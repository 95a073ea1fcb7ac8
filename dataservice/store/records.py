"""Bounded statements on records.

Each operation is one primary-key statement (or one key-range scan with a
LIMIT), run in autocommit: no statement can touch an unbounded number of rows
and no lock outlives its statement. Each runs within a :class:`Budget`: the
permit it holds learns which connection it uses, and every statement gets the
request's remaining time as a server-side timeout.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, Engine, bindparam, func, select, text
from sqlalchemy.dialects.mysql import insert
from sqlalchemy.exc import DBAPIError, OperationalError

from dataservice.permits import Permit
from dataservice.store.connections import (
    CONNECTION_ID,
    DEADLINE_OPTION,
    STATEMENT_TIMEOUT_CODES,
    StatementTimeout,
    now_ms,
)
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


@dataclass(frozen=True, slots=True)
class Budget:
    """What one operation may spend: its permit, and time until ``deadline_ms`` (Unix ms)."""

    permit: Permit | None = None
    deadline_ms: int | None = None


_UNBOUNDED = Budget()
# Slack after the server-side bound before a lost statement is taken as gone.
_SERVER_BOUND_SLACK_S = 0.1


def _timed_out(exc: BaseException) -> bool:
    orig = getattr(exc, "orig", None) if isinstance(exc, OperationalError) else None
    return bool(orig is not None and orig.args and orig.args[0] in STATEMENT_TIMEOUT_CODES)


_SLEEP = text("SELECT SLEEP(:seconds)")


class RecordStore:
    def __init__(
        self, engine: Engine, *, max_statement_ms: int, injected_delay_ms: int = 0
    ) -> None:
        self.engine = engine
        self._max_statement_ms = max_statement_ms
        self._delay_s = injected_delay_ms / 1000

    @contextmanager
    def _connection(self, budget: Budget) -> Iterator[Connection]:
        """A pooled connection, bound to the budget; discarded on any failure.

        After an error nothing is known for sure about the session (a
        statement may have been cut off half way), so the connection is
        invalidated, never returned to the pool.
        """
        with self.engine.connect() as conn:
            if budget.permit is not None:
                budget.permit.connection_id = conn.info.get(CONNECTION_ID)
            if budget.deadline_ms is not None:
                conn.execution_options(**{DEADLINE_OPTION: budget.deadline_ms})
            try:
                if self._delay_s:
                    conn.execute(_SLEEP, {"seconds": self._delay_s})
                yield conn
            except BaseException as exc:
                conn.invalidate()
                if _timed_out(exc):
                    raise StatementTimeout from None
                if isinstance(exc, DBAPIError) and exc.connection_invalidated:
                    self._outlast_server_bound(budget)
                raise

    def _outlast_server_bound(self, budget: Budget) -> None:
        """After losing a connection mid-statement, wait until the server has
        certainly stopped the statement (its own timeout), so that the permit
        is never released while the database still works for the request.

        A statement started at t with timeout min(deadline - t, cap) is over by
        min(deadline, now + cap): wait until then.
        """
        bound_ms = now_ms() + self._max_statement_ms
        if budget.deadline_ms is not None:
            bound_ms = min(bound_ms, budget.deadline_ms)
        wait_s = (bound_ms - now_ms()) / 1000 + _SERVER_BOUND_SLACK_S
        if wait_s > 0:
            time.sleep(wait_s)

    def read(self, scope: str, object_id: str, budget: Budget = _UNBOUNDED) -> StoredRecord | None:
        with self._connection(budget) as conn:
            row = conn.execute(_READ, {"scope": scope, "object_id": object_id}).first()
        return None if row is None else StoredRecord(*row)

    def write(
        self, scope: str, object_id: str, payload: bytes, budget: Budget = _UNBOUNDED
    ) -> WriteOutcome:
        params = {"scope": scope, "object_id": object_id, "payload": payload}
        with self._connection(budget) as conn:
            result = conn.execute(_UPSERT, params)
        # rowcount is 1 for an insert and 2 for an update (MySQL's convention).
        if result.rowcount == 1:
            return WriteOutcome(revision=1, created=True)
        return WriteOutcome(revision=int(result.lastrowid), created=False)

    def delete(self, scope: str, object_id: str, budget: Budget = _UNBOUNDED) -> int | None:
        """Delete and return the deleted revision, or None if there was no record.

        Optimistic: the delete names the revision just read, so a concurrent
        write makes it match nothing and the loop reads again; no lock is held
        between the statements, which run one after another under one permit.
        """
        key = {"scope": scope, "object_id": object_id}
        with self._connection(budget) as conn:
            for _ in range(_MAX_DELETE_ATTEMPTS):
                revision = conn.execute(_REVISION, key).scalar()
                if revision is None:
                    return None
                if conn.execute(_DELETE, {**key, "revision": revision}).rowcount == 1:
                    return int(revision)
        raise DeleteRaced(object_id)

    def list(
        self, scope: str, after: str, limit: int, budget: Budget = _UNBOUNDED
    ) -> list[StoredRecord]:
        """Up to ``limit`` records of ``scope`` with ids after ``after``, in id order."""
        params = {"scope": scope, "after": after, "limit": limit}
        with self._connection(budget) as conn:
            return [StoredRecord(*row) for row in conn.execute(_LIST, params)]
