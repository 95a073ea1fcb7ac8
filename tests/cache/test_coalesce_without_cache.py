"""Acceptance: coalescing holds when the cache is not read.

The cache is bypassed exactly when the database needs coalescing most: the
change stream has stopped (the freshness guard), an operator bypassed it, or
its Redis is gone. Concurrent ``ALLOW_CACHED`` reads of one key still share
one database read, within a process always and across replicas while Redis
answers; a ``PRIMARY`` read never takes a read that began before it arrived.

Three interactive replicas, each database operation slowed by
``READ_DELAY_MS`` so that the burst is really concurrent (as in
``test_cache_stampede.py``). The database's general log counts the reads.
"""

from __future__ import annotations

import dataclasses
import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from dataservice_tools.localservices import PrivateRedis
from dataservice_tools.testkit.bursts import Outcome, burst
from dataservice_tools.testkit.counting_database import DATABASE, CountingDatabase
from dataservice_tools.testkit.replicas import Replicas, replicas, until_each_answers
from sqlalchemy import text

from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.enums import ReadMode
from dataservice.redis.keys import record_key
from tests.harness.support import scraped, scraped_sample, with_changes, with_retry

REPLICAS = 3
READS = 150
READ_DELAY_MS = 600
LOCK_LEASE_MS = 5000
TIMEOUT_S = 30.0
PAYLOAD = b"shared, not cached" * 16
HOT = "hot"
WARM = "warm"


def _slow(settings: Settings, path: Path, *, guard: bool) -> Settings:
    return with_changes(
        settings,
        path,
        {
            ("database", "injected_delay_ms"): READ_DELAY_MS,
            ("cache", "lock_lease_ms"): LOCK_LEASE_MS,
            # On: no change consumer runs here, so every ALLOW_CACHED read
            # bypasses the cache, as with a stopped change stream.
            ("changes", "guard"): guard,
            # The burst stands in the queue while the leader reads; the
            # standing-queue target is an overload test's matter.
            ("lanes", "interactive", "admission", "target_wait_ms"): None,
        },
    )


def _answered_alike(outcomes: list[Outcome]) -> None:
    assert len(outcomes) == READS
    errors = Counter(o.error for o in outcomes if o.error)
    assert not errors, f"reads that did not return the record: {dict(errors)}"
    assert all(
        o.record is not None and (o.record.revision, o.record.payload) == (1, PAYLOAD)
        for o in outcomes
    )


def _warm_up(
    settings: Settings, config: Config, started: Replicas, database: CountingDatabase, scope: str
) -> None:
    """Every replica serves reads before the burst (of another record)."""
    database.seed(scope, [HOT, WARM], PAYLOAD)
    assert until_each_answers(settings, config, started.workers, "tests", scope, WARM, 90) > 0
    assert database.reads(scope, HOT) == 0


@pytest.fixture
def guarded(
    replica_settings: Settings, config: Config, tmp_path: Path
) -> Iterator[tuple[Settings, Replicas]]:
    settings = _slow(replica_settings, tmp_path / "queues.yml", guard=True)
    with replicas(settings, config, tmp_path, REPLICAS) as started:
        yield settings, started


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_with_the_guard_engaged_concurrent_reads_of_one_key_read_the_database_at_most_twice(
    guarded: tuple[Settings, Replicas], config: Config, counting_database: CountingDatabase
) -> None:
    settings, started = guarded
    one_attempt = with_retry(settings.load(), max_attempts=1)
    scope = f"t-{uuid.uuid4().hex[:12]}"
    _warm_up(settings, one_attempt, started, counting_database, scope)

    outcomes = burst(settings, one_attempt, "tests", scope, [HOT] * READS, READS, TIMEOUT_S)

    _answered_alike(outcomes)
    # The guard was engaged on every replica: the cache was neither read nor filled.
    ports = started.metrics_ports
    guard = [scraped_sample(p, "dataservice_freshness_guard", lane="interactive") for p in ports]
    assert guard == [1.0] * REPLICAS
    assert sum(_cache_reads(p) for p in ports) == 0
    cache = redis.Redis.from_url(settings.redis_url)
    try:
        filled = [record_key(f.value, scope, HOT, 1) for f in config.cache.rollout.fill]
        assert not cache.exists(*filled)
    finally:
        cache.close()
    # Followers there were, in the processes and across them.
    assert sum(_coalesced(p, "replica") for p in ports) > 0
    reads = counting_database.reads(scope, HOT)
    assert 1 <= reads <= 2, f"{reads} database reads of the key"


