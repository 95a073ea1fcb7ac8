"""Group commit: many keyed writes and deletes in one short transaction.

A batch's operations are applied a group at a time, each group one
transaction on one connection, under one permit::

    SET TRANSACTION ISOLATION LEVEL READ COMMITTED
    START TRANSACTION
    SELECT ... FROM idempotency_keys WHERE caller = ? AND idem_key IN (...)
    SELECT object_id, revision FROM records
        WHERE scope = ? AND object_id IN (...) FOR UPDATE       -- per scope
    INSERT INTO records ... VALUES (...), (...) ON DUPLICATE KEY UPDATE ...   -- payloads X'...'
    DELETE FROM records WHERE scope = ? AND object_id IN (...)  -- per scope
    INSERT INTO idempotency_keys ... VALUES (...), (...)
    COMMIT

Seven round trips for up to ``max_ops_per_transaction`` operations, where
one at a time costs four each. How each operation's outcome is known without
a statement of its own:

- Keys already recorded answer from their record (``replayed``) or, recorded
  for a different request, as a conflict; they change nothing.
- The locking read gives each record's revision, so the new revision, a
  conditional write's or delete's condition, and a delete's "not found" are
  decided here, exactly as the single-operation statements would decide them.
  Only the operations that change something reach the upsert and the delete.
- Read committed: the locking read locks the rows it finds and no gaps, so
  two groups inserting new ids side by side never deadlock on a gap. Rows and
  keys are locked in key order (the group is sorted), so two groups never
  wait for each other in a cycle.
- A record created by someone else between the read and the upsert makes the
  upsert update where an insert was expected; its affected-row count (1 per
  insert, 2 per update) then differs from the one computed, and a key
  recorded meanwhile makes the last INSERT fail on its primary key. Either
  way the transaction is rolled back and run again from the start: the second
  run reads what the first could not see.

A group holds each record at most once: the caller cuts a batch into groups
so (a record written twice in one batch goes in two groups, in order).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.exc import IntegrityError

from dataservice.refusals import Refusal
from dataservice.store.connections import DEADLINE_OPTION
from dataservice.store.idempotency import Idempotency, Outcome, Recorded

_DUPLICATE_KEY = 1062
# Rolled back and run again at most this often when a concurrent writer
# created a record or recorded a key between the reads and the writes.
MAX_GROUP_ATTEMPTS = 3
# Statements that are never refused for lack of time: a refusal would only
# cost the connection (closing it rolls back too), and the isolation level is
# the client's own business until the transaction starts.
_NO_DEADLINE = {DEADLINE_OPTION: None}


@dataclass(frozen=True, slots=True)
class Mutation:
    """One keyed write (``payload`` set) or delete (``payload`` None)."""

    scope: str
    object_id: str
    payload: bytes | None
    expected_revision: int
    idempotency: Idempotency

    @property
    def key(self) -> tuple[str, str]:
        return self.scope, self.object_id


class GroupRaced(Refusal):
    """Concurrent writers kept changing the group's records while it ran: it
    was rolled back, nothing applied, and may be sent again."""


@functools.lru_cache(maxsize=256)
def _recall_sql(n: int) -> str:
    return (
        "SELECT idem_key, fingerprint, outcome, revision, created FROM idempotency_keys"
        f" WHERE caller = %s AND idem_key IN ({', '.join(['%s'] * n)})"
    )


@functools.lru_cache(maxsize=256)
def _lock_sql(n: int) -> str:
    return (
        "SELECT object_id, revision FROM records WHERE scope = %s"
        f" AND object_id IN ({', '.join(['%s'] * n)}) ORDER BY object_id FOR UPDATE"
    )


def _upsert_sql(payloads: Sequence[bytes]) -> str:
    """The upsert of one row per payload: each row's scope and object id are
    parameters, its payload a hexadecimal literal (``X'...'``: nothing in it
    to escape, and writing one costs an eighth of escaping it)."""
    return (
        "INSERT INTO records (scope, object_id, revision, payload, created_at, updated_at)"
        " VALUES "
        + ", ".join(
            f"(%s, %s, 1, X'{payload.hex()}', UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))"
            for payload in payloads
        )
        + " ON DUPLICATE KEY UPDATE revision = revision + 1, payload = VALUES(payload),"
        " updated_at = VALUES(updated_at)"
    )


@functools.lru_cache(maxsize=256)
def _delete_sql(n: int) -> str:
    return f"DELETE FROM records WHERE scope = %s AND object_id IN ({', '.join(['%s'] * n)})"


_REMEMBER = (
    "INSERT INTO idempotency_keys"
    " (caller, idem_key, fingerprint, outcome, revision, created, expires_at) VALUES "
)


def _remember_sql(rows: Sequence[tuple[bytes, int, int | None, bool]], retention_s: int) -> str:
    """The outcomes' INSERT: the caller and key of each row are parameters;
    its fingerprint a hexadecimal literal, and its outcome, revision and
    created flag, and the retention, integers this module computed, written
    into the statement (what the driver would otherwise escape one by one)."""
    expires = f"TIMESTAMPADD(SECOND, {int(retention_s)}, UTC_TIMESTAMP(6))"
    return _REMEMBER + ", ".join(
        f"(%s, %s, X'{fingerprint.hex()}', {int(outcome)},"
        f" {'NULL' if revision is None else int(revision)}, {int(created)}, {expires})"
        for fingerprint, outcome, revision, created in rows
    )


def _by_scope(mutations: Sequence[Mutation]) -> dict[str, list[str]]:
    scopes: dict[str, list[str]] = {}
    for mutation in mutations:
        scopes.setdefault(mutation.scope, []).append(mutation.object_id)
    return scopes


def _decide(mutation: Mutation, current: int | None) -> Recorded:
    """What the single-operation statements would have done to a record at
    ``current`` (None: absent), as its idempotency record stores it."""
    expected = mutation.expected_revision
    if mutation.payload is not None:
        if expected:
            if current != expected:
                return Recorded(Outcome.REVISION_MISMATCH, current)
            return Recorded(Outcome.OK, expected + 1)
        if current is None:
            return Recorded(Outcome.OK, 1, created=True)
        return Recorded(Outcome.OK, current + 1)
    if current is None:
        return Recorded(Outcome.REVISION_MISMATCH if expected else Outcome.NOT_FOUND, None)
    if expected and current != expected:
        return Recorded(Outcome.REVISION_MISMATCH, current)
    return Recorded(Outcome.OK, current)


def apply_group(
    conn: Connection, mutations: Sequence[Mutation], retention_s: int
) -> list[Recorded | None]:
    """Apply ``mutations`` (distinct records, one caller) in one transaction
    and return each one's outcome in their order: as recorded, ``replayed``
    when its key already answered the same request, None when the key was
    used for a different one. Raises :class:`GroupRaced` (rolled back) when a
    concurrent writer got in between; any other exception leaves the
    transaction open, and the connection must be discarded.
    """
    if len({m.key for m in mutations}) != len(mutations):
        raise ValueError("a group holds each record at most once")
    if len({m.idempotency.caller for m in mutations}) > 1:
        raise ValueError("a group belongs to one caller")
    order = sorted(range(len(mutations)), key=lambda i: mutations[i].key)
    ordered = [mutations[i] for i in order]
    caller = ordered[0].idempotency.caller
    conn.exec_driver_sql("SET TRANSACTION ISOLATION LEVEL READ COMMITTED", (), _NO_DEADLINE)
    conn.exec_driver_sql("START TRANSACTION")
    try:
        outcomes = _run(conn, ordered, caller, retention_s)
    except GroupRaced:
        conn.exec_driver_sql("ROLLBACK", (), _NO_DEADLINE)
        raise
    conn.exec_driver_sql("COMMIT")
    result: list[Recorded | None] = [None] * len(mutations)
    for position, index in enumerate(order):
        result[index] = outcomes[position]
    return result


def _run(
    conn: Connection, ordered: list[Mutation], caller: str, retention_s: int
) -> list[Recorded | None]:
    keys = [m.idempotency.key for m in ordered]
    stored = {row[0]: row for row in conn.exec_driver_sql(_recall_sql(len(keys)), (caller, *keys))}
    outcomes: list[Recorded | None] = [None] * len(ordered)
    fresh: list[int] = []
    for i, mutation in enumerate(ordered):
        row = stored.get(mutation.idempotency.key)
        if row is None:
            fresh.append(i)
        elif bytes(row[1]) == mutation.idempotency.fingerprint:
            revision = None if row[3] is None else int(row[3])
            outcomes[i] = Recorded(Outcome(row[2]), revision, bool(row[4]), replayed=True)
        # else: the key answered another request; None says so.
    if not fresh:
        return outcomes
    current: dict[tuple[str, str], int] = {}
    for scope, ids in _by_scope([ordered[i] for i in fresh]).items():
        for object_id, revision in conn.exec_driver_sql(_lock_sql(len(ids)), (scope, *ids)):
            current[(scope, object_id)] = int(revision)
    upserts: list[Any] = []
    payloads: list[bytes] = []
    inserted = updated = 0
    deletes: list[Mutation] = []
    remember: list[Any] = []
    outcomes_rows: list[tuple[bytes, int, int | None, bool]] = []
    for i in fresh:
        mutation = ordered[i]
        recorded = _decide(mutation, current.get(mutation.key))
        outcomes[i] = recorded
        if recorded.outcome is Outcome.OK:
            if mutation.payload is not None:
                upserts += [mutation.scope, mutation.object_id]
                payloads.append(mutation.payload)
                inserted += recorded.created
                updated += not recorded.created
            else:
                deletes.append(mutation)
        idem = mutation.idempotency
        remember += [caller, idem.key]
        outcomes_rows.append(
            (idem.fingerprint, recorded.outcome, recorded.revision, recorded.created)
        )
    if upserts:
        # 1 per row inserted, 2 per row updated (MySQL's convention).
        upserted = conn.exec_driver_sql(_upsert_sql(payloads), tuple(upserts)).rowcount
        if upserted != inserted + 2 * updated:
            raise GroupRaced
    for scope, ids in _by_scope(deletes).items():
        if conn.exec_driver_sql(_delete_sql(len(ids)), (scope, *ids)).rowcount != len(ids):
            raise GroupRaced
    try:
        conn.exec_driver_sql(_remember_sql(outcomes_rows, retention_s), tuple(remember))
    except IntegrityError as exc:
        orig = exc.orig
        if orig is not None and orig.args and orig.args[0] == _DUPLICATE_KEY:
            raise GroupRaced from None
        raise
    return outcomes
