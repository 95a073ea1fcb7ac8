"""The records table's row events read for their keys and revisions
(``dataservice/changes/rows.py``) give what mysql-replication's own decoding
gives, on the same binlog of a private MariaDB: every column type the plan
passes over, nulls, long values, key moves and deletes; and an event outside
the plan is left to the library, untouched."""

from __future__ import annotations

import os
import random
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.row_event import (
    DeleteRowsEvent,
    RowsEvent,
    UpdateRowsEvent,
    WriteRowsEvent,
)
from sqlalchemy import Engine, text

from dataservice.changes.rows import RecordChange, library_changes, read_keys, record_changes
from dataservice.changes.stream import Position, connection_settings, pymysql_connect
from tests.harness import changes as changes_harness
from tests.harness.binlog import BinlogDatabase

Decode = Callable[[Any], list[RecordChange] | None]


admin = changes_harness.admin


@pytest.fixture
def probe(admin: Engine) -> Iterator[str]:
    """A table of the test's own, dropped after it."""
    name = f"probe_{uuid.uuid4().hex[:8]}"
    yield name
    with admin.connect() as conn:
        conn.execute(text(f"DROP TABLE IF EXISTS {name}"))


def _position(admin: Engine) -> Position:
    with admin.connect() as conn:
        row = conn.execute(text("SHOW MASTER STATUS")).one()
    return Position(str(row[0]), int(row[1]))


def _created(admin: Engine, table: str, columns: str) -> Position:
    """``table`` made with ``columns``; the binlog's position after it."""
    with admin.begin() as conn:
        conn.execute(text(f"CREATE TABLE {table} ({columns})"))
    return _position(admin)


def _decoded(binlog: BinlogDatabase, start: Position, table: str, decode: Decode) -> list[Any]:
    """``decode`` of every rows event of ``table`` from ``start`` to now."""
    settings, schema = connection_settings(binlog.admin_url)
    reader = BinLogStreamReader(
        connection_settings=settings,
        server_id=random.randint(10_000, 2**31),
        blocking=False,
        resume_stream=True,
        log_file=start.log_file,
        log_pos=start.log_pos,
        only_events=[WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent],
        only_schemas=[schema],
        only_tables=[table],
        is_mariadb=False,
        enable_logging=False,
        pymysql_wrapper=pymysql_connect,
    )
    try:
        return [decode(event) for event in reader]
    finally:
        reader.close()


def _both(binlog: BinlogDatabase, start: Position, table: str) -> tuple[list[Any], list[Any]]:
    return (
        _decoded(binlog, start, table, read_keys),
        _decoded(binlog, start, table, library_changes),
    )


def _values(rows: list[tuple[Any, ...]]) -> tuple[str, dict[str, Any]]:
    """A multi-row VALUES list and its parameters."""
    names = [f"(:s{i}, :o{i}, :r{i}, :p{i}, NOW(6), NOW(6))" for i in range(len(rows))]
    params: dict[str, Any] = {}
    for i, (scope, object_id, revision, payload) in enumerate(rows):
        params |= {f"s{i}": scope, f"o{i}": object_id, f"r{i}": revision, f"p{i}": payload}
    return ", ".join(names), params


def test_the_records_tables_events_read_as_the_library_decodes_them(
    binlog_database: BinlogDatabase, admin: Engine
) -> None:
    scope = f"rows-{uuid.uuid4().hex[:8]}"
    # Payloads from empty to 70 KB (a MEDIUMBLOB's 3-byte length), ids up to
    # the column's 128 characters.
    sizes = [0, 1, 255, 256, 65_535, 65_536, 70_000] + [1024] * 300
    rows = [
        (scope, f"{n:04d}-" + "x" * (n % 124), 1, os.urandom(size)) for n, size in enumerate(sizes)
    ]
    start = _position(admin)
    values, params = _values(rows)
    columns = "(scope, object_id, revision, payload, created_at, updated_at)"
    with admin.begin() as conn:
        conn.execute(text(f"INSERT INTO records {columns} VALUES {values}"), params)
    with admin.begin() as conn:  # both images of every row: a batch's upsert
        conn.execute(
            text(
                f"INSERT INTO records {columns} VALUES {values} ON DUPLICATE KEY UPDATE "
                "revision = revision + 1, payload = VALUES(payload), updated_at = NOW(6)"
            ),
            params,
        )
    moved = [object_id for _, object_id, _, _ in rows[:20]]
    with admin.begin() as conn:
        conn.execute(
            text(
                "UPDATE records SET object_id = CONCAT('m-', object_id), revision = revision + 1"
                " WHERE scope = :scope AND object_id IN :ids"
            ),
            {"scope": scope, "ids": tuple(moved)},
        )
        conn.execute(
            text("DELETE FROM records WHERE scope = :scope AND object_id LIKE '01%'"),
            {"scope": scope},
        )

    fast, library = _both(binlog_database, start, "records")

    assert None not in fast, "an event of the records table was left to the library"
    assert fast == library
    changes = [change for event in fast for change in event]
    assert len(changes) == len(rows) * 2 + 20 * 2 + 100  # writes, upserts, moves, deletes
    assert {change.scope for change in changes} == {scope}
    assert RecordChange(scope, moved[0], 3) in changes  # the old key, as if deleted
    assert RecordChange(scope, f"m-{moved[0]}", 3) in changes


