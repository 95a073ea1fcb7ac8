"""The private, binlog-enabled MariaDB that change-stream tests and demos start."""

from __future__ import annotations

import MySQLdb
import pytest

from dataservice.localservices import TemporaryBinlogMariaDB, mysql_reachable


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
