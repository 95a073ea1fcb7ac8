"""The private, binlog-enabled MariaDB that change-stream tests and demos start."""

from __future__ import annotations

import shutil
from pathlib import Path

import MySQLdb
import pytest

from dataservice.localservices import (
    TemporaryBinlogMariaDB,
    down,
    free_port,
    mariadb_dir,
    mysql_reachable,
    redis_reachable,
    up,
)
from dataservice.settings import Settings


@pytest.mark.timeout(60)
def test_private_mariadb_writes_a_row_format_binlog_and_goes_away() -> None:
    with TemporaryBinlogMariaDB() as server:
        conn = MySQLdb.connect(host="127.0.0.1", port=server.port, user="root")
        cursor = conn.cursor()
        cursor.execute(
            "SHOW VARIABLES WHERE Variable_name IN "
            "('log_bin', 'binlog_format', 'binlog_row_image', 'binlog_row_metadata')"
        )
        variables = dict(cursor.fetchall())
        conn.close()
        directory = server.directory
    assert variables == {
        "log_bin": "ON",
        "binlog_format": "ROW",
        "binlog_row_image": "FULL",
        "binlog_row_metadata": "FULL",
    }
    assert not mysql_reachable("127.0.0.1", server.port)
    assert not directory.exists()


@pytest.mark.timeout(90)
def test_up_starts_private_instances_only_where_nothing_answers(tmp_path: Path) -> None:
    redis_port, mariadb_port = free_port(), free_port()
    settings = Settings(
        broker_url=f"redis://127.0.0.1:{redis_port}/0",
        result_backend_url=f"redis://127.0.0.1:{redis_port}/0",
        redis_url=f"redis://127.0.0.1:{redis_port}/0",
        database_url=f"mysql+mysqldb://root@127.0.0.1:{mariadb_port}/dataservice",
    )
    state = tmp_path / "state"
    state.mkdir()
    try:
        started = up(settings, state)
        assert started == [f"redis on port {redis_port}", f"mariadb on port {mariadb_port}"]
        assert redis_reachable(settings.broker_url)
        assert mysql_reachable("127.0.0.1", mariadb_port)
        assert up(settings, state) == []
    finally:
        stopped = down(state)
        shutil.rmtree(mariadb_dir(state).parent, ignore_errors=True)
    assert stopped == ["redis", "mariadb"]