@pytest.fixture
def cacheless(
    replica_settings: Settings, private_redis: PrivateRedis, config: Config, tmp_path: Path
) -> Iterator[tuple[Settings, Replicas]]:
    # The cache (and the limits beside it) on a Redis of the test's own, which
    # the test kills; the broker and the answers stay where they are.
    settings = _slow(replica_settings, tmp_path / "queues.yml", guard=False)
    settings = dataclasses.replace(settings, redis_url=private_redis.url)
    with replicas(settings, config, tmp_path, REPLICAS) as started:
        yield settings, started


@pytest.mark.slow
@pytest.mark.fault
@pytest.mark.timeout(240)
def test_with_the_cache_redis_gone_each_replica_reads_a_key_at_most_once_for_concurrent_reads(
    cacheless: tuple[Settings, Replicas],
    private_redis: PrivateRedis,
    counting_database: CountingDatabase,
) -> None:
    settings, started = cacheless
    one_attempt = with_retry(settings.load(), max_attempts=1)
    scope = f"t-{uuid.uuid4().hex[:12]}"
    _warm_up(settings, one_attempt, started, counting_database, scope)
    private_redis.signal(signal.SIGKILL)

    outcomes = burst(settings, one_attempt, "tests", scope, [HOT] * READS, READS, TIMEOUT_S)

    _answered_alike(outcomes)
    assert sum(_coalesced(p, "process") for p in started.metrics_ports) > 0
    reads = counting_database.reads(scope, HOT)
    assert 1 <= reads <= REPLICAS, f"{reads} database reads of the key"


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_primary_read_never_takes_an_answer_from_a_read_that_began_before_it(
    guarded: tuple[Settings, Replicas], counting_database: CountingDatabase
) -> None:
    """A write commits while slow ``ALLOW_CACHED`` reads of its record are in
    flight; ``PRIMARY`` reads sent after the commit all see the new revision,
    and each reads the database itself."""
    settings, started = guarded
    one_attempt = with_retry(settings.load(), max_attempts=1)
    scope = f"t-{uuid.uuid4().hex[:12]}"
    _warm_up(settings, one_attempt, started, counting_database, scope)

    # Old reads: in flight for READ_DELAY_MS each, holding revision 1.
    old: list[Outcome] = []
    reading = threading.Thread(
        target=lambda: old.extend(
            burst(settings, one_attempt, "tests", scope, [HOT] * 30, 30, TIMEOUT_S)
        )
    )
    reading.start()
    time.sleep(READ_DELAY_MS / 3000)
    assert counting_database.root is not None
    with counting_database.root.begin() as conn:
        conn.execute(
            text(
                f"UPDATE {DATABASE}.records SET revision = 2, payload = 'new'"
                " WHERE scope = :s AND object_id = :o"
            ),
            {"s": scope, "o": HOT},
        )
    before = counting_database.reads(scope, HOT)
    primary = burst(settings, one_attempt, "tests", scope, [HOT] * 12, 12, TIMEOUT_S,
                    ReadMode.PRIMARY)  # fmt: skip
    reading.join(TIMEOUT_S)

    assert all(o.record is not None and o.record.revision == 2 for o in primary), [
        (o.record.revision if o.record else o.error) for o in primary
    ]
    assert counting_database.reads(scope, HOT) - before >= len(primary)
    # The old reads were in flight across the write: they saw either revision.
    assert {o.record.revision for o in old if o.record is not None} <= {1, 2}


def _cache_reads(port: int) -> float:
    return sum(
        scraped(port, "dataservice_cache_reads", lane="interactive", format=f, outcome=o)
        for f in ("v1", "v2")
        for o in ("hit", "miss")
    )


def _coalesced(port: int, level: str) -> float:
    return scraped(port, "dataservice_coalesced", lane="interactive", level=level)
