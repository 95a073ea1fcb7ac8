"""Keyed mutations: a change and the record of its outcome commit together.

A keyed mutation runs as one transaction on one connection::

    START TRANSACTION
    <the change>                          -- upsert, conditional UPDATE or DELETE
    INSERT INTO idempotency_keys (...)    -- its outcome, under (caller, key)
    COMMIT

If the key is already there, the INSERT fails with a duplicate key (1062), the
transaction is rolled back (undoing the change) and the stored outcome is the
answer. Two requests racing with one key serialize on InnoDB row locks (on the
record they both change, or on the first one's uncommitted key row), so the
second sees the first's outcome only once it has committed: exactly one change
is applied. If the first rolls back instead, the second goes ahead.

Outcomes that change nothing (not found, revision mismatch) are recorded too,
so a retry is answered as the original was even if the record has moved since.

Keys are kept at least ``retention_s`` after their request; :func:`purge`
removes expired ones in bounded batches. An expired key that has not been
purged yet still answers retries.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import Connection, bindparam, func, literal_column, select, text
from sqlalchemy.dialects.mysql import insert
from sqlalchemy.exc import IntegrityError

from dataservice.refusals import Refusal
from dataservice.store.connections import DEADLINE_OPTION
from dataservice.store.schema import idempotency_keys

_DUPLICATE_KEY = 1062
_FINGERPRINT_BYTES = 32
_CALLER_MAX = 64
_KEY_MAX = 128


@dataclass(frozen=True, slots=True)
class Idempotency:
    """Who asks, their key for this request, and the sha256 of the request.

    The fingerprint must cover everything that makes the request what it is
    (operation, scope, object id, payload, expected revision): a key reused
    for a different request is refused with :class:`IdempotencyConflict`, and
    one reused for an identical request gets the original answer.
    """

    caller: str
    key: str
    fingerprint: bytes

    def __post_init__(self) -> None:
        if not 0 < len(self.caller) <= _CALLER_MAX or not self.caller.isascii():
            raise ValueError(f"caller must be 1 to {_CALLER_MAX} ASCII characters")
        if not 0 < len(self.key) <= _KEY_MAX or not self.key.isascii():
            raise ValueError(f"idempotency key must be 1 to {_KEY_MAX} ASCII characters")
        if len(self.fingerprint) != _FINGERPRINT_BYTES:
            raise ValueError(f"fingerprint must be {_FINGERPRINT_BYTES} bytes (a sha256 digest)")


class IdempotencyConflict(Refusal):
    """The idempotency key was already used for a different request; nothing was changed."""


class Outcome(enum.IntEnum):
    """What a mutation did; stored as a TINYINT, so values never change meaning."""

    OK = 1
    NOT_FOUND = 2
    REVISION_MISMATCH = 3


@dataclass(frozen=True, slots=True)
class Recorded:
    """A mutation's outcome: for OK the new (write) or deleted (delete) revision,
    for REVISION_MISMATCH the record's revision (None: absent), else None."""

    outcome: Outcome
    revision: int | None
    created: bool = False
    replayed: bool = False


_REMEMBER = insert(idempotency_keys).values(
    caller=bindparam("caller"),
    idem_key=bindparam("idem_key"),
    fingerprint=bindparam("fingerprint"),
    outcome=bindparam("outcome"),
    revision=bindparam("revision"),
    created=bindparam("created"),
    # The database's clock, like the purge's: worker clocks may disagree.
    expires_at=func.timestampadd(
        literal_column("SECOND"), bindparam("retention_s"), func.utc_timestamp(6)
    ),
)
# A locking read: the failed INSERT already holds a shared lock on this row, so
# the read cannot wait, and the row cannot be purged before it is read.
_RECALL = (
    select(
        idempotency_keys.c.fingerprint,
        idempotency_keys.c.outcome,
        idempotency_keys.c.revision,
        idempotency_keys.c.created,
    )
    .where(
        idempotency_keys.c.caller == bindparam("caller"),
        idempotency_keys.c.idem_key == bindparam("idem_key"),
    )
    .with_for_update(read=True)
)
_PURGE = text(
    "DELETE FROM idempotency_keys WHERE expires_at < UTC_TIMESTAMP(6)"
    " ORDER BY expires_at LIMIT :limit"
)
_BEGIN = text("START TRANSACTION")
# COMMIT keeps the deadline: when the request's time is up it is not sent, the
# connection is discarded, and the server rolls back: the caller, told the
# deadline passed, finds nothing applied.
_COMMIT = text("COMMIT")
_ROLLBACK = text("ROLLBACK")
# A rollback is never refused for lack of time: refusing it would only cost the
# connection, since closing it rolls back as well.
_NO_DEADLINE = {DEADLINE_OPTION: None}


def _duplicate(exc: IntegrityError) -> bool:
    orig = exc.orig
    return bool(orig is not None and orig.args and orig.args[0] == _DUPLICATE_KEY)


def once(
    conn: Connection,
    idempotency: Idempotency,
    retention_s: int,
    change: Callable[[Connection], Recorded],
) -> Recorded | None:
    """Run ``change`` and record its outcome under the key, in one transaction.

    Returns the change's outcome; the stored outcome with ``replayed`` set if
    the key was already recorded for the same request (the change is rolled
    back); None if it was recorded for a different request (also rolled back).

    Any exception leaves the transaction open: the caller must discard the
    connection, which makes the server roll it back.
    """
    key = {"caller": idempotency.caller, "idem_key": idempotency.key}
    conn.execute(_BEGIN)
    recorded = change(conn)
    try:
        conn.execute(
            _REMEMBER,
            {
                **key,
                "fingerprint": idempotency.fingerprint,
                "outcome": int(recorded.outcome),
                "revision": recorded.revision,
                "created": recorded.created,
                "retention_s": retention_s,
            },
        )
    except IntegrityError as exc:
        if not _duplicate(exc):
            raise
        stored = conn.execute(_RECALL, key).one()
        conn.execute(_ROLLBACK, execution_options=_NO_DEADLINE)
        if bytes(stored.fingerprint) != idempotency.fingerprint:
            return None
        revision = None if stored.revision is None else int(stored.revision)
        return Recorded(Outcome(stored.outcome), revision, bool(stored.created), replayed=True)
    conn.execute(_COMMIT)
    return recorded


def purge(conn: Connection, limit: int) -> int:
    """Delete at most ``limit`` expired keys, oldest first; returns how many."""
    return int(conn.execute(_PURGE, {"limit": limit}).rowcount)