def test_every_column_type_passed_over_is_passed_over_exactly(
    binlog_database: BinlogDatabase, admin: Engine, probe: str
) -> None:
    start = _created(
        admin,
        probe,
        "a TINYINT, b SMALLINT UNSIGNED, c MEDIUMINT, d INT, e FLOAT, f DOUBLE,"
        " scope VARCHAR(64) CHARACTER SET ascii NOT NULL,"
        " g YEAR, h DATE, i TIMESTAMP(0) NULL, j DATETIME(6), k TIME(3),"
        " l TIMESTAMP(5) NULL,"
        " object_id VARCHAR(300) CHARACTER SET utf8mb4 NOT NULL,"
        " m CHAR(10), n CHAR(100) CHARACTER SET utf8mb4, o MEDIUMTEXT, p LONGBLOB,"
        " q TINYBLOB,"
        " revision BIGINT UNSIGNED NOT NULL, r VARBINARY(20),"
        " PRIMARY KEY (scope, object_id)",
    )
    with admin.begin() as conn:
        conn.execute(
            text(
                f"INSERT INTO {probe} VALUES (-1, 65535, -8388608, 2147483647, 1.5, -2.25,"
                " 's', 2024, '2024-02-29', '2024-01-01 00:00:00', '2024-01-01 12:34:56.123456',"
                " '-838:59:59.999', '2030-01-01 00:00:00.12345', :id, 'ten chars!', :wide,"
                " :text, :blob, 'tiny', 18446744073709551615, 'bin')"
            ),
            {"id": "ü" * 300, "wide": "ß" * 100, "text": "t" * 70_000, "blob": os.urandom(100_000)},
        )
        # Every column that may be null, null.
        conn.execute(
            text(f"INSERT INTO {probe} (scope, object_id, revision) VALUES ('s', 'nulls', 0)")
        )
        conn.execute(text(f"UPDATE {probe} SET revision = 7, a = NULL, p = 'x'"))
        conn.execute(text(f"DELETE FROM {probe} WHERE object_id = 'nulls'"))

    fast, library = _both(binlog_database, start, probe)

    assert None not in fast
    assert fast == library
    assert [change for event in fast for change in event][-1] == RecordChange("s", "nulls", 8)


def test_an_event_outside_the_plan_is_left_to_the_library_as_it_was(
    binlog_database: BinlogDatabase, admin: Engine, probe: str
) -> None:
    start = _created(
        admin,
        probe,
        "scope VARCHAR(64), object_id VARCHAR(64), revision BIGINT NULL,"
        " amount DECIMAL(10, 2) NULL, PRIMARY KEY (scope, object_id)",
    )
    with admin.begin() as conn:
        conn.execute(text(f"INSERT INTO {probe} VALUES ('s', 'a', 1, 2.50)"))
    with admin.begin() as conn:
        conn.execute(text(f"ALTER TABLE {probe} DROP COLUMN amount"))
    with admin.begin() as conn:
        # Planned but for its null revision: found in the middle of the rows.
        conn.execute(text(f"INSERT INTO {probe} VALUES ('s', 'b', 1), ('s', 'c', NULL)"))

    fast = _decoded(binlog_database, start, probe, read_keys)
    assert fast == [None, None]  # the DECIMAL's table map; the null revision

    # Given back whole: what the library then decodes from the same event.
    def first_then_library(event: Any) -> list[RecordChange]:
        assert read_keys(event) is None
        return record_changes(event)

    assert _decoded(binlog_database, start, probe, first_then_library) == _decoded(
        binlog_database, start, probe, library_changes
    )


def test_the_library_internals_read_are_where_they_were(
    binlog_database: BinlogDatabase, admin: Engine
) -> None:
    start = _position(admin)
    with admin.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO records (scope, object_id, revision, payload, created_at, updated_at)"
                " VALUES ('pin', :id, 1, 'x', NOW(6), NOW(6))"
            ),
            {"id": uuid.uuid4().hex},
        )

    def pinned(event: Any) -> None:
        # What rows.py reads beyond the library's documented surface.
        assert event.complete is True
        assert isinstance(event.event_size, int)
        assert isinstance(event.packet.read_bytes, int)
        assert callable(event.packet.read)
        assert callable(event.packet.unread)
        assert isinstance(event.columns_present_bitmap, bytes)
        kinds = {column.name: column for column in event.columns}
        assert {"name", "type", "unsigned", "character_set_name"} <= set(vars(kinds["scope"]))
        assert kinds["object_id"].max_length == 128
        assert kinds["payload"].length_size == 3
        assert kinds["updated_at"].fsp == 6
        assert RowsEvent.charset_to_encoding("utf8mb4") == "utf8"

    _decoded(binlog_database, start, "records", pinned)
