"""Bounded statements on records.

Each operation is one primary-key statement (or one key-range scan with a
LIMIT), run in autocommit: no statement can touch an unbounded number of rows
and no lock outlives its statement. Each runs within its :class:`Bounds`: the
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

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, Engine

from dataservice.refusals import Refusal
from dataservice.store import statements
from dataservice.store.group import MAX_GROUP_ATTEMPTS, GroupRaced, Mutation, apply_group
from dataservice.store.idempotency import Idempotency, IdempotencyConflict, Outcome, Recorded
from dataservice.store.idempotency import once as _once
from dataservice.store.idempotency import purge as _purge
from dataservice.store.sessions import UNBOUNDED, Bounds, Sessions
from dataservice.store.statements import delete_change, write_change
from dataservice.types import Record

_MAX_DELETE_ATTEMPTS = 3


def _record(object_id: str, revision: int, payload: bytes, updated_at: datetime) -> Record:
    # DATETIME columns hold UTC without a zone (the statements write UTC_TIMESTAMP).
    return Record(object_id, int(revision), bytes(payload), updated_at.replace(tzinfo=UTC))


@dataclass(frozen=True, slots=True)
class WriteOutcome:
    revision: int
    created: bool
    # True when this is the stored outcome of an earlier request with the same
    # idempotency key; the write itself was not applied again.
    replayed: bool = False


class DeleteRaced(Refusal):
    """The record kept changing while it was being deleted."""


class RevisionMismatch(Refusal):
    """A conditional change found the record at another revision; nothing was changed.

    ``current`` is the revision read once the condition had failed, None if
    there was no record. A concurrent change between the two can make it
    equal to the revision that was expected.
    """

    def __init__(self, current: int | None) -> None:
        found = "no record" if current is None else f"revision {current}"
        super().__init__(f"the record is not at the expected revision ({found})")
        self.current = current


_READ_SQL = (
    "SELECT records.object_id, records.revision, records.payload, records.updated_at"
    " FROM records WHERE records.scope = %s AND records.object_id = %s"
)


@functools.lru_cache(maxsize=128)
def _read_many_sql(n: int) -> str:
    # A row-constructor IN on the primary key: one range scan of n points.
    return (
        "SELECT scope, object_id, revision, payload, updated_at FROM records"
        f" WHERE (scope, object_id) IN ({', '.join(['(%s, %s)'] * n)})"
    )


def _check(expected_revision: int) -> None:
    if expected_revision < 0:
        raise ValueError("expected_revision must be 0 (unconditional) or a revision")


class RecordStore:
    def __init__(
        self,
        engine: Engine,
        *,
        max_statement_ms: int,
        injected_delay_ms: int = 0,
        injected_delay_table: str | None = None,
        idempotency_retention_s: int = 86_400,
    ) -> None:
        if idempotency_retention_s < 0:
            raise ValueError("idempotency_retention_s must not be negative")
        self.engine = engine
        self._sessions = Sessions(engine, max_statement_ms, injected_delay_ms, injected_delay_table)
        self._retention_s = idempotency_retention_s

    def read(self, scope: str, object_id: str, bounds: Bounds = UNBOUNDED) -> Record | None:
        # The hottest statement: on the driver's own cursor (Sessions.fetch_one).
        row = self._sessions.fetch_one(bounds, _READ_SQL, (scope, object_id))
        return None if row is None else _record(*row)

    def read_many(
        self, keys: Sequence[tuple[str, str]], bounds: Bounds = UNBOUNDED
    ) -> dict[tuple[str, str], Record]:
        """The records found among ``keys`` (``(scope, object_id)`` pairs), in
        one primary-key range statement; the caller bounds how many."""
        if not keys:
            return {}
        params = tuple(part for key in keys for part in key)
        with self._sessions.connection(bounds) as conn:
            rows = conn.exec_driver_sql(_read_many_sql(len(keys)), params).all()
        return {(row[0], row[1]): _record(*row[1:]) for row in rows}

    def write(
        self,
        scope: str,
        object_id: str,
        payload: bytes,
        bounds: Bounds = UNBOUNDED,
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
            bounds,
            idempotency,
            lambda conn, locked: write_change(conn, params, expected_revision, locked),
        )
        if recorded.revision is None:
            # Only a delete records "not found": the key was used for one.
            raise IdempotencyConflict("the key was used for a delete")
        return WriteOutcome(recorded.revision, recorded.created, recorded.replayed)

    def delete(
        self,
        scope: str,
        object_id: str,
        bounds: Bounds = UNBOUNDED,
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
            return self._delete_optimistic(key, bounds)
        return self._mutate(
            bounds,
            idempotency,
            lambda conn, locked: delete_change(conn, key, expected_revision, locked),
        ).revision

    def _delete_optimistic(self, key: dict[str, Any], bounds: Bounds) -> int | None:
        """Optimistic: the delete names the revision just read, so a concurrent
        write makes it match nothing and the loop reads again; no lock is held
        between the statements, which run one after another under one permit.
        """
        with self._sessions.connection(bounds) as conn:
            for _ in range(_MAX_DELETE_ATTEMPTS):
                revision = conn.execute(statements.REVISION, key).scalar()
                if revision is None:
                    return None
                if conn.execute(statements.DELETE, {**key, "revision": revision}).rowcount == 1:
                    return int(revision)
        raise DeleteRaced(key["object_id"])

    def _mutate(
        self,
        bounds: Bounds,
        idempotency: Idempotency | None,
        change: Callable[[Connection, bool], Recorded],
    ) -> Recorded:
        """Apply ``change`` in autocommit, or keyed in a transaction of its own.

        ``change`` gets whether it runs in a transaction (its reads must then
        lock). Exceptions for the caller (:class:`IdempotencyConflict`,
        :class:`RevisionMismatch`) are raised only once the connection is back
        in autocommit, so they do not cost it.
        """
        with self._sessions.connection(bounds) as conn:
            if idempotency is None:
                recorded: Recorded | None = change(conn, False)
            else:
                recorded = _once(conn, idempotency, self._retention_s, lambda c: change(c, True))
        if recorded is None:
            raise IdempotencyConflict("the key was used for a different request")
        if recorded.outcome is Outcome.REVISION_MISMATCH:
            raise RevisionMismatch(recorded.revision)
        return recorded

    def apply_group(
        self, mutations: Sequence[Mutation], bounds: Bounds = UNBOUNDED
    ) -> list[Recorded | None]:
        """Apply keyed writes and deletes of distinct records in one transaction
        (``group.py``): each one's outcome, None for a key used for a different
        request. Rolled back and run again if a concurrent writer got in between."""
        if not mutations:
            return []
        for mutation in mutations:
            _check(mutation.expected_revision)
        with self._sessions.connection(bounds) as conn:
            for _ in range(MAX_GROUP_ATTEMPTS - 1):
                try:
                    return apply_group(conn, mutations, self._retention_s)
                except GroupRaced:
                    continue
            return apply_group(conn, mutations, self._retention_s)

    def purge_idempotency(self, limit: int, bounds: Bounds = UNBOUNDED) -> int:
        """Delete at most ``limit`` expired idempotency keys; returns how many.

        One bounded statement: call it repeatedly, until it returns less than
        ``limit``, to purge a backlog without long-held locks.
        """
        if limit <= 0:
            raise ValueError("limit must be positive")
        with self._sessions.connection(bounds) as conn:
            return _purge(conn, limit)

    def list(self, scope: str, after: str, limit: int, bounds: Bounds = UNBOUNDED) -> list[Record]:
        """Up to ``limit`` records of ``scope`` with ids after ``after``, in id order."""
        params = {"scope": scope, "after": after, "limit": limit}
        with self._sessions.connection(bounds) as conn:
            return [_record(*row) for row in conn.execute(statements.LIST, params)]
