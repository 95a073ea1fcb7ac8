"""The change consumer against a private MariaDB with a binlog and the real
Redis: direct SQL invalidates both formats, a stale consumer is refused, a
standby takes over, positions survive restarts (``docs/changes.md``)."""

from __future__ import annotations

import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from dataservice_tools.testkit.waits import eventually
from sqlalchemy import create_engine, text

from dataservice.broker.celery import celery_app
from dataservice.cache.controls import RolloutControls
from dataservice.cache.guard import FreshnessGuard, stream_status
from dataservice.changes.consumer import (
    CHANGES_COMMAND,
    ChangeConsumer,
    ConsumerState,
    publish_status,
)
from dataservice.changes.invalidator import Invalidator
from dataservice.changes.lease import Lease
from dataservice.changes.stream import RecordChange
from dataservice.compat.celery import broadcast_request
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.errors import StaleToken
from dataservice.redis.keys import CHANGES_FRESH_KEY, CHANGES_LEASE_KEY, tombstone_key
from tests.harness import changes as changes_harness
from tests.harness.changes import (
    CHANGES_REDIS_URL,
    cached,
    consumer_process,
    holder,
    plant,
    running_consumer,
)
from tests.harness.support import counter, on_redis

binlog_url = changes_harness.binlog_url
cache_redis = changes_harness.cache_redis


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
    transactions = counter("dataservice_changes_transactions")
    invalidated = counter("dataservice_changes_invalidated")
    engine = create_engine(binlog_url)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO records (scope, object_id, revision, payload, created_at, updated_at)"
                " VALUES (:s, 'a', 2, 'x', NOW(6), NOW(6)), (:s, 'b', 5, 'y', NOW(6), NOW(6))"
            ),
            {"s": scope},
        )
    started = time.monotonic()
    eventually(
        lambda: cached(cache_redis, scope, "a") + cached(cache_redis, scope, "b") == 0, timeout=5.0
    )
    took = time.monotonic() - started
    assert took < 1.0
    assert cache_redis.get(tombstone_key(scope, "a")) == b"2"
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM records WHERE scope = :s AND object_id = 'b'"), {"s": scope})
    eventually(lambda: cache_redis.get(tombstone_key(scope, "b")) == b"6", timeout=5.0)
    engine.dispose()
    # The tombstone is written before the transaction is counted.
    eventually(lambda: counter("dataservice_changes_transactions") >= transactions + 2, timeout=5.0)
    assert counter("dataservice_changes_transactions") == transactions + 2
    assert counter("dataservice_changes_invalidated") == invalidated + 4


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


@pytest.mark.fault
@pytest.mark.timeout(90)
def test_one_consumer_applies_and_a_standby_takes_over_when_it_is_killed(
    binlog_url: str, cache_redis: redis.Redis, config: Config, tmp_path: Path
) -> None:
    first = consumer_process(binlog_url, tmp_path / "first.log").start()
    try:
        eventually(lambda: holder(cache_redis) > 0, timeout=20)
        token = holder(cache_redis)
        second = consumer_process(binlog_url, tmp_path / "second.log").start()
        try:
            time.sleep(config.changes.lease_ms / 1000)
            assert holder(cache_redis) == token  # the standby waits
            first.send_signal(signal.SIGKILL)
            started = time.monotonic()
            eventually(lambda: holder(cache_redis) > token, timeout=20)
            took = time.monotonic() - started
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
            started = time.monotonic()
            eventually(lambda: cached(cache_redis, scope, "a") == 0, timeout=10)
            assert time.monotonic() - started < 2
            # A worker node: it answers Celery's control channel with its state.
            control = celery_app("changes-probe", on_redis(Settings(), CHANGES_REDIS_URL), config)
            inspect = control.control.inspect(timeout=2.0)
            states = broadcast_request(inspect, CHANGES_COMMAND) or {}
            queues = inspect.active_queues() or {}
            control.close()
            assert [s["role"] for s in states.values()] == ["active"]
            assert [s["token"] for s in states.values()] == [holder(cache_redis)]
            # It has asked the server how far behind it is.
            assert all(s["lag_events"] >= 0 and s["lag_bytes"] >= 0 for s in states.values())
            assert all(q[0]["name"] == "changes" for q in queues.values())
            assert len(queues) == 1
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
        eventually(
            lambda: cached(cache_redis, scope, "a") + cached(cache_redis, scope, "b") == 0,
            timeout=5.0,
        )
        assert consumer.state.position is not None
    controls = RolloutControls(cache_redis, config.cache)
    generation = controls.fetch().generation
    # The consumer is stopped; the server moves on and purges what it saved.
    with admin.connect() as conn:
        conn.execute(text("FLUSH BINARY LOGS"))
        conn.execute(text("FLUSH BINARY LOGS"))
        current = conn.execute(text("SHOW MASTER STATUS")).first()
        assert current is not None

    def purged() -> bool:
        # The server keeps a log its replication thread for the stopped
        # consumer still reads; that thread ends soon after the connection.
        with admin.connect() as conn:
            conn.execute(text(f"PURGE BINARY LOGS TO '{current[0]}'"))
            return len(conn.execute(text("SHOW BINARY LOGS")).all()) == 1

    eventually(purged, timeout=5.0)
    with running_consumer(settings, config):
        assert controls.fetch().generation == generation + 1
    admin.dispose()


