"""Bounded statements on records.

Each operation is one primary-key statement (or one key-range scan with a
LIMIT), run in autocommit: no statement can touch an unbounded number of rows
and no lock outlives its statement. Each runs within a :class:`Budget`: the
permit it holds learns which connection it uses, and every statement gets the
request's remaining time as a server-side timeout.

Two options change that, on writes and deletes only:

- ``expected_revision`` (> 0) makes the change conditional: it applies only to
  a record at exactly that revision, else :class:`RevisionMismatch` carries the
  revision found. One statement, and one more read when the condition fails.
- ``idempotency`` runs the change and the record of its outcome as one short
  transaction (see ``idempotency.py``): a retry with the same key gets the
  original outcome (``replayed``), and a different request under that key
  raises :class:`IdempotencyConflict`. Locks are held until its COMMIT, a few
  round trips later, never across requests.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

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
from dataservice.store.idempotency import Idempotency, IdempotencyConflict, Outcome, Recorded
from dataservice.store.idempotency import once as _once
from dataservice.store.idempotency import purge as _purge
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
    # True when this is the stored outcome of an earlier request with the same
    # idempotency key; the write itself was not applied again.
    replayed: bool = False


class DeleteRaced(Exception):
    """The record kept changing while it was being deleted."""


class RevisionMismatch(Exception):
    """A conditional change found the record at another revision; nothing was changed.

    ``current`` is the revision read once the condition had failed, None if
    there was no record. A concurrent change between the two can make it
    equal to the revision that was expected.
    """

    def __init__(self, current: int | None) -> None:
        found = "no record" if current is None else f"revision {current}"
        super().__init__(f"the record is not at the expected revision ({found})")
        self.current = current


# Statements are built once with bound parameters: SQLAlchemy then reuses the
# compiled form instead of rebuilding a cache key on every call.
_COLUMNS = (records.c.object_id, records.c.revision, records.c.payload, records.c.updated_at)
_KEY = (records.c.scope == bindparam("scope"), records.c.object_id == bindparam("object_id"))
_READ = select(*_COLUMNS).where(*_KEY)
_REVISION = select(records.c.revision).where(*_KEY)
# Inside a transaction a plain read would come from its snapshot; a locking
# read sees the latest revision and keeps it until the outcome is recorded.
_REVISION_LOCKED = _REVISION.with_for_update()
_DELETE = records.delete().where(*_KEY, records.c.revision == bindparam("revision"))
_DELETE_KEY = records.delete().where(*_KEY)
# MariaDB: the deleted revision comes back with the DELETE, saving a round trip.
_DELETE_RETURNING = _DELETE_KEY.returning(records.c.revision)
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
# Conditional: the record must exist at the expected revision, so the new one
# is known without asking the server. Parameters of an UPDATE named like a
# column would be taken as values to SET, hence the prefix.
_UPDATE_IF = (
    records.update()
    .where(
        records.c.scope == bindparam("if_scope"),
        records.c.object_id == bindparam("if_object_id"),
        records.c.revision == bindparam("if_revision"),
    )
    .values(revision=records.c.revision + 1, payload=bindparam("if_payload"), updated_at=_NOW)
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


def _current(conn: Connection, key: dict[str, Any], locked: bool) -> int | None:
    revision = conn.execute(_REVISION_LOCKED if locked else _REVISION, key).scalar()
    return None if revision is None else int(revision)


def _check(expected_revision: int) -> None:
    if expected_revision < 0:
        raise ValueError("expected_revision must be 0 (unconditional) or a revision")


def _write_change(
    conn: Connection, params: dict[str, Any], expected: int, locked: bool
) -> Recorded:
    if not expected:
        result = conn.execute(_UPSERT, params)
        # rowcount is 1 for an insert and 2 for an update (MySQL's convention).
        if result.rowcount == 1:
            return Recorded(Outcome.OK, 1, created=True)
        return Recorded(Outcome.OK, int(result.lastrowid))
    conditional = {f"if_{name}": value for name, value in params.items()}
    if conn.execute(_UPDATE_IF, {**conditional, "if_revision": expected}).rowcount == 1:
        return Recorded(Outcome.OK, expected + 1)
    key = {"scope": params["scope"], "object_id": params["object_id"]}
    return Recorded(Outcome.REVISION_MISMATCH, _current(conn, key, locked))


def _delete_change(conn: Connection, key: dict[str, Any], expected: int, locked: bool) -> Recorded:
    if expected:
        if conn.execute(_DELETE, {**key, "revision": expected}).rowcount == 1:
            return Recorded(Outcome.OK, expected)
        return Recorded(Outcome.REVISION_MISMATCH, _current(conn, key, locked))
    # Unconditional deletes without a key take the optimistic path instead.
    if conn.dialect.delete_returning:
        revision = conn.execute(_DELETE_RETURNING, key).scalar()
    else:
        revision = _current(conn, key, locked=True)
        if revision is not None:
            conn.execute(_DELETE_KEY, key)
    if revision is None:
        return Recorded(Outcome.NOT_FOUND, None)
    return Recorded(Outcome.OK, int(revision))


class RecordStore:
    def __init__(
        self,
        engine: Engine,
        *,
        max_statement_ms: int,
        injected_delay_ms: int = 0,
        idempotency_retention_s: int = 86_400,
    ) -> None:
        if idempotency_retention_s < 0:
            raise ValueError("idempotency_retention_s must not be negative")
        self.engine = engine
        self._max_statement_ms = max_statement_ms
        self._delay_s = injected_delay_ms / 1000
        self._retention_s = idempotency_retention_s

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
        self,
        scope: str,
        object_id: str,
        payload: bytes,
        budget: Budget = _UNBOUNDED,
        *,
        idempotency: Idempotency | None = None,
        expected_revision: int = 0,
    ) -> WriteOutcome:
        """Create or replace; with ``expected_revision`` only replace, and only that revision.

        Raises :class:`RevisionMismatch` (also when replayed) and
        :class:`IdempotencyConflict`; see the module docstring.
        """
        _check(expected_revision)
        params = {"scope": scope, "object_id": object_id, "payload": payload}
        recorded = self._mutate(
            budget,
            idempotency,
            lambda conn, locked: _write_change(conn, params, expected_revision, locked),
        )
        if recorded.outcome is Outcome.REVISION_MISMATCH:
            raise RevisionMismatch(recorded.revision)
        if recorded.revision is None:
            # Only a delete records "not found": the key was used for one.
            raise IdempotencyConflict("the key was used for a delete")
        return WriteOutcome(recorded.revision, recorded.created, recorded.replayed)

    def delete(
        self,
        scope: str,
        object_id: str,
        budget: Budget = _UNBOUNDED,
        *,
        idempotency: Idempotency | None = None,
        expected_revision: int = 0,
    ) -> int | None:
        """Delete and return the deleted revision, or None if there was no record.

        With ``expected_revision`` only that revision is deleted, else
        :class:`RevisionMismatch`. With ``idempotency`` a retry returns what
        the original returned (its deleted revision, or None), whatever has
        happened to the record since.
        """
        _check(expected_revision)
        key = {"scope": scope, "object_id": object_id}
        if idempotency is None and not expected_revision:
            return self._delete_optimistic(key, budget)
        recorded = self._mutate(
            budget,
            idempotency,
            lambda conn, locked: _delete_change(conn, key, expected_revision, locked),
        )
        if recorded.outcome is Outcome.REVISION_MISMATCH:
            raise RevisionMismatch(recorded.revision)
        return recorded.revision

    def _delete_optimistic(self, key: dict[str, Any], budget: Budget) -> int | None:
        """Optimistic: the delete names the revision just read, so a concurrent
        write makes it match nothing and the loop reads again; no lock is held
        between the statements, which run one after another under one permit.
        """
        with self._connection(budget) as conn:
            for _ in range(_MAX_DELETE_ATTEMPTS):
                revision = conn.execute(_REVISION, key).scalar()
                if revision is None:
                    return None
                if conn.execute(_DELETE, {**key, "revision": revision}).rowcount == 1:
                    return int(revision)
        raise DeleteRaced(key["object_id"])

    def _mutate(
        self,
        budget: Budget,
        idempotency: Idempotency | None,
        change: Callable[[Connection, bool], Recorded],
    ) -> Recorded:
        """Apply ``change`` in autocommit, or keyed in a transaction of its own.

        ``change`` gets whether it runs in a transaction (its reads must then
        lock). Exceptions for the caller are raised only once the connection
        is back in autocommit, so they do not cost it.
        """
        with self._connection(budget) as conn:
            if idempotency is None:
                return change(conn, False)
            recorded = _once(conn, idempotency, self._retention_s, lambda c: change(c, True))
        if recorded is None:
            raise IdempotencyConflict("the key was used for a different request")
        return recorded

    def purge_idempotency(self, limit: int, budget: Budget = _UNBOUNDED) -> int:
        """Delete at most ``limit`` expired idempotency keys; returns how many.

        One bounded statement: call it repeatedly, until it returns less than
        ``limit``, to purge a backlog without long-held locks.
        """
        if limit <= 0:
            raise ValueError("limit must be positive")
        with self._connection(budget) as conn:
            return _purge(conn, limit)

    def list(
        self, scope: str, after: str, limit: int, budget: Budget = _UNBOUNDED
    ) -> list[StoredRecord]:
        """Up to ``limit`` records of ``scope`` with ids after ``after``, in id order."""
        params = {"scope": scope, "after": after, "limit": limit}
        with self._connection(budget) as conn:
            return [StoredRecord(*row) for row in conn.execute(_LIST, params)]
