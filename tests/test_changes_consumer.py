"""The change consumer against a private MariaDB with a binlog and the real
Redis: direct SQL invalidates both formats, a stale consumer is refused, a
standby takes over, positions survive restarts (``docs/changes.md``)."""

from __future__ import annotations

import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis
from sqlalchemy import create_engine, text

from dataservice.cache.controls import RolloutControls
from dataservice.cache.formats import CODECS, frame
from dataservice.cache.guard import FreshnessGuard, stream_status
from dataservice.changes.consumer import ChangeConsumer
from dataservice.changes.invalidator import Invalidator
from dataservice.changes.lease import Lease
from dataservice.changes.stream import RecordChange
from dataservice.config import Config
from dataservice.enums import CacheFormat
from dataservice.errors import ServiceSetupError, StaleToken
from dataservice.keys import CHANGES_LEASE_KEY, record_key, tombstone_key
from dataservice.localservices import TemporaryBinlogMariaDB
from dataservice.processes import WorkerProcess, dataservice_argv, worker_environ
from dataservice.proto import pb
from dataservice.settings import Settings
from dataservice.store.migrate import upgrade
from tests.conftest import SHIPPED_CONFIG, require

# The change stream's tests alone use this database.
CHANGES_REDIS_URL = "redis://127.0.0.1:6379/2"


@pytest.fixture(scope="module")
def binlog_url(config: Config) -> Iterator[str]:
    server = TemporaryBinlogMariaDB()
    try:
        server.start()
    except ServiceSetupError as exc:
        server.stop()
        require(False, f"a private MariaDB with a binlog ({exc})")
    url = server.url("dataservice")
    upgrade(url, config.database)
    yield url
    server.stop()


@pytest.fixture
def cache_redis() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(CHANGES_REDIS_URL)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


def plant(client: redis.Redis, scope: str, object_id: str, revision: int) -> None:
    body = CODECS[CacheFormat.V2].encode(pb.Record(object_id=object_id, revision=revision))
    for fmt in ("v1", "v2"):
        client.set(record_key(fmt, scope, object_id, 1), frame(revision, body))


def cached(client: redis.Redis, scope: str, object_id: str) -> int:
    return int(client.exists(*(record_key(f, scope, object_id, 1) for f in ("v1", "v2"))))


def wait_for(check: Callable[[], object], timeout_s: float = 5.0) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if check():
            return time.monotonic() - started
        time.sleep(0.01)
    raise AssertionError("timed out")


@pytest.fixture
def consumer(binlog_url: str, config: Config, cache_redis: redis.Redis) -> Iterator[ChangeConsumer]:
    settings = Settings(database_url=binlog_url, redis_url=CHANGES_REDIS_URL)
    with running_consumer(settings, config) as running:
        yield running


def test_a_change_made_by_direct_sql_invalidates_both_formats(
    consumer: ChangeConsumer, binlog_url: str, cache_redis: redis.Redis
) -> None:
    scope = f"t-{uuid.uuid4().hex[:10]}"
    plant(cache_redis, scope, "a", 1)
    plant(cache_redis, scope, "b", 1)
    engine = create_engine(binlog_url)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO records (scope, object_id, revision, payload, created_at, updated_at)"
                " VALUES (:s, 'a', 2, 'x', NOW(6), NOW(6)), (:s, 'b', 5, 'y', NOW(6), NOW(6))"
            ),
            {"s": scope},
        )
    took = wait_for(lambda: cached(cache_redis, scope, "a") + cached(cache_redis, scope, "b") == 0)
    assert took < 1.0
    assert cache_redis.get(tombstone_key(scope, "a")) == b"2"
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM records WHERE scope = :s AND object_id = 'b'"), {"s": scope})
    wait_for(lambda: cache_redis.get(tombstone_key(scope, "b")) == b"6")
    engine.dispose()


def test_a_stale_token_is_refused_and_changes_nothing(
    config: Config, cache_redis: redis.Redis
) -> None:
    lease = Lease(cache_redis, 60_000)
    first = lease.take()
    assert first is not None
    assert lease.take() is None
    invalidator = Invalidator(cache_redis, 60_000)
    plant(cache_redis, "s", "a", 1)
    cache_redis.delete(CHANGES_LEASE_KEY)  # the first holder's lease lapsed ...
    second = lease.take()  # ... and a standby took over
    assert second is not None
    assert second > first
    with pytest.raises(StaleToken):
        invalidator.apply(first, [RecordChange("s", "a", 2)], [1])
    assert cached(cache_redis, "s", "a") == 2
    assert not lease.renew(first)
    assert invalidator.apply(second, [RecordChange("s", "a", 2)], [1]) == 2


def _consumer_process(binlog_url: str, log_path: Path) -> WorkerProcess:
    settings = Settings(
        config_path=SHIPPED_CONFIG, database_url=binlog_url, redis_url=CHANGES_REDIS_URL
    )
    return WorkerProcess(
        dataservice_argv("changes"),
        worker_environ(settings),
        log_path,
        "changes",
    )