@pytest.mark.fault
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
        eventually(guard.allows_cache, timeout=5)
        status = stream_status(cache_redis)
        assert status is not None
        assert float(status["lag_s"]) <= 1.0
    # Stopped: its status lapses within max_lag_s, and the guard engages.
    started = time.monotonic()
    eventually(lambda: not guard.allows_cache(), timeout=5)
    took = time.monotonic() - started
    # The status's own expiry (max_lag_s, Redis's clock) and a few of the guard's 50 ms refreshes.
    assert took <= changes.max_lag_s + 0.5
    assert stream_status(cache_redis) is None
    with running_consumer(settings, quick):
        eventually(guard.allows_cache, timeout=5)
    assert engagements == [True, False, True, False]


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_busy_binlog_of_other_tables_keeps_the_lease_and_the_reports(
    binlog_url: str, config: Config, cache_redis: redis.Redis
) -> None:
    # The server sends no heartbeat while it has events to send: the
    # transactions of other tables must be what keeps the lease renewed.
    quick = config.model_copy(
        update={"changes": config.changes.model_copy(update={"lease_ms": 1000, "max_lag_s": 2.0})}
    )
    settings = Settings(database_url=binlog_url, redis_url=CHANGES_REDIS_URL)
    engine = create_engine(binlog_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text("CREATE TABLE IF NOT EXISTS unrelated (n INT PRIMARY KEY)"))
        conn.execute(text("DELETE FROM unrelated"))
    scope = f"t-{uuid.uuid4().hex[:10]}"
    with running_consumer(settings, quick) as consumer:
        token = holder(cache_redis)
        transactions = consumer.state.transactions
        # Active comes a moment before the first report.
        eventually(lambda: stream_status(cache_redis) is not None, timeout=5.0)
        with engine.connect() as conn:
            started = time.monotonic()
            n = 0
            while time.monotonic() - started < 3.0:  # three leases long
                conn.execute(text("INSERT INTO unrelated VALUES (:n)"), {"n": n})
                n += 1
                assert holder(cache_redis) == token
                assert stream_status(cache_redis) is not None
        assert consumer.state.role == "active"
        # Transactions that left records alone are not counted as changes.
        assert consumer.state.transactions == transactions
        plant(cache_redis, scope, "a", 1)
        with engine.connect() as conn:
            changes_harness.upsert(conn, scope, "a", 2)
        eventually(lambda: cached(cache_redis, scope, "a") == 0, timeout=5.0)
    engine.dispose()


def test_the_guard_holds_while_the_lag_is_unknown_or_over_the_bound(
    cache_redis: redis.Redis,
) -> None:
    now = [0.0]
    guard = FreshnessGuard(cache_redis, 5.0, 0, clock=lambda: now[0])

    def allows(lag_s: float) -> bool:
        publish_status(cache_redis, ConsumerState("active", 7, lag_s=lag_s), 5.0)
        now[0] += 1
        return guard.allows_cache()

    assert allows(0.0)
    assert allows(4.9)
    assert not allows(5.0)
    # A consumer back after an absence cannot yet tell how far behind it is.
    assert not allows(-1.0)
    assert allows(0.3)
    # The word lasts only as long as the bound allows after this report: a
    # consumer that stalls now closes the cache within bound - lag, not bound.
    assert 4_600 < cache_redis.pttl(CHANGES_FRESH_KEY) <= 4_700
    assert allows(3.0)
    assert 1_900 < cache_redis.pttl(CHANGES_FRESH_KEY) <= 2_000
    cache_redis.delete(CHANGES_FRESH_KEY)
    now[0] += 1
    assert not guard.allows_cache()
