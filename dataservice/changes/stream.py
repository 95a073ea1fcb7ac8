"""The binlog, read as committed changes to records.

:class:`BinlogChanges` tails the server's binlog (ROW format) with
``mysql-replication`` and yields, per committed transaction, every record it
changed with the lowest revision a cache fill may still bring for it
(:class:`Committed`; none for a transaction that left records alone), and the
position after its commit. Every transaction is yielded, so that a consumer
reading a busy binlog of other tables still renews its lease and reports its
lag; the consumer's own position saves come as :class:`Idle`, so that saving
a position never calls for saving another. Between transactions it yields
:class:`Idle` at least every ``heartbeat_s`` while the database is quiet.
File and position, not GTIDs: ``is_mariadb=False`` resumes from them on
MariaDB too (``docs/changes.md``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pymysql
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.event import HeartbeatLogEvent, QueryEvent, RotateEvent, XidEvent
from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent
from sqlalchemy.engine import make_url

from dataservice.changes.grants import POSITIONS_TABLE
from dataservice.changes.rows import RecordChange, record_changes

RECORDS_TABLE = "records"
# Statements that change rows without row events: the cache cannot be told
# which records, so the whole namespace goes (a generation rotation).
_WHOLESALE = re.compile(r"^\s*(truncate|drop|rename)\b", re.IGNORECASE)


@dataclass(frozen=True, slots=True, order=True)
class Position:
    log_file: str
    log_pos: int


@dataclass(frozen=True, slots=True)
class Committed:
    changes: tuple[RecordChange, ...]
    position: Position
    # The commit's time on the server (Unix seconds), for the lag.
    timestamp: int
    # A statement replaced rows wholesale: no list of records can cover it.
    wholesale: bool = False


@dataclass(frozen=True, slots=True)
class Idle:
    position: Position
    # A heartbeat: the server had nothing more to send. A rotation is Idle too,
    # but says nothing of how far behind the reader is.
    caught_up: bool = True


def connection_settings(url: str) -> tuple[dict[str, Any], str]:
    parsed = make_url(url)
    settings = {
        "host": parsed.host or "127.0.0.1",
        "port": parsed.port or 3306,
        "user": parsed.username or "root",
        "password": parsed.password or "",
    }
    return settings, parsed.database or "dataservice"


def pymysql_connect(**settings: Any) -> Any:
    """pymysql's connect, under the keyword it wants: the library still
    passes the deprecated ``db`` for its control connection."""
    if "db" in settings:
        settings["database"] = settings.pop("db")
    return pymysql.connect(**settings)


class BinlogChanges:
    def __init__(
        self, url: str, server_id: int, start: Position | None, heartbeat_s: float
    ) -> None:
        settings, self.schema = connection_settings(url)
        # The server sends at least a heartbeat every heartbeat_s: a longer
        # silence is a connection gone half-open, which the library reconnects.
        settings["read_timeout"] = max(2, math.ceil(3 * heartbeat_s))
        self._reader = BinLogStreamReader(
            connection_settings=settings,
            server_id=server_id,
            blocking=True,
            resume_stream=start is not None,
            log_file=start.log_file if start else None,
            log_pos=start.log_pos if start else None,
            only_events=[
                WriteRowsEvent,
                UpdateRowsEvent,
                DeleteRowsEvent,
                XidEvent,
                QueryEvent,
                RotateEvent,
                HeartbeatLogEvent,
            ],
            only_schemas=[self.schema],
            slave_heartbeat=heartbeat_s,
            # File and position resume on MariaDB too (see the module docstring).
            is_mariadb=False,
            enable_logging=False,
            pymysql_wrapper=pymysql_connect,
        )

    @property
    def position(self) -> Position:
        return Position(str(self._reader.log_file), int(self._reader.log_pos))

    def __iter__(self) -> Iterator[Committed | Idle]:
        """Every event the reader passes yields: the consumer renews its lease
        between items, so a long transaction must not starve it."""
        pending: list[RecordChange] = []
        # Tables the transaction wrote: is it only the consumer's own position save?
        tables: set[str] = set()
        for event in self._reader:
            if isinstance(event, (WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent)):
                tables.add(event.table)
                if event.table == RECORDS_TABLE:
                    pending.extend(record_changes(event))
                yield Idle(self.position, caught_up=False)
            elif isinstance(event, QueryEvent):
                if RECORDS_TABLE in event.query and _WHOLESALE.match(event.query):
                    # DDL commits on its own, with no Xid to end it.
                    yield Committed((), self.position, event.timestamp, wholesale=True)
                else:
                    yield Idle(self.position, caught_up=False)
            elif isinstance(event, XidEvent):
                if tables == {POSITIONS_TABLE}:
                    yield Idle(self.position, caught_up=False)
                else:
                    yield Committed(tuple(pending), self.position, event.timestamp)
                pending, tables = [], set()
            elif isinstance(event, HeartbeatLogEvent):
                yield Idle(self.position)
            else:
                yield Idle(self.position, caught_up=False)

    def close(self) -> None:
        self._reader.close()
