"""How far the change consumer is behind the server, in events and in bytes.

:func:`behind` asks the server, from a binlog position: **bytes** from
``SHOW BINARY LOGS`` (the rest of the position's file and every later one:
cheap and exact) and **events** counted with ``SHOW BINLOG EVENTS ... LIMIT``
over the same files, every binlog event of every schema, up to
:data:`EVENTS_CAP`. A count that reaches the cap means *at least* that many:
a consumer far behind does not make the server read its whole binlog every
second. :class:`LagProbe` asks on a connection of its own and never raises: a
figure it cannot get is :data:`UNKNOWN` (-1), and the consumer carries on
(``docs/changes.md``, "How far behind").

The consumer's user may ask: ``SHOW BINARY LOGS`` and, on MariaDB,
``SHOW BINLOG EVENTS`` need ``BINLOG MONITOR``; on MySQL 8 ``SHOW BINLOG
EVENTS`` needs ``REPLICATION SLAVE``. It holds both.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from sqlalchemy import Connection, create_engine, text
from sqlalchemy.exc import DBAPIError

from dataservice.changes.server import reason
from dataservice.changes.stream import Position

log = logging.getLogger(__name__)

# Counting reads events off the server's disk and sends them all over, and
# MariaDB holds the binlog's lock while it reads the active file, so commits
# wait meanwhile: at most this many a report (well under a millisecond).
EVENTS_CAP = 1_000
# The probe shares the consumer's thread: a server slow to answer must hold up
# the lease renewals behind it (every third of the lease) for well under a lease.
_TIMEOUT_S = 1

_EVENTS = text("SHOW BINLOG EVENTS IN :log_file FROM :log_pos LIMIT :limit")


@dataclass(frozen=True, slots=True)
class Behind:
    # -1: unknown. ``events`` is at most the cap: equal to it means at least that many.
    events: int
    bytes: int


UNKNOWN = Behind(-1, -1)


def behind(conn: Connection, position: Position, cap: int = EVENTS_CAP) -> Behind:
    """How far ``position`` is from the end of the server's binlog. Raises
    ``LookupError`` when the server no longer has the position's file."""
    logs = [(_text(row[0]), int(row[1])) for row in conn.execute(text("SHOW BINARY LOGS"))]
    names = [name for name, _ in logs]
    if position.log_file not in names:
        raise LookupError(f"the server has no binlog {position.log_file}")
    at = names.index(position.log_file)
    later = logs[at + 1 :]
    rest = max(0, logs[at][1] - position.log_pos) + sum(size for _, size in later)
    events = _count(conn, position, cap)
    for name, _ in later:
        if events >= cap:
            break
        # A file's first event is at 4, after its magic number.
        events += _count(conn, Position(name, 4), cap - events)
    return Behind(min(events, cap), rest)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _count(conn: Connection, start: Position, limit: int) -> int:
    params = {"log_file": start.log_file, "log_pos": start.log_pos, "limit": limit}
    return len(conn.execute(_EVENTS, params).all())


# The seconds of a consumer that has read nothing yet from behind the server's
# end: it cannot tell the age of what it has still to read.
UNKNOWN_LAG_S = -1.0


def describe_lag(lag_s: float) -> str:
    """``lag_s`` as a person reads it: unknown, or seconds."""
    return "? s" if lag_s < 0 else f"{lag_s:.1f} s"


def describe_events(events: int, cap: int = EVENTS_CAP) -> str:
    """``events`` as a person reads it: unknown, at least the cap, or the count."""
    if events < 0:
        return "? events"
    if events >= cap:
        return f"at least {cap:,} events"
    return f"{events:,} event" + ("" if events == 1 else "s")


class LagProbe:
    """:func:`behind` on a connection of its own: never raises, warns once."""

    def __init__(self, url: str) -> None:
        self._engine = create_engine(
            url,
            pool_size=1,
            max_overflow=0,
            pool_recycle=300,
            isolation_level="AUTOCOMMIT",
            connect_args={
                "connect_timeout": _TIMEOUT_S,
                "read_timeout": _TIMEOUT_S,
                # An event's Info is whatever its statement held, payload bytes
                # included (MariaDB annotates row events with the statement):
                # never decoded, only counted.
                "use_unicode": False,
            },
        )
        self._failing = False

    def measure(self, position: Position) -> Behind:
        try:
            with self._engine.connect() as conn:
                found = behind(conn, position)
        # The figure only informs: no failure of it may end the active spell.
        except Exception as exc:
            if not self._failing:
                why = reason(exc) if isinstance(exc, DBAPIError) else str(exc) or repr(exc)
                log.warning(
                    "change consumer: cannot tell how far behind the server it is (%s); "
                    "reporting it as unknown (-1) until it can",
                    why,
                )
            self._failing = True
            return UNKNOWN
        if self._failing:
            log.info("change consumer: events behind the server known again")
            self._failing = False
        return found

    def close(self) -> None:
        self._engine.dispose()
