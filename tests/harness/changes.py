"""What the change stream's tests share: a private MariaDB with a binlog, the
cache's Redis database (2: the change stream's tests alone use it), planted
entries, and consumers run in a thread or as ``dataservice changes``."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis
from dataservice_tools.testkit.waits import eventually
from sqlalchemy import Connection, Engine, create_engine, text

from dataservice.cache.formats import CODECS, frame
from dataservice.changes.consumer import ChangeConsumer
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.enums import CacheFormat
from dataservice.ops.processes import WorkerProcess
from dataservice.proto import pb
from dataservice.redis.keys import CHANGES_LEASE_KEY, record_key, tombstone_key
from dataservice.store.migrate import upgrade
from tests.conftest import SHIPPED_CONFIG, started_binlog_mariadb
from tests.harness.binlog import BinlogDatabase

CHANGES_REDIS_URL = "redis://127.0.0.1:6379/2"

UPSERT = text(
    "INSERT INTO records (scope, object_id, revision, payload, created_at, updated_at)"
    " VALUES (:s, :o, :r, 'x', NOW(6), NOW(6)) ON DUPLICATE KEY UPDATE revision = :r"
)


@pytest.fixture(scope="module")
def binlog_url(config: Config) -> Iterator[str]:
    server = started_binlog_mariadb()
    url = server.url("dataservice")
    upgrade(url, config.database)
    yield url
    server.stop()


@pytest.fixture
def admin(binlog_database: BinlogDatabase) -> Iterator[Engine]:
    """Root on the binlog database, in autocommit."""
    engine = create_engine(binlog_database.admin_url, isolation_level="AUTOCOMMIT")
    yield engine
    engine.dispose()


@pytest.fixture
def cache_redis() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(CHANGES_REDIS_URL)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


def plant(
    client: redis.Redis, scope: str, object_id: str, revision: int, generation: int = 1
) -> None:
    """Both formats at ``revision``, as a fill would leave them (tombstones unchecked)."""
    record = pb.Record(object_id=object_id, revision=revision)
    for fmt in CacheFormat:
        entry = frame(revision, CODECS[fmt].encode(record))
        client.set(record_key(fmt.value, scope, object_id, generation), entry)


def cached(client: redis.Redis, scope: str, object_id: str, generation: int = 1) -> int:
    """How many formats hold an entry for the record in ``generation``."""
    return int(
        client.exists(*(record_key(f.value, scope, object_id, generation) for f in CacheFormat))
    )


def upsert(conn: Connection, scope: str, object_id: str, revision: int) -> None:
    conn.execute(UPSERT, {"s": scope, "o": object_id, "r": revision})


def change(
    engine: Engine, client: redis.Redis, scope: str, object_id: str, revision: int, gen: int
) -> None:
    """An entry at ``revision - 1``, then a commit of ``revision``: only the
    change's invalidation removes the entry."""
    plant(client, scope, object_id, revision - 1, gen)
    with engine.begin() as conn:
        upsert(conn, scope, object_id, revision)


def tomb(client: redis.Redis, scope: str, object_id: str) -> int:
    """The record's tombstone (0: none)."""
    return int(client.get(tombstone_key(scope, object_id)) or 0)


def with_changes_config(config: Config, **changes: float) -> Config:
    """``config`` with some of ``changes.*`` set (``lease_ms``, ``reconnect_max_s``, ...)."""
    return config.model_copy(update={"changes": config.changes.model_copy(update=changes)})


def holder(client: redis.Redis) -> int:
    """The active consumer's fencing token; 0 when none holds the lease."""
    return int(client.get(CHANGES_LEASE_KEY) or 0)


@contextmanager
def running_consumer(settings: Settings, config: Config) -> Iterator[ChangeConsumer]:
    consumer = ChangeConsumer(settings, config)
    thread = threading.Thread(target=consumer.run, daemon=True)
    thread.start()
    try:
        eventually(lambda: consumer.state.role == "active", timeout=10)
        yield consumer
    finally:
        consumer.stop()
        thread.join(10)
        consumer.close()


def consumer_process(
    binlog_url: str, log_path: Path, config_path: Path = SHIPPED_CONFIG
) -> WorkerProcess:
    """``dataservice changes`` against ``binlog_url`` and the change stream's
    Redis (its broker too: the consumer is a worker node)."""
    settings = Settings(
        config_path=config_path,
        broker_url=CHANGES_REDIS_URL,
        result_backend_url=CHANGES_REDIS_URL,
        database_url=binlog_url,
        redis_url=CHANGES_REDIS_URL,
    )
    return WorkerProcess.for_command(settings, log_path, "changes")