def _holder(client: redis.Redis) -> int:
    return int(client.get(CHANGES_LEASE_KEY) or 0)


@pytest.mark.timeout(90)
def test_one_consumer_applies_and_a_standby_takes_over_when_it_is_killed(
    binlog_url: str, cache_redis: redis.Redis, config: Config, tmp_path: Path
) -> None:
    first = _consumer_process(binlog_url, tmp_path / "first.log").start()
    try:
        wait_for(lambda: _holder(cache_redis) > 0, 20)
        token = _holder(cache_redis)
        second = _consumer_process(binlog_url, tmp_path / "second.log").start()
        try:
            time.sleep(config.changes.lease_ms / 1000)
            assert _holder(cache_redis) == token  # the standby waits
            first.send_signal(signal.SIGKILL)
            took = wait_for(lambda: _holder(cache_redis) > token, 20)
            # The dead consumer's lease lapses, then the standby takes it.
            assert took < config.changes.lease_ms / 1000 + 3
            scope = f"t-{uuid.uuid4().hex[:10]}"
            plant(cache_redis, scope, "a", 1)
            engine = create_engine(binlog_url)
            with engine.begin() as conn:
                conn.execute(
                    text(
                        "INSERT INTO records"
                        " (scope, object_id, revision, payload, created_at, updated_at)"
                        " VALUES (:s, 'a', 2, 'x', NOW(6), NOW(6))"
                    ),
                    {"s": scope},
                )
            engine.dispose()
            assert wait_for(lambda: cached(cache_redis, scope, "a") == 0, 10) < 2
        finally:
            second.stop()
    finally:
        first.stop()


def test_binlog_rotation_misses_nothing_and_a_purged_position_rotates_the_cache(
    binlog_url: str, config: Config, cache_redis: redis.Redis
) -> None:
    settings = Settings(database_url=binlog_url, redis_url=CHANGES_REDIS_URL)
    admin = create_engine(binlog_url, isolation_level="AUTOCOMMIT")
    scope = f"t-{uuid.uuid4().hex[:10]}"

    def write(object_id: str, revision: int) -> None:
        with admin.connect() as conn:
            conn.execute(
                text(
                    "INSERT INTO records (scope, object_id, revision, payload, created_at,"
                    " updated_at) VALUES (:s, :o, :r, 'x', NOW(6), NOW(6))"
                    " ON DUPLICATE KEY UPDATE revision = :r"
                ),
                {"s": scope, "o": object_id, "r": revision},
            )

    with running_consumer(settings, config) as consumer:
        plant(cache_redis, scope, "a", 1)
        plant(cache_redis, scope, "b", 1)
        write("a", 2)
        with admin.connect() as conn:
            conn.execute(text("FLUSH BINARY LOGS"))
        write("b", 2)
        wait_for(lambda: cached(cache_redis, scope, "a") + cached(cache_redis, scope, "b") == 0)
        assert consumer.state.position is not None
    controls = RolloutControls(cache_redis, config.cache)
    generation = controls.fetch().generation
    # The consumer is stopped; the server moves on and purges what it saved.
    with admin.connect() as conn:
        conn.execute(text("FLUSH BINARY LOGS"))
        conn.execute(text("FLUSH BINARY LOGS"))
        current = conn.execute(text("SHOW MASTER STATUS")).first()
        assert current is not None
        conn.execute(text(f"PURGE BINARY LOGS TO '{current[0]}'"))
    with running_consumer(settings, config):
        assert controls.fetch().generation == generation + 1
    admin.dispose()


@contextmanager
def running_consumer(settings: Settings, config: Config) -> Iterator[ChangeConsumer]:
    consumer = ChangeConsumer(settings, config)
    thread = threading.Thread(target=consumer.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: consumer.state.role == "active", 10)
        yield consumer
    finally:
        consumer.stop()
        thread.join(10)
        consumer.close()


def test_lag_grows_with_the_consumer_stopped_and_the_guard_follows(
    binlog_url: str, config: Config, cache_redis: redis.Redis
) -> None:
    changes = config.changes.model_copy(update={"max_lag_s": 1.0})
    quick = config.model_copy(update={"changes": changes})
    settings = Settings(database_url=binlog_url, redis_url=CHANGES_REDIS_URL)
    engagements: list[bool] = []
    guard = FreshnessGuard(cache_redis, 1.0, 50, on_change=engagements.append)
    assert not guard.allows_cache()  # no consumer has ever reported
    with running_consumer(settings, quick):
        wait_for(guard.allows_cache, 5)
        status = stream_status(cache_redis)
        assert status is not None
        assert float(status["lag_s"]) <= 1.0
    # Stopped: its status lapses within max_lag_s, and the guard engages.
    took = wait_for(lambda: not guard.allows_cache(), 5)
    assert took <= 1.5
    assert stream_status(cache_redis) is None
    with running_consumer(settings, quick):
        wait_for(guard.allows_cache, 5)
    assert engagements == [True, False, True, False]
