"""The private, binlog-enabled MariaDB that change-stream tests and demos start,
and the private instances that ``up`` starts and ``down`` stops."""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

import MySQLdb
import pytest
from dataservice_tools.localservices import (
    TemporaryBinlogMariaDB,
    amqp_reachable,
    down,
    ensure_management,
    free_port,
    mariadb_dir,
    mysql_reachable,
    rabbitmq_dir,
    redis_reachable,
    up,
)
from kombu import Connection

from dataservice.config.settings import Settings
from dataservice.errors import ServiceSetupError


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


@pytest.mark.slow
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


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_up_starts_a_private_rabbitmq_where_the_broker_does_not_answer(tmp_path: Path) -> None:
    # A port of its own: the system RabbitMQ on 5672 is left alone.
    port = free_port()
    settings = Settings(broker_url=f"amqp://guest:guest@127.0.0.1:{port}/")
    state = tmp_path / "state"
    state.mkdir()
    try:
        assert up(settings, state) == [f"rabbitmq on port {port}"]
        assert (rabbitmq_dir(state) / "mnesia").is_dir()
        with Connection(settings.broker_url, connect_timeout=5) as connection:
            queue = connection.SimpleQueue("localservices-test")
            queue.put({"hello": "rabbit"})
            message = queue.get(timeout=5)
            message.ack()
            queue.close()
        assert message.payload == {"hello": "rabbit"}
        assert up(settings, state) == []
    finally:
        stopped = down(state)
        shutil.rmtree(rabbitmq_dir(state).parent, ignore_errors=True)
    assert stopped == ["rabbitmq"]
    assert not amqp_reachable(settings.broker_url)


@pytest.mark.slow
@pytest.mark.timeout(30)
def test_up_starts_no_rabbitmq_where_one_refuses_or_the_broker_is_elsewhere(
    tmp_path: Path,
) -> None:
    with socket.socket() as taken:
        # Listens but never speaks AMQP: a port no second RabbitMQ could have.
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        settings = Settings(broker_url=f"amqp://guest:guest@127.0.0.1:{port}/")
        with pytest.raises(
            ServiceSetupError, match=f"127.0.0.1:{port}/ does not accept the connection"
        ):
            up(settings, tmp_path)
    elsewhere = Settings(broker_url="amqp://guest:guest@192.0.2.1:5672/")  # TEST-NET-1
    with pytest.raises(ServiceSetupError, match=r"192\.0\.2\.1:5672/ is unreachable"):
        up(elsewhere, tmp_path)
    directory = rabbitmq_dir(tmp_path)
    made = directory.exists()
    shutil.rmtree(directory.parent, ignore_errors=True)  # under /var/tmp when run as root
    assert not made


def test_the_management_api_of_a_rabbitmq_elsewhere_is_never_turned_on() -> None:
    with pytest.raises(ServiceSetupError, match="management API does not answer"):
        ensure_management("amqp://guest:guest@192.0.2.1:5672/")  # TEST-NET-1
